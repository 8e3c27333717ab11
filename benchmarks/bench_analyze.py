"""How long `analyze` takes on a 200 MB trace, against loading the same trace.

The trace is the bundled DDP sample replicated step after step to the target size
(benchmarks/make_large_trace.py).  Reported: load time, analysis time (windows, eight pattern
rules, detector, classifier, findings, summary) and the ratio (load + analyze) / load, which
must stay under 2: analysing must never cost more than reading.

    nice .venv/bin/python benchmarks/bench_analyze.py [--size 200MB] [--windows 100]
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import traceap  # noqa: E402
from traceap.analysis import analyze  # noqa: E402
from traceap.patterns import REGISTRY  # noqa: E402
from traceap.windows import Windows  # noqa: E402


def _make_large():
    spec = importlib.util.spec_from_file_location("make_large_trace", HERE / "make_large_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    mk = _make_large()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=mk.parse_size, default=mk.parse_size("200MB"))
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--trace", type=Path, default=None, help="benchmark this trace instead")
    args = ap.parse_args(argv)

    path = args.trace
    if path is None:
        path = HERE / "out" / f"bench_analyze_{args.size // 10**6}MB.json"
        if not path.exists():
            info = mk.write_large(mk.DEFAULT_SOURCE, path, args.size)
            print(f"wrote {path} ({info['bytes'] / 1e6:.0f} MB, {info['copies']} copies)")
    size_mb = path.stat().st_size / 1e6

    loads, runs = [], []
    trace = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        trace = traceap.load(path)
        loads.append(time.perf_counter() - t0)
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        a = analyze(trace, n_windows=args.windows, detector="expert")
        runs.append(time.perf_counter() - t0)
    # Where the analysis time goes: each rule on fresh windows (its own caches only).
    w = Windows(trace, args.windows)
    parts = {}
    for pid, p in REGISTRY.items():
        t0 = time.perf_counter()
        p.score_windows(w)
        parts[pid] = time.perf_counter() - t0
    load_s, an_s = statistics.median(loads), statistics.median(runs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"trace     {path.name}: {size_mb:.0f} MB, {len(trace):,} events, "
          f"{len(a.findings)} findings, {int(sum(x.flagged for x in a.windows))} flagged windows")
    print(f"load      {load_s:6.2f} s   (median of {args.repeat})")
    print(f"analyze   {an_s:6.2f} s   (median of {args.repeat}, expert detector, "
          f"{args.windows} windows)")
    print("  rules   " + ", ".join(f"{k} {v:.2f}s" for k, v in
                                   sorted(parts.items(), key=lambda kv: -kv[1])[:4]))
    print(f"ratio     analyze/load {an_s / load_s:.2f}   (load+analyze)/load "
          f"{(load_s + an_s) / load_s:.2f}   (target < 2)")
    print(f"peak RSS  {peak:.0f} MB")
    return 0 if (load_s + an_s) / load_s < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
