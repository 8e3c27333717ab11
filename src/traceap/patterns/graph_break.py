"""torch.compile graph breaks: compiled regions split by eager code, with the GPU idle between.

Mechanism: each graph break ends a compiled region (`Torch-Compiled Region: N/M`,
`CompiledFunction`), runs eager ops (and Python) and enters another region; the breaks cost
Dynamo guard checks, lost fusion, and GPU gaps while the host runs the eager part.  Evidence:
gaps between consecutive compiled regions of the same direction (forward regions, or backward
`CompiledFunctionBackward` regions) inside one step, and the GPU idle time in them.  Distinct
frame ids N in `Torch-Compiled Region: N/M` confirm a break; the same frame called in a loop
(a diffusion sampler calling the compiled UNet) is not one.  Gaps are measured on the GPU:
from the last kernel a region launched to the first kernel of the next region.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..idle import pattern_lost
from ..trace import Kind, merged_intervals
from ..windows import Windows
from .base import AntiPattern, Measures
from .signals import (cached, count_in, fmt_us, ramp, rows_named, sum_in,
                      union_in)

FORWARD = r"^Torch-Compiled Region|^CompiledFunction$"
BACKWARD = r"^CompiledFunctionBackward$"
FRAME = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
OPTIMIZER = r"^Optimizer\.step|^## optimizer ##"
TRITON = r"^triton_|^triton__"


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
            rows = rows_named(trace, pattern, (Kind.CPU_OP, Kind.USER_ANNOTATION))
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


class GraphBreak(AntiPattern):
    id = "graph_break"
    title = "torch.compile graph breaks (eager code between compiled regions)"
    mechanism = "several compiled regions per step with eager ops and GPU gaps between them"
    fix = """\
Find and remove the breaks, then make the compiler refuse new ones:

    explanation = torch._dynamo.explain(model)(example_inputs)
    print(explanation.graph_break_count, explanation.break_reasons)
    # or: TORCH_LOGS="graph_breaks" python train.py

Typical causes and fixes: `.item()` / `print` / Python `if tensor:` inside forward (keep it a
tensor, use torch.where / torch.cond); unsupported third-party calls (wrap them with
`torch.compiler.disable` outside the hot path or register a custom op); data-dependent shapes
(`torch._dynamo.config.capture_scalar_outputs = True`, `mark_dynamic`).  Once clean, use
`torch.compile(model, fullgraph=True)` so a new break is an error, not a slowdown."""

    def __init__(self, config: BreakConfig = BreakConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        g0, g1 = break_gaps(t, c)
        frames = cached(t, "frame_ids", lambda: frame_ids(t))
        weight = (c.weight_frames if len(frames) >= 2 else
                  c.weight_one_frame if len(frames) == 1 else c.weight_unknown)
        gap_us = union_in(windows, g0, g1)
        idle = pattern_lost(windows, self.id)
        n_breaks = count_in(windows, g0)
        # Eager kernels launched in the gaps: the work that escaped the compiler.
        k = t.rows(Kind.KERNEL)
        if len(k) and len(g0):
            order = np.argsort(g0)
            s0, s1 = g0[order], g1[order]
            j = np.searchsorted(s0, t.ts[k], side="right") - 1
            inside = (j >= 0) & (t.ts[k] < s1[np.maximum(j, 0)])
            eager = k[inside]
        else:
            eager = k[:0]
        n_eager = count_in(windows, t.ts[eager])
        # Idle GPU in a gap is the cost; eager kernels filling a gap are the escaped work.
        eager_share = ramp(gap_us / windows.width_us, c.gap_lo, c.gap_hi)
        score = np.maximum(ramp(idle / windows.width_us, c.idle_lo, c.idle_hi), eager_share) * weight
        return {"score": score, "lost_us": idle, "gap_us": gap_us, "n_breaks": n_breaks,
                "n_eager_kernels": n_eager,
                "eager_kernel_us": sum_in(windows, t.ts[eager], t.dur[eager])}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        frames = sorted(cached(t, "frame_ids", lambda: frame_ids(t)))
        n = int(m["n_breaks"][idx].sum())
        gap = float(m["gap_us"][idx].sum())
        idle = float(m["lost_us"][idx].sum())
        ne = int(m["n_eager_kernels"][idx].sum())
        fr = (f"{len(frames)} compiled frames" if frames else "compiled regions "
              "(CompiledFunction)")
        text = (f"{fr}; {n} gaps between compiled regions totalling {fmt_us(gap)}, with "
                f"{ne} eager kernels in them and the GPU idle {fmt_us(idle)}")
        return text, {"n_frames": len(frames), "n_gaps": n, "gap_us": round(gap, 1),
                      "eager_kernels": ne, "gpu_idle_us": round(idle, 1)}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_gaps", 0) > 0


PATTERN = GraphBreak()
