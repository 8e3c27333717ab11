"""The device allocator called inside steady-state steps: cudaMalloc / cudaFree (hipMalloc /
hipFree) and `torch.cuda.empty_cache()` after the warm-up, and the GPU idle they leave.

PyTorch's caching allocator calls the driver only when its cache cannot serve a request: while
it grows during the first iterations (one-off start-up, `traceap.idle`'s warm-up), and after
that only when the program defeats the cache: `torch.cuda.empty_cache()` in the loop (it returns
every free block, `cudaFree` synchronises the device, and the next iteration allocates it all
again), or shapes that keep changing (fragmentation: new segments, freed ones).  A `cudaMalloc`
takes 10 us to 10 ms (the HTA benchmark traces of ../shared: 0.04-11 ms; MI300 hipMalloc
10-290 us), a `cudaFree` waits for the device to drain first, so the host issues nothing in
them and the GPU runs dry.

Steady state: with two or more profiler steps, the calls inside a step that is neither the
first one nor a warm-up step of the idle account (`measures.warmup.warmup_intervals`).  Without
steps (inference, a forward loop), only a trace that gives memory back (a cudaFree or
empty_cache: a cache that only grows never frees) churns, and then the calls after the first
third of its GPU span count; allocations that only grow the cache stay warm-up.
Measured here so the idle account (mechanism `allocator_churn`) and the rule count the same
calls.
"""

from __future__ import annotations

import numpy as np

from ..trace import Kind, Trace
from .signals import busy_rows, cached, name_mask, rows_named

#: Driver/runtime calls of the device allocator (not the stream-ordered `cudaMallocAsync`, which
#: reuses a pool and does not synchronise).
ALLOCATOR_CALLS = r"^(cuda|hip)(Malloc|Free)$|^cu(MemAlloc|MemFree)(_v2)?$"
#: `torch.cuda.empty_cache()`: the python frame (with_stack) or the built-in it calls.
EMPTY_CACHE = r"torch/cuda/memory\.py\(\d+\): empty_cache|_cuda_emptyCache|^empty_cache$"
HOST_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION)
#: The relaunch after a call returns into an idle GPU: the next launch and its latency (us;
#: HTA counts a launch delay over 100 us as an outlier, steady launches take 5-50 us).
RELAUNCH_US = 50.0


#: Without profiler steps, the share of the GPU span that is start-up for the allocator.
NO_STEPS_STARTUP = 1 / 3


def steady_steps(trace: Trace, warmup_steps: list[int]) -> list[tuple[float, float]]:
    """(start, end) of the profiler steps after the first that are not warm-up steps; without
    two steps, the GPU span after its first NO_STEPS_STARTUP when the trace frees device
    memory (else none: a growing cache is start-up)."""
    st = sorted((s for s in trace.steps if s.end_us > s.start_us), key=lambda s: s.start_us)
    if len(st) >= 2:
        return [(s.start_us, s.end_us) for s in st[1:] if s.number not in warmup_steps]
    frees = rows_named(trace, ALLOCATOR_CALLS, (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER))
    frees = frees[name_mask(trace, r"Free$|Free_v2$")[trace.name[frees]]]
    g = trace.gpu_work_rows
    if not len(g) or not (len(frees) or len(rows_named(trace, EMPTY_CACHE, HOST_KINDS))):
        return []
    lo, hi = float(trace.ts[g].min()), float(trace.end[g].max())
    return [(lo + NO_STEPS_STARTUP * (hi - lo), hi)]


def _inside(trace: Trace, rows: np.ndarray, steps: list[tuple[float, float]]) -> np.ndarray:
    """The rows that start inside one of `steps`."""
    if not len(rows) or not steps:
        return rows[:0]
    s = np.array([a for a, _ in steps])
    e = np.array([b for _, b in steps])
    o = np.argsort(s)
    s, e = s[o], e[o]
    j = np.searchsorted(s, trace.ts[rows], side="right") - 1
    ok = (j >= 0) & (trace.ts[rows] < e[np.maximum(j, 0)])
    return rows[ok]


def churn_calls(trace: Trace, warmup_steps: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(allocator call rows, empty_cache rows) inside the steady steps, in time order."""
    def make():
        steps = steady_steps(trace, warmup_steps)
        calls = rows_named(trace, ALLOCATOR_CALLS, (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER))
        empty = rows_named(trace, EMPTY_CACHE, HOST_KINDS)
        return _inside(trace, calls, steps), _inside(trace, empty, steps)
    return cached(trace, f"allocator:churn:{tuple(warmup_steps)}", make)


def churn_intervals(trace: Trace, warmup_steps: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) where the steady-state allocator calls explain GPU idle: each call (or
    empty_cache) and, when the GPU is idle as it returns, the idle gap after it up to
    RELAUNCH_US (the host launches the next work only then; a longer wait after it is
    someone else's, e.g. the next batch's loading or the base's own idle)."""
    def make():
        calls, empty = churn_calls(trace, warmup_steps)
        rows = np.concatenate((calls, empty))
        if not len(rows):
            return np.zeros(0), np.zeros(0)
        s, e = trace.ts[rows].astype(np.float64), trace.end[rows].astype(np.float64)
        b = busy_rows(trace)
        bs, be = trace.ts[b], trace.end[b]
        # The first busy work that starts at or after each return: the end of the gap the call
        # returned into (when nothing runs at that moment).
        starts = np.sort(bs)
        k = np.searchsorted(starts, e, side="left")
        nxt = np.where(k < len(starts), starts[np.minimum(k, len(starts) - 1)], e)
        # Busy at the return: some work started before it and ends after it.
        o = np.argsort(bs, kind="stable")
        reach = np.maximum.accumulate(be[o]) if len(o) else np.zeros(0)
        j = np.searchsorted(bs[o], e, side="right") - 1
        busy_at = (j >= 0) & (reach[np.maximum(j, 0)] > e) if len(o) else np.zeros(len(e), bool)
        end = np.where(busy_at, e, np.clip(nxt, e, e + np.minimum(e - s, RELAUNCH_US)))
        return s, end
    return cached(trace, f"allocator:intervals:{tuple(warmup_steps)}", make)


__all__ = ["ALLOCATOR_CALLS", "EMPTY_CACHE", "churn_calls", "churn_intervals", "steady_steps"]
