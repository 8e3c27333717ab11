"""Time lost of planted findings against what the plant cost, per pattern, on an inject dataset.

    nice .venv/bin/python benchmarks/planted_cost.py --dataset datasets/real16 \
        --split validation,test_unseen [--patterns no_mixed_precision,...] [--out DIR]

For every planted trace of the split(s) whose planted pattern (`patterns[0]`) is asked for,
`traceap.analysis.analyze(detector="expert")` runs on it and on its base's unmodified copy (the
`source: natural` line of the same `base` and split).  The plant's cost is:

- GPU idle it added, `idle.measure(planted).total_us - idle.measure(base).total_us`, for a
  pattern whose plant adds idle (every `IdleCause` pattern and unfused_optimizer, whose plant
  splits the step into per-parameter launches), as the patterns' own tests measure it;
- the length of the planted labels for no_mixed_precision and no_channels_last (the plant
  lengthens kernels / adds transposes: the GPU stays busy, the labels are the added busy time),
  less the base's own labels of that pattern (moved with the edit, same lengths).

Time lost: the finding's `time_lost_us` on the planted trace less the one on the base copy (a
base may hold the pattern naturally).  Prints per pattern the number of plants, the share found
(a finding of any severity) and found at medium/high severity, the median / quartiles of time
lost / cost over the plants found (issue 34's target, "time lost of planted findings": median
within +-30% of 1) and the median over every plant (a plant not found counts 0), and the plant's
own label length / cost (median, and the share over 1.5x: a label that claims idle its plant did
not add); writes DIR/planted_cost.json with one row per plant (a folder it stamps, as traceap's
commands do: a planted_cost.json it did not write is never replaced).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap import idle  # noqa: E402
from traceap.analysis import analyze  # noqa: E402
from traceap.load import load  # noqa: E402
from traceap.errors import OutputError  # noqa: E402
from traceap.manifest import read_manifest, trace_path  # noqa: E402
from traceap.outputs import Owner, claim  # noqa: E402

#: Plants that keep the GPU busy: their cost is the planted labels' length.
LABEL_COST = ("no_mixed_precision", "no_channels_last")
#: --out: a folder of its own runs (any rerun replaces them), beside files of others.
OWNER = Owner("planted_cost.py", stamp=".planted-cost.json",
              schema="traceap.bench.planted_cost/v1", rerun="any", foreign_ok=True)
ROWS = "planted_cost.json"
NEW = ("no_mixed_precision", "no_channels_last", "unfused_optimizer", "allocator_churn",
       "recompilation", "grad_accum_allreduce", "dataparallel", "cpu_tensor_init")


def _label_us(entry, pattern: str) -> float:
    return float(sum(a.end_us - a.start_us for a in entry.anomalies if a.pattern == pattern))


def _label_share(sel: list[dict]) -> str:
    """Median label length / cost of the plants, and the share labelled with over 1.5x the
    cost ('-' for rows written before the label was kept).  A label longer than the idle its
    plant added marks time the fix does not give back (consecutive caused gaps join into one
    label while half of it is waiting, so up to 2x is by construction)."""
    r = [x["label_us"] / x["cost_us"] for x in sel if x.get("label_us") is not None]
    if not r:
        return f"{'-':>10s} {'-':>6s}"
    return f"{np.median(r):10.2f} {100 * np.mean(np.array(r) > 1.5):5.0f}%"


def _lost(a, pattern: str) -> tuple[float, str | None]:
    f = next((f for f in a.findings if f.pattern == pattern), None)
    return (0.0, None) if f is None else (float(f.time_lost_us or 0.0), f.severity)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", default="validation,test_unseen")
    ap.add_argument("--patterns", default=",".join(NEW))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rows", type=Path, help="re-print the table from an earlier planted_cost.json")
    args = ap.parse_args(argv)
    try:
        out = claim(args.out, OWNER, planned=[ROWS]) if args.out else None
    except OutputError as exc:
        print(f"planted_cost.py: {exc}", file=sys.stderr)
        return 2
    splits = args.split.split(",")
    wanted = args.patterns.split(",")
    entries = [e for e in read_manifest(args.dataset) if e.split in splits]
    bases = {(e.split, e.base): e for e in entries if e.source == "natural"}
    plants = [e for e in entries if e.source == "injected" and e.patterns
              and e.patterns[0] in wanted]
    base_cache: dict = {}
    rows = json.loads(args.rows.read_text()) if args.rows else []
    t0 = time.time()
    for i, e in enumerate([] if args.rows else plants):
        p = e.patterns[0]
        b = bases.get((e.split, e.base))
        if b is None:
            continue
        key = (e.split, e.base)
        if key not in base_cache:
            bt = load(trace_path(args.dataset, b))
            base_cache[key] = (idle.measure(bt).total_us, analyze(bt, detector="expert"))
        b_idle, b_an = base_cache[key]
        tr = load(trace_path(args.dataset, e))
        a = analyze(tr, detector="expert")
        if p in LABEL_COST:
            cost = _label_us(e, p) - _label_us(b, p)
        else:
            cost = idle.measure(tr).total_us - b_idle
        lost, sev = _lost(a, p)
        lost -= _lost(b_an, p)[0]
        rows.append({"id": e.id, "split": e.split, "base": e.base, "pattern": p,
                     "cost_us": cost, "lost_us": lost, "severity": sev,
                     "ratio": lost / cost if cost > 0 else None, "label_us": _label_us(e, p)})
        if (i + 1) % 25 == 0:
            print(f"  {i + 1}/{len(plants)} plants ({time.time() - t0:.0f} s)", flush=True)
    print(f"{len(rows)} plants, {time.time() - t0:.0f} s")
    print(f"{'pattern':22s} {'split':12s} {'plants':>6s} {'found':>6s} {'med+':>5s} "
          f"{'median':>7s} {'q25':>6s} {'q75':>6s} {'all':>6s}  {'cost ms (median)':>16s} "
          f"{'label/cost':>10s} {'>1.5x':>6s}")
    for p in wanted:
        for s in splits + ["all"]:
            sel = [r for r in rows if r["pattern"] == p and (s == "all" or r["split"] == s)
                   and r["ratio"] is not None]
            if not sel:
                continue
            every = np.array([x["ratio"] for x in sel])
            # the target reads "time lost of planted findings": over the plants found
            found = [x["ratio"] for x in sel if x["severity"] is not None]
            r = np.array(found) if found else np.array([np.nan])
            serious = np.mean([x["severity"] in ("medium", "high") for x in sel])
            print(f"{p:22s} {s:12s} {len(sel):6d} {100 * len(found) / len(sel):5.0f}% "
                  f"{100 * serious:4.0f}% {np.median(r):7.2f} {np.quantile(r, .25):6.2f} "
                  f"{np.quantile(r, .75):6.2f} {np.median(every):6.2f}  "
                  f"{np.median([x['cost_us'] for x in sel]) / 1e3:16.2f} "
                  f"{_label_share(sel)}")
    if out is not None:
        out.begin([ROWS])
        (args.out / ROWS).write_text(json.dumps(rows, indent=1))
        out.finish([ROWS])
    return 0


if __name__ == "__main__":
    sys.exit(main())
