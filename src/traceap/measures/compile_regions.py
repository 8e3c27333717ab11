"""torch.compile regions and the eager stretches between them, measured on the GPU.

Measurements of the trace, below both the rules and the idle account.  Shared by the
graph-break rule (the stretches are the anti-pattern), the host copy/sync rule (a copy inside
one belongs to the break, not to a memcpy habit), the exposed-communication rule (a compiled
model gets the DDPOptimizer hint) and the idle account (`traceap.idle`).  Gaps are measured on the
device, from the last kernel a region launched to the first kernel of the next region, within
one step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..trace import Kind, merged_intervals
from .signals import ancestors, cached, name_mask, rows_named, through_resume

FORWARD = r"^Torch-Compiled Region|^CompiledFunction$"
BACKWARD = r"^CompiledFunctionBackward$"
REGION = r"^Torch-Compiled Region"
FRAME = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
OPTIMIZER = r"^Optimizer\.step|^## optimizer ##"


@dataclass(frozen=True)
class BreakConfig:
    """Thresholds on GPU idle time between compiled regions (share of a window)."""

    idle_lo: float = 0.02
    idle_hi: float = 0.20
    #: Share of a window spent in eager code between compiled regions (GPU busy or not).
    gap_lo: float = 0.3
    gap_hi: float = 0.8
    #: Gaps longer than this without step markers are between iterations, not breaks.
    max_gap_us: float = 100_000.0
    #: How much to believe a break from the frame ids: >= 2 frames, no ids, one frame reused.
    weight_frames: float = 1.0
    weight_unknown: float = 0.7
    weight_one_frame: float = 0.3


def frame_ids(trace) -> set[int]:
    """Distinct Dynamo frame ids N among the `Torch-Compiled Region: N/M` events."""
    rows = rows_named(trace, FORWARD, (Kind.CPU_OP, Kind.USER_ANNOTATION))
    codes = np.unique(trace.name[rows])
    return {int(m.group(1)) for c in codes if (m := FRAME.match(trace.names[c]))}


def gpu_extents(trace, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where host intervals [s, e) ran on the GPU: from the first start to the last end of the
    GPU work they launched (the host interval itself where they launched none).

    A compiled region's CPU op only spans the launches; its kernels run later, so gaps between
    regions must be measured on the device, or a host running ahead hides every break."""
    g = trace.gpu_work_rows
    launch = trace.launch[g]
    g, launch = g[launch >= 0], launch[launch >= 0]
    at = trace.ts[launch]
    j = np.searchsorted(s, at, side="right") - 1
    inside = (j >= 0) & (at < e[np.maximum(j, 0)])
    j, g = j[inside], g[inside]
    gs = np.full(len(s), np.inf)
    ge = np.full(len(s), -np.inf)
    np.minimum.at(gs, j, trace.ts[g])
    np.maximum.at(ge, j, trace.end[g])
    has = np.isfinite(gs)
    return np.where(has, gs, s), np.where(has, ge, e)


def compiled_rows(trace, pattern: str) -> np.ndarray:
    """The rows of `pattern` (FORWARD or BACKWARD) that are compiled code, in time order.

    After a graph break Dynamo runs the rest of the function as a new compiled frame inside
    the one that broke: a `Torch-Compiled Region` that holds another region spans the eager
    code between them too (on a compiled ResNet-50 with a break in a layer's hook, frame 0/0
    spans the whole forward, its graphs and resumed frames nested in it).  Where the graphs
    show as `CompiledFunction` (training), such a region is left out and its graphs and the
    regions inside it stay; without them (inference) the region stays whole."""
    rows = rows_named(trace, pattern, (Kind.CPU_OP, Kind.USER_ANNOTATION))
    is_region = name_mask(trace, REGION)[trace.name[rows]]
    regions, graphs = rows[is_region], rows[~is_region]
    if not len(regions) or not len(graphs):
        return rows
    drop = regions[ancestors(trace, regions)[regions] & ancestors(trace, graphs)[regions]]
    return np.setdiff1d(rows, drop)


def break_gaps(trace, config: BreakConfig) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the eager stretches between consecutive compiled regions of one
    direction within one step: on the device (last kernel of a region to the first of the next)
    and on the host (first eager op after a region to the next region)."""
    def make():
        starts, ends = [], []
        step_starts = np.array(sorted(s.start_us for s in trace.steps), dtype=float)
        opt = trace.ts[rows_named(trace, OPTIMIZER, (Kind.USER_ANNOTATION, Kind.CPU_OP))]
        opt = np.sort(opt)
        for pattern in (FORWARD, BACKWARD):
            rows = compiled_rows(trace, pattern)
            if len(rows) < 2:
                continue
            s, e = merged_intervals(trace.ts[rows], trace.end[rows])
            gs, ge = gpu_extents(trace, s, e)
            h0, h1 = e[:-1], s[1:]          # host-side gap: decides "same step"
            g0, g1 = ge[:-1], gs[1:]        # device-side gap: what the break costs
            ok = (h1 > h0) & (g1 > g0)
            if len(step_starts):
                ok &= np.searchsorted(step_starts, h0) == np.searchsorted(step_starts, h1)
            else:
                ok &= (h1 - h0) <= config.max_gap_us
            if len(opt):
                ok &= np.searchsorted(opt, h0) == np.searchsorted(opt, h1)
            # The eager stretch on the host: from the first op after a region to the next region.
            ops = np.sort(trace.ts[trace.rows(Kind.CPU_OP)])
            k = np.searchsorted(ops, h0, side="right")
            first_op = np.where(k < len(ops), ops[np.minimum(k, len(ops) - 1)], np.inf)
            # ... but not while the host waits in a sync (a `.item()` break waits for the
            # previous region's kernels; that wait is the device's time, counted above).
            sync_end = np.sort(trace.end[np.flatnonzero(trace.is_sync)])
            j = np.searchsorted(sync_end, h1, side="right") - 1
            last_sync = np.where(j >= 0, sync_end[np.maximum(j, 0)] if len(sync_end) else 0, -np.inf)
            e0 = np.minimum(np.maximum(first_op, np.where(last_sync > h0, last_sync, -np.inf)), h1)
            starts += [g0[ok], e0[ok]]
            ends += [g1[ok], h1[ok]]
        if not starts:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(starts), np.concatenate(ends)
    return cached(trace, f"break_gaps:{config}", make)


def compile_gaps(trace, config: BreakConfig = BreakConfig()) -> tuple[np.ndarray, np.ndarray]:
    """The break gaps that are breaks: none when a single compiled frame is called again and
    again (a sampler loop), whose gaps are the loop's own Python."""
    frames = cached(trace, "frame_ids", lambda: frame_ids(trace))
    if len(frames) == 1:
        return np.zeros(0), np.zeros(0)
    return break_gaps(trace, config)


# -- recompilation: compile work after warm-up ------------------------------------------------
#: Compile work on the host: Dynamo's frame conversion, AOTAutograd and Inductor (python frames
#: of traces recorded with_stack) and the `... (dynamo_timed)` ranges PyTorch records around
#: each compile phase (`_compile.compile_inner`, `compile_fx_inner`, `CUDAGraphNode.record`
#: in ../shared's xDiT capture traces).  The same calls `measures.warmup.WARMUP_HOST` counts as
#: one-off start-up; in a later step they are a recompile.
COMPILE_WORK = (r"torch/_dynamo/convert_frame\.py|torch/_inductor/(compile_fx|codecache"
                r"|standalone_compile|async_compile)\.py|torch/_functorch/aot_autograd\.py"
                r"|\(dynamo_timed\)$")


def after_first_step(trace) -> float | None:
    """Where the steady state begins for compilation: the end of the first profiler step (the
    first call of a compiled model compiles it there), None without two or more steps (no
    later step to tell a recompile from the first compile)."""
    if len(trace.steps) < 2:
        return None
    first = min(trace.steps, key=lambda s: s.start_us)
    return float(first.end_us)


def recompile_rows(trace) -> np.ndarray:
    """Compile-work rows (`COMPILE_WORK`) that start after the first profiler step, in time
    order."""
    def make():
        start = after_first_step(trace)
        if start is None:
            return np.zeros(0, np.int64)
        rows = rows_named(trace, COMPILE_WORK, (Kind.CPU_OP, Kind.USER_ANNOTATION,
                                                Kind.PYTHON_FUNCTION))
        return rows[trace.ts[rows] >= start]
    return cached(trace, "recompile_rows", make)


def recompiled_frames(trace) -> list[str]:
    """`Torch-Compiled Region: F/C` names with C > 0 (frame F compiled again) that first run
    after the first profiler step: the regions the recompiles produced."""
    start = after_first_step(trace)
    if start is None:
        return []
    rows = rows_named(trace, FORWARD, (Kind.CPU_OP, Kind.USER_ANNOTATION))
    out = []
    for c in np.unique(trace.name[rows]).tolist():
        m = FRAME.match(trace.names[c])
        if m and int(m.group(2)) > 0 and trace.ts[rows[trace.name[rows] == c]].min() >= start:
            out.append(trace.names[c])
    return sorted(out)


#: The GPU idle right after a compile span that is still the compile's: the compiled code's
#: guards, first launches and first-call set-up (Triton kernels launched in 0.1-1 ms in the
#: real compiled traces of ../shared).  Longer waits after it are some other cause's.
RELAUNCH_US = 2000.0


def recompile_intervals(trace) -> tuple[np.ndarray, np.ndarray]:
    """Where a recompile holds the GPU up: each compile span after the first step, to the end
    of the GPU idle gap it ends in (the compiled code's first launches come only after it),
    at most `RELAUNCH_US` past the span."""
    def make():
        rows = recompile_rows(trace)
        if not len(rows):
            return np.zeros(0), np.zeros(0)
        s, e = merged_intervals(trace.ts[rows], trace.end[rows])
        return s, through_resume(trace, e, RELAUNCH_US)
    return cached(trace, "recompile_intervals", make)
