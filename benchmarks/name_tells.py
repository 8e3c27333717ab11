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
its pattern), as `traceap eval` reads them.  The multi-GPU patterns (small_nccl_kernels,
nccl_blocks_compute_stream, nccl_compute_no_overlap) exist only in data-parallel runs, so
their lift is measured among the windows of multi-rank traces: a name that merely says "this
is DDP" (copy_bucket_to_grad) tells nothing about which DDP problem it is.  `jobs` counts the
distinct jobs (all ranks of a job are near-copies) in which the name and the pattern meet;
`--min-jobs` keeps only tells that more than a couple of jobs support.
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
from traceap.manifest import Entry, read_manifest, trace_path  # noqa: E402
from traceap.patterns import pattern_ids  # noqa: E402
from traceap.trace import Kind  # noqa: E402
from traceap.windows import Windows  # noqa: E402

PATTERNS = pattern_ids()  # the built-in pattern ids, in report order

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


MULTI_GPU = ("small_nccl_kernels", "nccl_blocks_compute_stream", "nccl_compute_no_overlap")


LEVELS = ("window", "start", "trace")


def _name_windows(code: np.ndarray, i0: np.ndarray, i1: np.ndarray, n: int, lab: np.ndarray,
                  n_names: int) -> tuple[np.ndarray, np.ndarray]:
    """Per name: windows holding it, and of them the windows carrying each pattern."""
    reps = i1 - i0 + 1
    win = np.repeat(i0, reps) + (np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps))
    pair = np.unique(np.repeat(code, reps) * n + win)
    c, wi = pair // n, pair % n
    mat = np.zeros((n_names, 1 + lab.shape[1]), dtype=np.int64)
    np.add.at(mat[:, 0], c, 1)
    for p in range(lab.shape[1]):
        np.add.at(mat[:, 1 + p], c, lab[wi, p].astype(np.int64))
    return mat, np.concatenate([lab.sum(axis=0), [n]]).astype(np.int64)


def trace_counts(args: tuple[str, Entry, int]) -> dict[str, tuple[dict[str, np.ndarray], np.ndarray]]:
    """For one trace and each level: per canonical name [windows with the name, of them with
    pattern p ...], and per pattern the windows it labels (last entry: the window count).

    Levels: "window" (the name's event overlaps the window), "start" (an event of that name
    starts in the window: one window per occurrence, however long the event) and "trace"
    (the whole trace is one window).
    """
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
    zero = np.zeros(len(keep), dtype=np.int64)
    inv = list(uniq)
    out = {}
    for level, (a, b, n, lb) in {"window": (i0, i1, w.n, lab), "start": (i0, i0, w.n, lab),
                                 "trace": (zero, zero, 1, lab.any(axis=0, keepdims=True))}.items():
        mat, totals = _name_windows(code, a, b, n, lb, len(uniq))
        out[level] = ({inv[i]: mat[i] for i in np.flatnonzero(mat[:, 0])}, totals)
    return out


class Counts:
    """Window counts over a dataset: all traces, multi-rank traces, and jobs per co-occurrence."""

    def __init__(self):
        n = len(PATTERNS) + 1
        self.all: dict[str, np.ndarray] = {}
        self.multi: dict[str, np.ndarray] = {}
        self.totals = np.zeros(n, dtype=np.int64)
        self.totals_multi = np.zeros(n, dtype=np.int64)
        self.jobs: dict[str, list[set]] = {}

    def add(self, entry: Entry, out: dict[str, np.ndarray], tot: np.ndarray) -> None:
        job = entry.job or entry.id
        multi = entry.world_size > 1
        self.totals += tot
        if multi:
            self.totals_multi += tot
        for k, v in out.items():
            self.all[k] = self.all[k] + v if k in self.all else v.copy()
            if multi:
                self.multi[k] = self.multi[k] + v if k in self.multi else v.copy()
            if v[1:].any():
                js = self.jobs.setdefault(k, [set() for _ in PATTERNS])
                for p in np.flatnonzero(v[1:]):
                    js[p].add(job)

    def lift(self, name: str, p: int) -> tuple[float, int, float, float]:
        """(lift, support windows, P(p | name), P(p)) with the pattern's own reference set."""
        multi = PATTERNS[p] in MULTI_GPU
        counts, totals = (self.multi, self.totals_multi) if multi else (self.all, self.totals)
        v = counts.get(name)
        if v is None or v[0] == 0 or totals[-1] == 0 or totals[p] == 0:
            return 0.0, 0, 0.0, 0.0
        base = totals[p] / totals[-1]
        cond = v[1 + p] / v[0]
        return float(cond / base), int(v[0]), float(cond), float(base)

    def n_jobs(self, name: str, p: int) -> int:
        js = self.jobs.get(name)
        return len(js[p]) if js else 0


def measure(dataset: Path, entries: list[Entry], n_windows: int = 100,
            jobs: int = 1) -> dict[str, Counts]:
    """Counts of every name over the dataset's traces, per level."""
    work = [(str(dataset), e, n_windows) for e in entries]
    counts = {level: Counts() for level in LEVELS}

    def add(e, res):
        for level, (out, tot) in res.items():
            counts[level].add(e, out, tot)

    if jobs > 1:
        with mp.get_context("fork").Pool(jobs) as pool:
            for e, res in zip(entries, pool.imap(trace_counts, work, chunksize=4)):
                add(e, res)
    else:
        for e, item in zip(entries, work):
            add(e, trace_counts(item))
    return counts


def tells(counts: Counts, min_lift: float = 5.0, min_support: int = 20,
          min_jobs: int = 1) -> list[dict]:
    """Names that give a pattern away: lift >= min_lift with support >= min_support windows
    (and the name meeting the pattern in at least min_jobs jobs)."""
    out = []
    for name in counts.all:
        for p, pat in enumerate(PATTERNS):
            lift, support, cond, base = counts.lift(name, p)
            if support >= min_support and lift >= min_lift and counts.n_jobs(name, p) >= min_jobs:
                out.append({"name": name, "pattern": pat, "support": support,
                            "jobs": counts.n_jobs(name, p), "p_pattern_given_name": cond,
                            "p_pattern": base, "lift": lift})
    out.sort(key=lambda r: (-r["lift"], -r["support"]))
    return out


def max_lift_per_pattern(counts: Counts, min_support: int = 20,
                         min_jobs: int = 1) -> dict[str, tuple[float, str]]:
    """For each pattern, the highest lift of any name with enough support, and that name."""
    best = {p: (0.0, "") for p in PATTERNS}
    for name in counts.all:
        for p, pat in enumerate(PATTERNS):
            lift, support, _, _ = counts.lift(name, p)
            if support >= min_support and counts.n_jobs(name, p) >= min_jobs and lift > best[pat][0]:
                best[pat] = (lift, name)
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
    ap.add_argument("--level", choices=LEVELS, default="window",
                    help="window: the name's event overlaps the window (default); start: an event "
                         "of that name starts in it; trace: the whole trace")
    ap.add_argument("--all-levels", action="store_true", help="print the tables of every level")
    ap.add_argument("--trace-support", type=int, default=20, help="support at level 'trace' (traces)")
    ap.add_argument("--min-jobs", type=int, default=3,
                    help="second table: tells seen in at least this many jobs")
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
    all_counts = measure(dataset, entries, args.windows, args.jobs)
    summary = {}
    for level in LEVELS:
        counts = all_counts[level]
        support = args.support if level != "trace" else args.trace_support
        for min_jobs in sorted({1, args.min_jobs}):
            found = tells(counts, args.lift, support, min_jobs)
            best = max_lift_per_pattern(counts, support, min_jobs)
            summary[(level, min_jobs)] = (found, best)
        if level != args.level and not args.all_levels:
            continue
        n_win = int(counts.totals[-1])
        unit = "traces" if level == "trace" else "windows"
        print(f"\n######## level {level!r}: {len(entries)} traces, {n_win} {unit}; "
              f"{len(counts.all)} distinct names; multi-GPU patterns among the "
              f"{int(counts.totals_multi[-1])} {unit} of multi-rank traces")
        for min_jobs in sorted({1, args.min_jobs}):
            found, best = summary[(level, min_jobs)]
            print(f"\n== names meeting their pattern in >= {min_jobs} job(s) ==")
            print(f"{'pattern':28s} {'P(pattern)':>10s} {'max lift':>9s}  name with the max lift")
            for p, pat in enumerate(PATTERNS):
                lift, name = best[pat]
                base = counts.lift(name, p)[3] if name else 0.0
                print(f"{pat:28s} {base:10.4f} {lift:9.1f}  {_short(name, 70)}")
            per_pattern = {p: sum(r["pattern"] == p for r in found) for p in PATTERNS}
            print(f"names giving a pattern away (lift >= {args.lift:g}, support >= {support} "
                  f"{unit}): {len(found)}  " +
                  ", ".join(f"{p}={n}" for p, n in per_pattern.items() if n))
            if found:
                print(f"{'lift':>6s} {'P(p|name)':>9s} {'support':>8s} {'jobs':>5s}  {'pattern':26s} name")
                for r in found[:args.top]:
                    print(f"{r['lift']:6.1f} {r['p_pattern_given_name']:9.3f} {r['support']:8d} "
                          f"{r['jobs']:5d}  {r['pattern']:26s} {_short(r['name'])}")
    print("\nsummary: names giving a pattern away (lift >= %g)" % args.lift)
    print(f"  {'level':8s} {'any jobs':>9s} {'>= %d jobs' % args.min_jobs:>10s}")
    for level in LEVELS:
        print(f"  {level:8s} {len(summary[(level, 1)][0]):9d} {len(summary[(level, args.min_jobs)][0]):10d}")
    found, best = summary[(args.level, 1)]
    n_win = int(all_counts[args.level].totals[-1])
    if args.json:
        Path(args.json).write_text(json.dumps({
            "dataset": str(dataset), "traces": len(entries), "windows": n_win,
            "n_windows_per_trace": args.windows, "min_lift": args.lift,
            "min_support": args.support,
            "min_jobs": args.min_jobs, "level": args.level,
            "max_lift": {p: {"lift": v[0], "name": v[1]} for p, v in best.items()},
            "tells": found,
            "levels": {f"{lv}/min_jobs={mj}": {"n_tells": len(v[0]), "tells": v[0],
                                                "max_lift": {p: {"lift": b[0], "name": b[1]}
                                                             for p, b in v[1].items()}}
                       for (lv, mj), v in summary.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
