"""False findings on healthy real traces: what `traceap analyze` reports on traces that have no
anti-pattern (the unmodified, good traces of the real-based benchmark), per detector and N.

    python benchmarks/healthy_findings.py --dataset /work/datasets/real \
        --split validation,test_unseen --detectors rule,clustering,expert,model,hybrid \
        --windows 50,100,200 [--model CKPT] [--out DIR]

For each healthy trace (manifest `source: natural`, `label: good`) it runs the whole pipeline
(`traceap.analysis.analyze`, default classifier) and counts the findings of severity medium or
high, and the share of windows flagged.  `rule` and `clustering` are fitted on the train split
with trace labels only, as `traceap eval` fits them.  Writes DIR/healthy_findings.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from traceap.analysis import analyze
from traceap.manifest import read_manifest, trace_path
from traceap.detectors.registry import make_detector
from traceap.load import load

FIT = ("rule", "clustering")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", default="validation,test_unseen")
    ap.add_argument("--detectors", default="rule,clustering,expert,model,hybrid")
    ap.add_argument("--windows", default="50,100,200")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--fit-limit", type=int, default=120)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    splits = args.split.split(",")
    names = args.detectors.split(",")
    ns = [int(x) for x in args.windows.split(",")]
    entries = read_manifest(args.dataset)
    healthy = [e for e in entries if e.split in splits and e.source == "natural" and not e.is_bad]
    dets: dict[tuple[str, int], object] = {}
    train = [e for e in entries if e.split == "train"]
    fit_traces = None
    for name in names:
        opts = {"path": args.model} if args.model and name in ("model", "hybrid") else {}
        for n in ns:
            if name == "clustering":
                dets[name, n] = make_detector(name, n_windows=n, **opts)
            else:
                dets[name, n] = dets.get((name, ns[0])) or make_detector(name, **opts)
            if name in FIT and not getattr(dets[name, n], "_fitted_here", False):
                if fit_traces is None:
                    rng = np.random.default_rng(0)
                    goods = [e for e in train if not e.is_bad]
                    bads = [e for e in train if e.is_bad]
                    half = args.fit_limit // 2
                    pick = [goods[i] for i in rng.permutation(len(goods))[:half]] + \
                        [bads[i] for i in rng.permutation(len(bads))[:half]]
                    fit_traces = ([load(trace_path(args.dataset, e)) for e in pick],
                                  [int(e.is_bad) for e in pick])
                dets[name, n].fit(*fit_traces)
                dets[name, n]._fitted_here = True
    rows = {}
    for e in healthy:
        t = load(trace_path(args.dataset, e))
        for (name, n), det in dets.items():
            a = analyze(t, n, detector=det)
            medium = sum(1 for f in a.findings if f.severity in ("medium", "high"))
            flagged = float(np.mean([w.flagged for w in a.windows]))
            r = rows.setdefault(f"{name}|{n}|{e.split}", {"findings": [], "flagged": []})
            r["findings"].append(medium)
            r["flagged"].append(flagged)
    out = {k: {"n_traces": len(v["findings"]),
               "medium_high_findings_per_trace": float(np.mean(v["findings"])),
               "flagged_share": float(np.mean(v["flagged"]))} for k, v in rows.items()}
    lines = ["| N | detector | split | healthy traces | medium/high findings per trace | "
             "flagged windows |", "|---:|---|---|---:|---:|---:|"]
    for n in ns:
        for name in names:
            for split in splits:
                v = out.get(f"{name}|{n}|{split}")
                if v:
                    lines.append(f"| {n} | {name} | {split} | {v['n_traces']} | "
                                 f"{v['medium_high_findings_per_trace']:.2f} | "
                                 f"{100 * v['flagged_share']:.1f}% |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "healthy_findings.json").write_text(json.dumps(out, indent=1))
        (args.out / "healthy_findings.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
