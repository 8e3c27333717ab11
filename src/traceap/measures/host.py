"""What the host did besides launching: the user's Python, ops on host tensors, unrecorded work.

A framework call is an op named `ns::name` (ATen and other registered ops) or a runtime or
driver call; between two of them the host runs Python or something unrecorded.  Inside one, an
op that launches nothing (no runtime call under it, no GPU work attributed to it) and runs for
long stretches of its own computes on host tensors: per-sample augmentation in the training
loop, preprocessing on the CPU.  The idle account (`traceap.idle`: `python_host`,
`unrecorded_host`), the CPU-bound rule and the sync-cost measure (`copies.sync_costs`) read the
same holes and ops with the same thresholds (`HostConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Kind, Trace, merged_intervals
from .signals import cached, name_mask, outer_cpu_ops, rows_named, subtract

#: Framework calls: ATen and other registered ops (`ns::name`) and runtime/driver calls.  User
#: ranges (record_function, `ProfilerStep#3`, python frames) say where, not that work ran.
FRAMEWORK_OP = r"::"
#: A compiled graph running (AOTAutograd's forward and backward, Inductor's generated wrapper):
#: the Python between its launches is the wrapper's, the framework's own launch path (what
#: CUDA graphs remove), not the user's code.  The eager code between two compiled graphs of a
#: broken frame lies outside them (`measures.compile_regions.compile_gaps`).
COMPILED_GRAPH = r"^CompiledFunction$|^CompiledFunctionBackward$|^## Call CompiledFxGraph"


@dataclass(frozen=True)
class HostConfig:
    """When a hole between framework calls is the user's Python, and when unrecorded work."""

    #: The host recording no framework call (op, runtime call) for longer than this is doing
    #: something the profiler did not see.  Python between two launches takes 10-150 us in the
    #: real traces at hand (1.2 ms at most with 6x planted overhead, docs/INJECT.md); the
    #: unrecorded stretches of the validation traces last 148 ms to 1.3 s.
    unrecorded_host_us: float = 5000.0
    #: Python between two framework calls longer than this many times the framework call
    #: before it is the user's code holding the GPU up, not dispatch.  Chosen on the validation
    #: split of the real-based benchmark (`benchmarks/real_rules_report.py`): at 2 healthy
    #: small-model windows stay under the CPU-bound rule's flag (99%) while planted Python is found.
    python_ratio: float = 2.0
    #: An op that launches nothing computes on host tensors when it runs this long on its own
    #: between the events under it (its own time over its children + 1).  Framework
    #: bookkeeping that launches nothing stays under it: the view, narrow and autograd-node ops
    #: of the 75 real traces of ../shared/traces run at most 133 us each (DDP's
    #: `unflatten_dense_tensors`: 212 views under one op), CPU augmentation ops of a
    #: 224 px image 0.3-3 ms.
    host_compute_us: float = 250.0


def framework_calls(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the merged stretches in which some thread is inside a framework call
    (an op named `ns::name`, a runtime or driver call).  Sorted, disjoint."""
    def make():
        cpu = trace.rows(Kind.CPU_OP)
        if len(cpu) and len(trace.names):
            cpu = cpu[name_mask(trace, FRAMEWORK_OP)[trace.name[cpu]]]
        rows = np.concatenate((cpu, trace.rows(Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)))
        if not len(rows):
            return np.zeros(0), np.zeros(0)
        return merged_intervals(trace.ts[rows], trace.end[rows])
    return cached(trace, "host:framework_calls", make)


def host_holes(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the stretches in which no thread of the trace was inside a framework
    call (an op named `ns::name`, a runtime or driver call): Python between launches, or work
    the profiler did not see.  Sorted, disjoint."""
    s, e = framework_calls(trace)
    return e[:-1], s[1:]


def compiled_graphs(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the host running a compiled graph (`COMPILED_GRAPH`).  Sorted,
    disjoint."""
    def make():
        rows = rows_named(trace, COMPILED_GRAPH, (Kind.CPU_OP, Kind.USER_ANNOTATION))
        return merged_intervals(trace.ts[rows], trace.end[rows])
    return cached(trace, "host:compiled_graphs", make)


def python_holes(trace: Trace, config: HostConfig = HostConfig()
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The host holes in which the user's Python outlasts the framework: longer than
    `config.python_ratio` x the framework call just before them (and not unrecorded work),
    outside the run of a compiled graph (`compiled_graphs`: its wrapper's Python)."""
    def make():
        h0, h1 = host_holes(trace)
        if not len(h0):
            return h0, h1
        # The framework call before hole i is the merged call that ends where the hole starts.
        s, e = framework_calls(trace)
        before = e[:-1] - s[:-1]
        long = h1 - h0
        keep = (long > config.python_ratio * before) & (long <= config.unrecorded_host_us)
        return subtract(h0[keep], h1[keep], *compiled_graphs(trace))
    return cached(trace, f"host:python_holes:{config!r}", make)


def launching_threads(trace: Trace, tids: np.ndarray) -> np.ndarray:
    """Those of thread ids `tids` whose runtime calls launched GPU work (kernels, copies,
    memsets): a few candidates checked, not every thread of a large trace listed."""
    calls = trace.launch[trace.gpu_work_rows]
    tids = np.unique(tids)
    return tids[np.isin(tids, trace.tid[calls[calls >= 0]])]


def _launch_marks(trace: Trace, tid: int) -> np.ndarray:
    """Start times, sorted, of what shows GPU work was asked for on thread `tid`: its runtime
    and driver calls, and its ops a GPU event is attributed to (`cpu_op`: a compiled graph's
    launches need not be nested under the op that asked for them)."""
    def make():
        mark = np.zeros(len(trace), dtype=bool)
        mark[trace.rows(Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)] = True
        owner = trace.cpu_op[trace.gpu_work_rows]
        mark[owner[owner >= 0]] = True
        # rows are in time order, so these starts are sorted
        return trace.ts[np.flatnonzero(mark & (trace.tid == tid))]
    return cached(trace, f"host:launch_marks:{tid}", make)


def launches_under(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Per op row: GPU work was asked for under it (a runtime call, or an op a GPU event is
    attributed to, on its thread inside its span: on one thread, what runs inside an op's span
    is under it)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(len(rows), dtype=bool)
    for t in np.unique(trace.tid[rows]):
        at = np.flatnonzero(trace.tid[rows] == t)
        out[at] = _asks_for_gpu(trace, rows[at])
    return out


def host_compute_ops(trace: Trace, config: HostConfig = HostConfig()) -> np.ndarray:
    """CPU op rows that compute on host tensors: registered ops (`ns::name`; not a
    `record_function` range such as Dynamo's "Pregraph bytecode") with no GPU work asked for
    under them (`launches_under`), on a thread that launches GPU work, running over
    `config.host_compute_us` on their own between the events under them (their own time over
    their children + 1).  Sorted."""
    def make():
        cpu = trace.rows(Kind.CPU_OP)
        # only an op longer than the cut can run that long on its own
        cand = cpu[trace.dur[cpu] > config.host_compute_us]
        cand = cand[name_mask(trace, FRAMEWORK_OP)[trace.name[cand]]]
        if not len(cand):
            return cand
        slot = np.full(len(trace), -1, dtype=np.int64)
        slot[cand] = np.arange(len(cand))
        par = trace.parent
        child = np.flatnonzero(par >= 0)
        child = child[slot[par[child]] >= 0]
        at = slot[par[child]]
        child_us = np.bincount(at, weights=trace.dur[child], minlength=len(cand))
        n_child = np.bincount(at, minlength=len(cand))
        stretch = np.maximum(trace.dur[cand] - child_us, 0.0) / (n_child + 1)
        cand = cand[stretch > config.host_compute_us]
        if not len(cand):
            return cand
        cand = cand[np.isin(trace.tid[cand], launching_threads(trace, trace.tid[cand]))]
        return cand[~launches_under(trace, cand)]
    return cached(trace, f"host:host_compute_ops:{config.host_compute_us}", make)


def host_compute(trace: Trace, config: HostConfig = HostConfig()) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of stretches in which a thread that launches GPU work computed on host
    tensors.  Sorted, disjoint.

    On each such thread, its outermost ops (and runtime calls outside any op) in time order
    make runs of ops with no GPU work asked for under them (`launches_under`), each run ended by
    one that asks for some.  A run counts, from its first op's start to its last op's end (the
    Python between them included), when some op in it runs over `config.host_compute_us` on its
    own between the events under it (`host_compute_ops`): a per-sample augmentation loop on CPU
    images (`aten::conv2d`, `aten::grid_sampler`, the `aten::rand` and `aten::cat` between
    them), not the views and autograd bookkeeping the framework runs between launches (none of
    them that long).  While the GPU starves there, the user's code holds it up, not the
    dispatch of kernels."""
    def make():
        z = np.zeros(0)
        long = host_compute_ops(trace, config)
        if not len(long):  # most traces: nothing computes on host tensors for long
            return z, z
        # the outermost op each long one runs under
        top = long.astype(np.int64)
        up = trace.parent[top].astype(np.int64)
        while True:
            climb = (up >= 0) & (trace.kind[np.maximum(up, 0)] == Kind.CPU_OP)
            if not climb.any():
                break
            top = np.where(climb, up, top)
            up = np.where(climb, trace.parent[np.maximum(up, 0)].astype(np.int64), -1)
        computes = np.unique(top)
        outer = outer_cpu_ops(trace)
        rt = trace.rows(Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)
        rt = rt[(trace.parent[rt] < 0)
                | (trace.kind[np.maximum(trace.parent[rt], 0)] != Kind.CPU_OP)]
        starts, ends = [], []
        for tid in np.unique(trace.tid[computes]):
            ops = outer[trace.tid[outer] == tid]
            items = np.concatenate((ops, rt[trace.tid[rt] == tid]))
            items = items[np.argsort(trace.ts[items], kind="stable")]
            stops = trace.kind[items] != Kind.CPU_OP
            is_op = ~stops
            stops[is_op] = _asks_for_gpu(trace, items[is_op])  # a launching op ends a run
            run = np.cumsum(stops)
            keep = ~stops
            items, run = items[keep], run[keep]
            if not len(items):
                continue
            lo = np.full(run.max() + 1, np.inf)
            hi = np.full(run.max() + 1, -np.inf)
            has = np.zeros(run.max() + 1, dtype=bool)
            np.minimum.at(lo, run, trace.ts[items])
            np.maximum.at(hi, run, trace.end[items])
            np.logical_or.at(has, run, np.isin(items, computes))
            starts.append(lo[has])
            ends.append(hi[has])
        if not starts:
            return z, z
        return merged_intervals(np.concatenate(starts), np.concatenate(ends))
    return cached(trace, f"host:host_compute:{config.host_compute_us}", make)


def _asks_for_gpu(trace: Trace, ops: np.ndarray) -> np.ndarray:
    """Per op row of one thread: GPU work asked for inside its span (`_launch_marks` of that
    thread between its start and its end)."""
    if not len(ops):
        return np.zeros(0, dtype=bool)
    seg = _launch_marks(trace, int(trace.tid[ops[0]]))
    if not len(seg):
        return np.zeros(len(ops), dtype=bool)
    j = np.searchsorted(seg, trace.ts[ops], side="left")
    return (j < len(seg)) & (seg[np.minimum(j, len(seg) - 1)] <= trace.end[ops])


def user_code(trace: Trace, config: HostConfig = HostConfig()) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the host running the user's code rather than launching: Python between
    framework calls (`python_holes`) and ops on host tensors (`host_compute`).  Sorted,
    disjoint."""
    def make():
        p0, p1 = python_holes(trace, config)
        c0, c1 = host_compute(trace, config)
        return merged_intervals(np.concatenate((p0, c0)), np.concatenate((p1, c1)))
    return cached(trace, f"host:user_code:{config!r}", make)


def unrecorded_host(trace: Trace, longer_than_us: float) -> tuple[np.ndarray, np.ndarray]:
    """The host holes longer than `longer_than_us`: host time the profiler did not record."""
    h0, h1 = host_holes(trace)
    long = (h1 - h0) > longer_than_us
    return h0[long], h1[long]
