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

import numpy as np

from ..idle import pattern_lost
from ..measures.compile_regions import BreakConfig, break_gaps, frame_ids
from ..measures.signals import cached, count_in, fmt_us, ramp, sum_in, union_in
from ..trace import Kind, Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, named_rows


class GraphBreak(AntiPattern):
    id = "graph_break"
    title = "torch.compile graph breaks (eager code between compiled regions)"
    mechanism = "several compiled regions per step with eager ops and GPU gaps between them"
    amount = ("n_gaps",)
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
    letter = "G"
    color = "#CC79A7"
    short = "GB"
    account = IdleCause("compile_gaps")
    signature = ("torch.compile split into pieces: several `Torch-Compiled Region` / "
                 "`CompiledFunction` / `TorchDynamo Cache Lookup` entries, eager aten ops and GPU "
                 "gaps between triton_* kernels.")

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

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """Compiled regions and Dynamo guards, longest first."""
        rows = named_rows(trace, in_runs(trace, runs),
                          lambda n: ("Torch-Compiled Region" in n or "CompiledFunction" in n
                                     or "TorchDynamo" in n or "Graph break" in n))
        return ("Compiled regions and Dynamo guards (many short regions = graph breaks)",
                event_rows(trace, rows, limit))


PATTERN = register_pattern(GraphBreak())
