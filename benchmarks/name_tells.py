"""Which event names give an anti-pattern away?  Shortcut check for a labelled dataset.

    .venv/bin/python benchmarks/name_tells.py --dataset datasets/torchtraceap [--windows 100]
                                              [--lift 5] [--support 20] [--top 40]
                                              [--split train,...] [--jobs 2] [--json out.json]

A detector can score well on generated data by recognising a name that only the simulator ties
to a pattern (a loader class, a memcpy spelling, a kernel naming dialect) instead of the
pattern's effect on the timeline.  For every event name (cpu ops, annotations, runtime calls,
kernels, memcpys; numbers inside step, Triton and region names folded) and every pattern this
reports, over the windows of the dataset, P(pattern | name present in the window) against
P(pattern) (the lift) and lists the names that give a pattern away: lift above `--lift` with
the name present in at least `--support` windows.  A name a mechanism needs (a pageable copy
for `no_pin_memory`) is a tell only when it never shows up in healthy windows; a realistic
dataset has such names in healthy runs too, in benign amounts, and its lifts stay low.
Window labels are the manifest's anomaly intervals (a window overlapping an interval carries
its pattern), as `traceap eval` reads them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import traceap  # noqa: E402
from traceap.dataset import PATTERNS, Entry, read_manifest, trace_path  # noqa: E402
from traceap.trace import Kind  # noqa: E402
from traceap.windows import Windows  # noqa: E402

#: Names whose numbers are counters, not identity: fold them so one name stands for the family.
_FOLD = (
    (re.compile(r"^ProfilerStep#\d+$"), "ProfilerStep#N"),
    (re.compile(r"^(triton_\w+?)_\d+$"), r"\1_N"),
    (re.compile(r"^(enumerate\(DataLoader\))#\d+"), r"\1#N"),
)


def canonical(name: str) -> str:
    """A name with its counters folded (`ProfilerStep#7` -> `ProfilerStep#N`)."""
    for rx, rep in _FOLD:
        if rx.match(name):
            return rx.sub(rep, name)
    return name


def trace_counts(args: tuple[str, Entry, int]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """For one trace: per canonical name, [windows with the name, of them with pattern p ...];
    and per pattern the number of windows it labels (last entry: the window count)."""
    dataset, entry, n_windows = args
    t = traceap.load(trace_path(dataset, entry))
    w = Windows(t, n_windows)
    n_pat = len(PATTERNS)
    lab = np.zeros((w.n, n_pat), dtype=bool)
    for a in entry.anomalies:
        lab[w.overlapping(a.start_us, a.end_us), PATTERNS.index(a.pattern)] = True
    keep = np.flatnonzero(~np.isin(t.kind, (Kind.INSTANT, Kind.OTHER)))
    names = [canonical(n) for n in t.names]
    uniq = {n: i for i, n in enumerate(dict.fromkeys(names))}
    code = np.array([uniq[n] for n in names], dtype=np.int64)[t.name[keep]]
    i0 = w.index_of(t.ts[keep])
    i1 = np.maximum(w.index_of(np.maximum(t.end[keep] - 1e-3, t.ts[keep])), i0)
    reps = i1 - i0 + 1
    win = np.repeat(i0, reps) + (np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps))
    pair = np.unique(np.repeat(code, reps) * w.n + win)
    c, wi = pair // w.n, pair % w.n
    mat = np.zeros((len(uniq), 1 + n_pat), dtype=np.int64)
    np.add.at(mat[:, 0], c, 1)
    for p in range(n_pat):
        np.add.at(mat[:, 1 + p], c, lab[wi, p].astype(np.int64))
    inv = list(uniq)
    out = {inv[i]: mat[i] for i in np.flatnonzero(mat[:, 0])}
    totals = np.concatenate([lab.sum(axis=0), [w.n]]).astype(np.int64)
    return out, totals


def measure(dataset: Path, entries: list[Entry], n_windows: int = 100,
            jobs: int = 1) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per name counts summed over the dataset; per pattern labelled windows (+ all windows)."""
    work = [(str(dataset), e, n_windows) for e in entries]
    counts: dict[str, np.ndarray] = {}
    totals = np.zeros(len(PATTERNS) + 1, dtype=np.int64)
    if jobs > 1:
        with mp.get_context("fork").Pool(jobs) as pool:
            results = pool.imap_unordered(trace_counts, work, chunksize=4)
            for out, tot in results:
                totals += tot
                for k, v in out.items():
                    counts[k] = counts[k] + v if k in counts else v.copy()
    else:
        for item in work:
            out, tot = trace_counts(item)
            totals += tot
            for k, v in out.items():
                counts[k] = counts[k] + v if k in counts else v.copy()
    return counts, totals


def tells(counts: dict[str, np.ndarray], totals: np.ndarray, min_lift: float = 5.0,
          min_support: int = 20) -> list[dict]:
    """Names that give a pattern away: lift >= min_lift with support >= min_support windows."""
    base = totals[:-1] / max(int(totals[-1]), 1)
    out = []
    for name, v in counts.items():
        support = int(v[0])
        if support < min_support:
            continue
        cond = v[1:] / support
        for p, pat in enumerate(PATTERNS):
            if base[p] <= 0:
                continue
            lift = cond[p] / base[p]
            if lift >= min_lift:
                out.append({"name": name, "pattern": pat, "support": support,
                            "p_pattern_given_name": float(cond[p]), "p_pattern": float(base[p]),
                            "lift": float(lift)})
    out.sort(key=lambda r: (-r["lift"], -r["support"]))
    return out


def max_lift_per_pattern(counts: dict[str, np.ndarray], totals: np.ndarray,
                         min_support: int = 20) -> dict[str, tuple[float, str]]:
    """For each pattern, the highest lift of any name with enough support, and that name."""
    base = totals[:-1] / max(int(totals[-1]), 1)
    best = {p: (0.0, "") for p in PATTERNS}
    for name, v in counts.items():
        if v[0] < min_support:
            continue
        for p, pat in enumerate(PATTERNS):
            if base[p] > 0:
                lift = v[1 + p] / v[0] / base[p]
                if lift > best[pat][0]:
                    best[pat] = (float(lift), name)
    return best


def _short(name: str, n: int = 78) -> str:
    return name if len(name) <= n else name[:n - 3] + "..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default=str(ROOT / "datasets" / "torchtraceap"))
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--lift", type=float, default=5.0)
    ap.add_argument("--support", type=int, default=20)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--split", default=None, help="comma-separated splits (default: all)")
    ap.add_argument("--limit", type=int, default=None, help="first N traces only")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    dataset = Path(args.dataset)
    entries = read_manifest(dataset)
    if args.split:
        keep = set(args.split.split(","))
        entries = [e for e in entries if e.split in keep]
    if args.limit:
        entries = entries[:args.limit]
    counts, totals = measure(dataset, entries, args.windows, args.jobs)
    found = tells(counts, totals, args.lift, args.support)
    best = max_lift_per_pattern(counts, totals, args.support)
    n_win = int(totals[-1])
    print(f"{len(entries)} traces, {n_win} windows ({args.windows} per trace), "
          f"{len(counts)} distinct names")
    print(f"\n{'pattern':28s} {'P(pattern)':>10s} {'max lift':>9s}  name with the max lift")
    for p, pat in enumerate(PATTERNS):
        lift, name = best[pat]
        print(f"{pat:28s} {totals[p] / max(n_win, 1):10.4f} {lift:9.1f}  {_short(name, 70)}")
    per_pattern = {p: sum(r["pattern"] == p for r in found) for p in PATTERNS}
    print(f"\nnames giving a pattern away (lift >= {args.lift:g}, support >= {args.support} "
          f"windows): {len(found)}  " + ", ".join(f"{p}={n}" for p, n in per_pattern.items() if n))
    if found:
        print(f"\n{'lift':>6s} {'P(p|name)':>9s} {'support':>8s}  {'pattern':26s} name")
        for r in found[:args.top]:
            print(f"{r['lift']:6.1f} {r['p_pattern_given_name']:9.3f} {r['support']:8d}  "
                  f"{r['pattern']:26s} {_short(r['name'])}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "dataset": str(dataset), "traces": len(entries), "windows": n_win,
            "n_windows_per_trace": args.windows, "min_lift": args.lift,
            "min_support": args.support,
            "p_pattern": {p: float(totals[i] / max(n_win, 1)) for i, p in enumerate(PATTERNS)},
            "max_lift": {p: {"lift": v[0], "name": v[1]} for p, v in best.items()},
            "tells": found}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
