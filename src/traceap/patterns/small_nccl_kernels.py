"""Many short NCCL kernels: gradients all-reduced in too many small messages.

Mechanism: every collective pays a fixed latency (launch, ring/tree setup, synchronisation with
the peers) regardless of size; small messages never reach link bandwidth.  DDP with a tiny
`bucket_cap_mb`, per-parameter all-reduces, or `no_sync` misuse produce dozens of short NCCL
kernels per step.  Evidence: NCCL kernels shorter than `short_us` (or carrying under
`small_bytes` where the trace records message sizes), many per step.  Anchor: nsys-ai's
">= 5 launches averaging under 10 us" rule, scaled to collectives' latency.  Time lost is the
`small_nccl` idle of `traceap.idle` (small collectives running with no compute beside them).
"""

from __future__ import annotations

import numpy as np

from ..idle import pattern_lost, trace_costs
from ..measures.communication import SmallNcclConfig, small_nccl
from ..measures.signals import (compute_rows, count_in, fmt_us, nccl_rows, overlap_in, ramp,
                                rows_in_windows, spans, sum_in, top_names, union_in)
from ..trace import Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs


def bursts(trace, rows: np.ndarray, burst_break: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of bursts of the given kernels: runs without a pause longer than
    `burst_break` x the median spacing, never across a profiler step boundary."""
    if len(rows) < 2:
        return np.zeros(0), np.zeros(0)
    ts = np.sort(trace.ts[rows])
    ends = trace.end[rows][np.argsort(trace.ts[rows])]
    # A pause ends a burst even inside a step: DDP's buffer broadcast at the start of the
    # forward pass is not part of the backward pass's stream of gradient buckets.
    gap = np.diff(ts)
    cut = gap > burst_break * max(float(np.median(gap)), 1.0)
    if trace.steps:
        edges = np.array(sorted(s.start_us for s in trace.steps))
        step = np.searchsorted(edges, ts, side="right")
        cut |= np.diff(step) != 0
    group = np.concatenate(([0], np.cumsum(cut)))
    uniq, first = np.unique(group, return_index=True)
    last = np.r_[first[1:], len(ts)] - 1
    keep = last > first  # a lone kernel is no burst
    start = ts[first[keep]]
    end = np.maximum.reduceat(ends, first)[keep]
    return start, end


class SmallNcclKernels(AntiPattern):
    id = "small_nccl_kernels"
    title = "Many small NCCL collectives (gradients sent in tiny messages)"
    mechanism = "each collective pays a fixed latency; small messages never reach link bandwidth"
    amount = ("n_small_nccl",)
    fix = """\
Send gradients in fewer, larger messages:

    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank],
        bucket_cap_mb=100,            # default 25; raise it if you lowered it or have many params
        gradient_as_bucket_view=True,
        static_graph=True)            # lets DDP fix bucket order after the first iteration

Don't all-reduce tensors one by one (metrics, per-parameter loops): pack them with
`torch.cat` or `torch.distributed.all_reduce_coalesced`, and reduce logging metrics every N
steps.  With gradient accumulation, wrap the non-final micro-batches in `model.no_sync()`."""
    letter = "S"
    color = "#0072B2"
    short = "SNK"
    account = IdleCause("small_nccl")
    signature = ("many short NCCL kernels (tens of us, small messages) instead of a few large "
                 "bucketed collectives.")

    def __init__(self, config: SmallNcclConfig = SmallNcclConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        small = small_nccl(t, c)
        allc = nccl_rows(t)
        n_small = count_in(windows, t.ts[small])
        per_step = len(small) / max(len(t.steps), 1)
        trace_factor = float(ramp(per_step, c.per_step_lo, c.per_step_hi))
        # The stream of small collectives spans the backward pass: windows between two of them
        # (in one burst) belong to it even when no kernel starts inside.
        b0, b1 = bursts(t, small)
        inside = ramp(union_in(windows, b0, b1) / windows.width_us, c.burst_lo, c.burst_hi)
        score = np.maximum(ramp(n_small, c.per_window_lo, c.per_window_hi), inside) * trace_factor
        comm = union_in(windows, *spans(t, small))
        exposed = comm - overlap_in(windows, spans(t, small), spans(t, compute_rows(t)))
        lost = pattern_lost(windows, self.id)
        # A burst covers windows where no small collective costs idle time itself; a trace where
        # they never cost the GPU anything has no finding.
        return {"score": score * trace_costs(t, self.id), "lost_us": lost, "n_small": n_small,
                "n_nccl": count_in(windows, t.ts[allc]),
                "small_us": sum_in(windows, t.ts[small], t.dur[small]), "exposed_us": exposed}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        n_s = int(m["n_small"][idx].sum())
        n_all = int(m["n_nccl"][idx].sum())
        tot = float(m["small_us"][idx].sum())
        per_step = len(small_nccl(t, self.config)) / max(len(t.steps), 1)
        rows = rows_in_windows(windows, small_nccl(t, self.config), idx)
        top = top_names(t, rows, k=2)
        what = ", ".join(f"{n.split('(')[0]} x{c}" for n, c, _ in top)
        text = (f"{n_s} of {n_all} NCCL kernels are short (average {fmt_us(tot / max(n_s, 1))}; "
                f"{per_step:.0f} per step overall): {what}")
        return text, {"n_small_nccl": n_s, "n_nccl": n_all, "small_nccl_us": round(tot, 1),
                      "small_per_step": round(per_step, 1)}


    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_small_nccl", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """NCCL kernels, shortest first."""
        nccl = np.flatnonzero(in_runs(trace, runs) & trace.is_nccl)
        rows = nccl[np.argsort(trace.dur[nccl], kind="stable")]
        return ("NCCL kernels, shortest first (each pays a fixed launch and sync cost)",
                event_rows(trace, rows, limit, detail="nelems"))


PATTERN = register_pattern(SmallNcclKernels())
