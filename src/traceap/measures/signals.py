"""Shared measurements the anti-pattern rules and the idle account are built from.

Everything here is vectorised over the trace's columns and cached on the `Trace` or the
`Windows` object it belongs to, so eight patterns (plus the classifier and the report) asking
for the same thing pay for it once.  Interval arithmetic works on unions: the overlap of two
sets of intervals A and B inside a window is |A| + |B| - |A u B|.
"""

from __future__ import annotations

import re
from typing import Callable, TypeVar

import numpy as np

from ..trace import CopyKind, Kind, Trace, merged_intervals
from ..units import fmt_bytes, fmt_us  # noqa: F401 - re-exported for the pattern modules
from ..windows import Windows, covered_time

T = TypeVar("T")

#: CPU-side kinds that carry Python/op/annotation names (where DataLoader and compile markers live).
HOST_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION)

#: `enumerate(DataLoader)#..._next__` annotations and with_stack python frames of the loader
#: (the data-loading rule, and the idle account's data_loading cause).
LOADER_NEXT = r"DataLoader.*__next__|torch/utils/data/dataloader\.py\(\d+\): __next__"


def cached(obj: object, key: str, make: Callable[[], T]) -> T:
    """`make()` computed once per (obj, key); stored on the object so it dies with it."""
    store = obj.__dict__.setdefault("_traceap_cache", {})
    if key not in store:
        store[key] = make()
    return store[key]


def ramp(x: np.ndarray | float, lo: float, hi: float) -> np.ndarray:
    """0 below `lo`, 1 above `hi`, linear between: how a measure becomes a score."""
    return np.clip((np.asarray(x, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)


# -- names -----------------------------------------------------------------------------------
def name_mask(trace: Trace, pattern: str) -> np.ndarray:
    """Per name code: the name matches the regex `pattern` (evaluated once per unique name)."""
    def make() -> np.ndarray:
        rx = re.compile(pattern)
        return np.fromiter((bool(rx.search(n)) for n in trace.names), dtype=bool,
                           count=len(trace.names))
    return cached(trace, f"name:{pattern}", make)


def rows_named(trace: Trace, pattern: str, kinds: tuple[Kind, ...] = HOST_KINDS) -> np.ndarray:
    """Rows of the given kinds whose name matches the regex `pattern`, in time order."""
    def make() -> np.ndarray:
        rows = trace.rows(*kinds)
        if not len(rows) or not len(trace.names):
            return rows
        return rows[name_mask(trace, pattern)[trace.name[rows]]]
    return cached(trace, f"rows:{pattern}:{kinds}", make)


# -- interval sets ---------------------------------------------------------------------------
def intersect(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray, b1: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) covered by both union(a) and union(b)."""
    a0, a1 = merged_intervals(np.asarray(a0, float), np.asarray(a1, float))
    b0, b1 = merged_intervals(np.asarray(b0, float), np.asarray(b1, float))
    if not len(a0) or not len(b0):
        return np.zeros(0), np.zeros(0)
    pts = np.concatenate((a0, a1, b0, b1))
    step = np.concatenate((np.ones(len(a0)), -np.ones(len(a1)), np.ones(len(b0)),
                           -np.ones(len(b1))))
    order = np.lexsort((step, pts))  # at a shared point, ends (-1) before starts (+1)
    pts, depth = pts[order], np.cumsum(step[order])
    both = np.flatnonzero(depth[:-1] == 2)
    s, e = pts[both], pts[both + 1]
    keep = e > s
    return s[keep], e[keep]


def subtract(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray, b1: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) covered by union(a) and not by union(b)."""
    a0, a1 = merged_intervals(np.asarray(a0, float), np.asarray(a1, float))
    b0, b1 = merged_intervals(np.asarray(b0, float), np.asarray(b1, float))
    if not len(a0) or not len(b0):
        return a0, a1
    # The complement of b, bounded by a's extent, intersected with a.
    lo, hi = min(a0[0], b0[0]), max(a1[-1], b1[-1])
    c0, c1 = np.r_[lo, b1], np.r_[b0, hi]
    keep = c1 > c0
    return intersect(a0, a1, c0[keep], c1[keep])


def inside(s: np.ndarray, e: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per point of `x`: inside the union of sorted disjoint intervals [s, e)."""
    if not len(s):
        return np.zeros(len(x), dtype=bool)
    j = np.searchsorted(s, x, side="right") - 1
    return (j >= 0) & (x < e[np.maximum(j, 0)])


# -- intervals per window --------------------------------------------------------------------
def union_in(windows: Windows, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per window: time covered by the union of intervals [starts, ends)."""
    if len(starts) == 0:
        return np.zeros(windows.n)
    s, e = merged_intervals(np.asarray(starts, float), np.asarray(ends, float))
    return np.diff(covered_time(s, e, windows.edges))


def overlap_in(windows: Windows, a: tuple[np.ndarray, np.ndarray],
               b: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per window: time covered by both union(a) and union(b)."""
    ua, ub = union_in(windows, *a), union_in(windows, *b)
    both = union_in(windows, np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1])))
    return np.clip(ua + ub - both, 0.0, None)


def spans(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of rows."""
    return trace.ts[rows], trace.end[rows]


def count_in(windows: Windows, ts: np.ndarray) -> np.ndarray:
    """Per window: how many time points fall in it (points outside the span are dropped)."""
    ts = ts[(ts >= windows.edges[0]) & (ts <= windows.edges[-1])]
    return np.bincount(windows.index_of(ts), minlength=windows.n).astype(np.float64)


def sum_in(windows: Windows, ts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per window: sum of values at time points ts."""
    keep = (ts >= windows.edges[0]) & (ts <= windows.edges[-1])
    return np.bincount(windows.index_of(ts[keep]), weights=values[keep], minlength=windows.n)


# -- GPU activity ----------------------------------------------------------------------------
def busy_rows(trace: Trace) -> np.ndarray:
    """GPU work that counts as busy (`traceap.idle`'s definition): compute kernels, memsets,
    on-device copies."""
    def make() -> np.ndarray:
        g = trace.gpu_work_rows
        kind = trace.kind[g]
        keep = ((kind == Kind.KERNEL) & ~trace.is_nccl[g]) | (kind == Kind.GPU_MEMSET) | (
            (kind == Kind.GPU_MEMCPY) & np.isin(trace.copy_kind[g], (CopyKind.DTOD, CopyKind.PTOP)))
        return g[keep]
    return cached(trace, "idle:busy_rows", make)


def busy_per_window(windows: Windows) -> np.ndarray:
    """Per window: time the GPU is busy (compute kernel, memset or on-device copy)."""
    def make() -> np.ndarray:
        t = windows.trace
        b = busy_rows(t)
        s, e = merged_intervals(t.ts[b], t.end[b])
        return np.diff(covered_time(s, e, windows.edges))
    return cached(windows, "busy_windows", make)


def kernel_rows(trace: Trace) -> np.ndarray:
    """Kernel rows."""
    return cached(trace, "kernels", lambda: trace.rows(Kind.KERNEL))


def nccl_rows(trace: Trace) -> np.ndarray:
    """NCCL/RCCL kernel rows."""
    return cached(trace, "nccl", lambda: np.flatnonzero(trace.is_nccl))


def compute_rows(trace: Trace) -> np.ndarray:
    """Kernels that are not communication."""
    def make() -> np.ndarray:
        k = kernel_rows(trace)
        return k[~trace.is_nccl[k]]
    return cached(trace, "compute", make)


def compute_streams(trace: Trace, min_share: float = 0.1) -> np.ndarray:
    """Streams carrying at least `min_share` of all compute-kernel time (the 'main' streams)."""
    def make() -> np.ndarray:
        c = compute_rows(trace)
        if not len(c):
            return np.zeros(0, dtype=np.int64)
        streams, inv = np.unique(trace.stream[c], return_inverse=True)
        time = np.bincount(inv, weights=trace.dur[c])
        total = time.sum()
        return streams[time >= min_share * total] if total > 0 else streams
    return cached(trace, f"compute_streams:{min_share}", make)


def starved_gaps(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU idle gaps that end because the CPU only just launched the next work.

    For GPU work in start order, the device has drained everything before it at
    `prev_end = max(end of all earlier work)`.  If the next item starts after that and its
    launching runtime call began after the device went idle, the device waited for the host:
    (gap start, gap end, row of the work that ended the gap).  Gaps whose next item was already
    queued (dependencies, event waits) are not counted.
    """
    def make():
        g = trace.gpu_work_rows
        if len(g) < 2:
            z = np.zeros(0)
            return z, z, np.zeros(0, dtype=np.int64)
        g = g[np.argsort(trace.ts[g], kind="stable")]
        ts, end = trace.ts[g], trace.end[g]
        prev_end = np.maximum.accumulate(end)[:-1]
        nxt = g[1:]
        launch = trace.launch[nxt]
        launch_ts = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)], np.inf)
        gap = ts[1:] - prev_end
        late = (gap > 0) & (launch_ts >= prev_end)
        return prev_end[late], ts[1:][late], nxt[late]
    return cached(trace, "starved_gaps", make)


def gpu_busy_span(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of all GPU work (kernels, memcpys, memsets)."""
    g = trace.gpu_work_rows
    return trace.ts[g], trace.end[g]


def idle_while(windows: Windows, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per window: time inside union(starts, ends) during which the GPU ran nothing."""
    def busy():
        return union_in(windows, *gpu_busy_span(windows.trace))
    b = cached(windows, "gpu_busy_union", busy)
    gs, ge = gpu_busy_span(windows.trace)
    both = union_in(windows, np.concatenate((starts, gs)), np.concatenate((ends, ge)))
    return np.clip(both - b, 0.0, None)


def outer_cpu_ops(trace: Trace) -> np.ndarray:
    """CPU ops with no enclosing CPU op (`aten::conv2d`, not the `aten::_convolution` in it)."""
    def make() -> np.ndarray:
        cpu = trace.rows(Kind.CPU_OP)
        par = trace.parent[cpu]
        return cpu[(par < 0) | (trace.kind[np.maximum(par, 0)] != Kind.CPU_OP)]
    return cached(trace, "outer_cpu_ops", make)


#: Ranges that hold a whole step, not a place in it.
STEP_RANGES = r"^ProfilerStep#|^## (train|eval)_?step"


def enclosing_annotations(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Per row: the innermost user annotation around it (a `record_function` range such as
    `## sparse_data_dist ##` or `Optimizer.step#SGD.step`, not a whole profiler step), or -1."""
    out = np.full(len(rows), -1, dtype=np.int64)
    step = name_mask(trace, STEP_RANGES)
    p = trace.parent[rows].astype(np.int64)
    todo = np.flatnonzero(p >= 0)
    while len(todo):  # one level of the call tree per pass (depth is tens at most)
        q = p[todo]
        hit = (trace.kind[q] == Kind.USER_ANNOTATION) & ~step[trace.name[q]]
        out[todo[hit]] = q[hit]
        p[todo] = trace.parent[q]
        todo = todo[~hit & (p[todo] >= 0)]
    return out


def ancestors(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Per trace row: whether it encloses one of `rows` in the call tree (`Trace.parent`, the
    enclosing host event on the same thread), at any depth."""
    out = np.zeros(len(trace), dtype=bool)
    p = trace.parent[rows].astype(np.int64)
    p = p[p >= 0]
    while len(p):  # one level of the call tree per pass; a row marked before ends its walk
        p = np.unique(p)
        p = p[~out[p]]
        out[p] = True
        p = trace.parent[p].astype(np.int64)
        p = p[p >= 0]
    return out


def top_names(trace: Trace, rows: np.ndarray, weights: np.ndarray | None = None,
              k: int = 3) -> list[tuple[str, int, float]]:
    """The k most frequent (or heaviest) names among rows: (name, count, total weight)."""
    if not len(rows):
        return []
    codes = trace.name[rows]
    w = np.ones(len(rows)) if weights is None else weights
    uniq, inv = np.unique(codes, return_inverse=True)
    tot = np.bincount(inv, weights=w)
    cnt = np.bincount(inv)
    order = np.argsort(-tot)[:k]
    return [(trace.names[uniq[i]], int(cnt[i]), float(tot[i])) for i in order]


def rows_in_windows(windows: Windows, rows: np.ndarray, idx) -> np.ndarray:
    """Rows (of any kind) starting inside the given windows (rows in time order: by binary
    search per run of consecutive windows, so evidence for one window costs O(log n))."""
    if not len(rows):
        return rows
    ts = windows.trace.ts[rows]
    idx = np.unique(np.asarray(list(idx), dtype=np.int64))
    idx = idx[(idx >= 0) & (idx < windows.n)]
    if not len(idx):
        return rows[:0]
    if len(ts) > 1 and not np.all(ts[1:] >= ts[:-1]):
        order = np.argsort(ts, kind="stable")
        rows, ts = rows[order], ts[order]
    cut = np.flatnonzero(np.diff(idx) > 1)
    first = idx[np.r_[0, cut + 1]]
    last = idx[np.r_[cut, len(idx) - 1]]
    lo = np.searchsorted(ts, windows.edges[first], side="left")
    # The last window is closed on the right (events at the very end belong to it).
    hi_side = np.where(last + 1 == windows.n, "right", "left")
    hi = np.array([np.searchsorted(ts, windows.edges[b + 1], side=sd)
                   for b, sd in zip(last, hi_side)], dtype=np.int64)
    return np.concatenate([rows[a:b] for a, b in zip(lo, hi)]) if len(lo) else rows[:0]


def per_episode(values: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Per window: the sum of `values` over its run of consecutive `active` windows (its own
    value where it is not active)."""
    active = np.asarray(active, dtype=bool)
    if not active.any():
        return np.asarray(values, dtype=np.float64).copy()
    starts = active & ~np.r_[False, active[:-1]]
    run = np.cumsum(starts)
    sums = np.bincount(run[active], weights=np.asarray(values, float)[active],
                       minlength=run.max() + 1)
    return np.where(active, sums[run], values)


def steady_from(trace: Trace) -> float:
    """Where the steady state starts: the second profiler step when the trace has two or more,
    else its start (-inf).  The first step is warm-up whatever its length: cuDNN autotuning
    tries FP32 and NCHW algorithms, an optimizer makes its state parameter by parameter, the
    allocator grows.  Natural labels and the busy-time rules both start here."""
    steps = trace.steps
    return float(steps[1].start_us) if len(steps) >= 2 else -np.inf


def steady_rows(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The rows that start in the steady state (`steady_from`)."""
    return rows[trace.ts[rows] >= steady_from(trace)]


def through_resume(trace: Trace, ends: np.ndarray, cap_us: float) -> np.ndarray:
    """Per host-interval end: where the GPU resumes after it (the next busy start, `busy_rows`)
    when it ends while the GPU idles, at most `cap_us` later; the end itself otherwise.  A
    stall's cost runs until the work launched after it reaches the GPU."""
    def make():
        b = busy_rows(trace)
        return merged_intervals(trace.ts[b], trace.end[b])
    bs, be = cached(trace, "busy_merged", make)
    e = np.asarray(ends, dtype=np.float64)
    if not len(bs) or not len(e):
        return e
    j = np.searchsorted(bs, e, side="left")
    nxt = np.where(j < len(bs), bs[np.minimum(j, len(bs) - 1)], e)
    # inside a busy stretch (the GPU still drains work queued before) it resumes at once
    k = np.searchsorted(bs, e, side="right") - 1
    inside = (k >= 0) & (e < be[np.maximum(k, 0)])
    return np.where(inside, e, np.clip(nxt, e, e + cap_us))
