"""Exposed NCCL: was compute queued behind it, or had the host not launched it yet?

    .venv/bin/python benchmarks/nccl_queued.py --dataset /work/datasets/ddp_val [--split validation]

A diagnosis, not a detector.  For every window of every bad trace of the split whose exposed
NCCL time (side-stream NCCL running, no compute kernel running) is at least 5% of the window,
it measures the share of that time during which a compute kernel had already been launched and
was waiting to start, and prints its quantiles per true pattern of the window
(`traceap.manifest.window_patterns`).  Queued compute is the signature of communication that
holds the step back (the optimizer waits for the all-reduce); nothing queued means the host was
late (a sync, a Python loop, a late batch) and the collectives that ran anyway only look
exposed.  The idle account gives the second to the host causes
(`traceap.measures.communication.host_late_under_nccl`); before it did, host-side plants in DDP
bases were named `nccl_compute_no_overlap`.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from traceap.load import load  # noqa: E402
from traceap.manifest import read_manifest, trace_path, window_patterns  # noqa: E402
from traceap.measures.gaps import queued_intervals  # noqa: E402
from traceap.measures.signals import busy_rows, intersect, nccl_rows, union_in  # noqa: E402
from traceap.trace import merged_intervals  # noqa: E402
from traceap.windows import Windows  # noqa: E402


def queued_share(w: Windows) -> tuple[np.ndarray, np.ndarray]:
    """Per window: exposed NCCL time, and the share of it with compute launched and waiting
    (the idle account's `queued_intervals` and busy work, as `host_late_under_nccl` reads them)."""
    t = w.trace
    busy, nc = busy_rows(t), nccl_rows(t)
    if not len(nc) or not len(busy):
        return np.zeros(w.n), np.ones(w.n)
    n = (t.ts[nc], t.end[nc])
    c = (t.ts[busy], t.end[busy])
    nq = intersect(*n, *queued_intervals(t))
    exposed = union_in(w, *merged_intervals(*n)) - union_in(w, *intersect(*n, *c))
    waiting = union_in(w, *nq) - union_in(w, *intersect(*nq, *c))
    return exposed, np.where(exposed > 0, np.clip(waiting / np.maximum(exposed, 1e-9), 0, 1), 1.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", type=Path, required=True)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--windows", type=int, default=100)
    args = ap.parse_args(argv)
    by = defaultdict(list)
    for e in read_manifest(args.dataset):
        if e.split != args.split or e.label == "good":
            continue
        w = Windows(load(trace_path(args.dataset, e)), args.windows)
        exposed, share = queued_share(w)
        for i, p in enumerate(window_patterns(e, w)):
            if exposed[i] >= 0.05 * w.width_us:
                by[p or "clean"].append(share[i])
    for p, v in sorted(by.items()):
        q = np.round(np.quantile(v, [0.1, 0.25, 0.5, 0.75, 0.9]), 2)
        print(f"{p:28s} windows {len(v):5d}  queued share, quantiles 10/25/50/75/90: {q}")


if __name__ == "__main__":
    main()
