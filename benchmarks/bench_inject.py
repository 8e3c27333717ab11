"""Time `traceap inject`'s work on one large trace against `traceap.load` of the same trace.

What is timed, per repeat (interleaved, medians reported):
  load    `traceap.load(path)`: read, decode, columns, nesting, launch links
  inject  everything `traceap inject` does for one base and all eight patterns: parse the
          trace once (`Doc`), its timeline and dialect, its natural labels, and for each
          pattern: plan, delay model, move events, emit new ones, label, validate, encode and
          gzip (ISA-L level 1) -- the bytes `traceap inject` would write (not written here,
          so the disk does not enter the ratio)

    .venv/bin/python benchmarks/make_large_trace.py --size 50MB -o benchmarks/out/t50.json
    nice .venv/bin/python benchmarks/bench_inject.py benchmarks/out/t50.json --repeats 3

Wall and CPU seconds (this process) are printed with the inject / load ratio; the target
(issue 12) is under 3x.  The machine is shared: the CPU-second ratio is the steadier one.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import traceap  # noqa: E402
from traceap.patterns import pattern_ids  # noqa: E402
from traceap.inject.core import Invalid, inject_one  # noqa: E402
from traceap.inject.edit import Doc  # noqa: E402
from traceap.inject.mechanisms import Base, Unusable  # noqa: E402
from traceap.inject.natural import natural_anomalies  # noqa: E402

PATTERNS = pattern_ids()  # the built-in pattern ids, in report order


def timed(fn):
    """(wall s, cpu s, result) of one call."""
    gc.collect()
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def inject_all(path: Path) -> dict:
    """All eight patterns into one base, as `traceap inject` does (bytes not written)."""
    doc = Doc(path)
    base = Base.of(doc, path.name)
    natural_anomalies(doc.trace)
    sizes = {}
    for k, p in enumerate(PATTERNS):
        try:
            out = inject_one(base, p, np.random.default_rng([0, k]))
        except (Unusable, Invalid) as exc:
            sizes[p] = f"skipped: {exc}"
            continue
        sizes[p] = len(out.gz)
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not args.trace.is_file():
        sys.exit(f"{args.trace}: no such file (make one with benchmarks/make_large_trace.py)")
    size = args.trace.stat().st_size
    rows = {"load": [], "inject": []}
    sizes = None
    for _ in range(args.repeats):
        w, c, _ = timed(lambda: traceap.load(args.trace))
        rows["load"].append((w, c))
        w, c, sizes = timed(lambda: inject_all(args.trace))
        rows["inject"].append((w, c))
    med = {k: (statistics.median(v[0] for v in r), statistics.median(v[1] for v in r))
           for k, r in rows.items()}
    print(f"trace: {args.trace} ({size / 1e6:.1f} MB), {args.repeats} interleaved repeats, medians")
    print("| what | wall s | CPU s |")
    print("|---|---|---|")
    for k, (w, c) in med.items():
        print(f"| {k} | {w:.2f} | {c:.2f} |")
    print(f"| inject / load | {med['inject'][0] / med['load'][0]:.2f}x | "
          f"{med['inject'][1] / med['load'][1]:.2f}x |")
    for p, s in sizes.items():
        print(f"  {p}: {s if isinstance(s, str) else f'{s / 1e6:.1f} MB gzip'}")


if __name__ == "__main__":
    main()
