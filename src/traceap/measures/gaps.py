"""The GPU span, the idle gaps in it, and what fills or waits in them.

The GPU span is where the idle account (`traceap.idle`) measures: from the first start to the
last end of any GPU work, widened to whole profiler steps where the trace has them, and
without steps to the `DataLoader.__next__` the first GPU work waited for.  Its idle gaps are
the stretches with no busy work (`signals.busy_rows`); `queued_intervals` says where busy work
had been launched and waited to start; `loader_gaps` where data loading fills the gaps.
"""

from __future__ import annotations

import numpy as np

from ..trace import Trace, merged_intervals
from ..windows import covered_time
from .signals import LOADER_NEXT, busy_rows, cached, rows_named, spans


def gpu_span(trace: Trace) -> tuple[float, float]:
    """(start, end) of the span idle time is measured in: GPU work, widened to whole steps, or
    without steps to the `DataLoader.__next__` the first GPU work waited for."""
    g = trace.gpu_work_rows
    lo, hi = float(trace.ts[g].min()), float(trace.end[g].max())
    if trace.steps:
        lo = min(lo, min(s.start_us for s in trace.steps))
        hi = max(hi, max(s.end_us for s in trace.steps))
    else:
        lo = min(lo, first_batch_start(trace, lo))
    return lo, hi


def leading_gap(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The head of the GPU span before its first GPU work, as (starts, ends) of length 0 or 1:
    starved when that work's launch call began only inside the span (the step had begun and the
    host had launched nothing yet: per-sample augmentation before the first upload, say).  A
    trace whose first GPU work was launched before the span began, or begins it, has none."""
    g = trace.gpu_work_rows
    z = np.zeros(0)
    if not len(g):
        return z, z
    lo, _ = gpu_span(trace)
    first = g[np.argmin(trace.ts[g])]
    call = int(trace.launch[first])
    if call < 0 or float(trace.ts[first]) <= lo or float(trace.ts[call]) < lo:
        return z, z
    return np.array([lo]), np.array([float(trace.ts[first])])


def first_batch_start(trace: Trace, first_gpu_us: float) -> float:
    """Start of the loader `__next__` the first GPU work waited for: the last one that starts
    before it and ends closer to it than its own length (nothing else came between them);
    `first_gpu_us` when there is none."""
    nxt = rows_named(trace, LOADER_NEXT)
    nxt = nxt[trace.ts[nxt] < first_gpu_us]
    if not len(nxt):
        return first_gpu_us
    last = nxt[np.argmax(trace.ts[nxt])]
    if first_gpu_us - float(trace.end[last]) <= float(trace.dur[last]):
        return float(trace.ts[last])
    return first_gpu_us


def idle_gaps(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the GPU idle gaps inside the GPU span (no compute kernel, memset or
    on-device copy running)."""
    def make():
        lo, hi = gpu_span(trace)
        b = busy_rows(trace)
        bs, be = merged_intervals(np.clip(trace.ts[b], lo, hi), np.clip(trace.end[b], lo, hi))
        s, e = np.r_[lo, be], np.r_[bs, hi]
        keep = e > s
        return s[keep], e[keep]
    return cached(trace, "gaps:idle", make)


def queued_intervals(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) in which some GPU work that counts as busy (`busy_rows`) had been launched
    by the host and waited to start: [launch call start, work start)."""
    def make():
        b = busy_rows(trace)
        call = trace.launch[b]
        b, call = b[call >= 0], call[call >= 0]
        s, e = trace.ts[call], trace.ts[b]
        keep = e > s
        return merged_intervals(s[keep], e[keep])
    return cached(trace, "gaps:queued", make)


def loader_gaps(trace: Trace, gap_share: float) -> tuple[np.ndarray, np.ndarray]:
    """Where data loading explains idle time: every `DataLoader.__next__`, and the whole of each
    GPU idle gap that loaders fill for at least `gap_share` of its length."""
    nxt = rows_named(trace, LOADER_NEXT)
    ns, ne = spans(trace, nxt)
    if not len(nxt) or not trace.has_gpu:
        return ns, ne
    gs, ge = idle_gaps(trace)
    ms, me = merged_intervals(ns, ne)
    f = covered_time(ms, me, np.concatenate((gs, ge)))
    filled = f[len(gs):] - f[:len(gs)]
    whole = filled >= gap_share * (ge - gs)
    return np.concatenate((ns, gs[whole])), np.concatenate((ne, ge[whole]))
