"""torch.compile recompiling after warm-up: Dynamo and Inductor compile again in a later step.

Mechanism: a compiled frame's guards fail (a new input shape, a new dtype, a Python value that
changed, `model.train()`/`eval()` flips) and Dynamo traces, AOTAutograd partitions and Inductor
generates and compiles the frame again, on the host, inside the training loop: hundreds of ms to
seconds in which nothing is launched and the GPU drains and idles.  The new graph runs as
`Torch-Compiled Region: F/C` with a compile id C > 0 (frame F compiled C + 1 times).  Evidence:
compile work (`measures.compile_regions.COMPILE_WORK`: `torch/_dynamo/convert_frame.py`,
`torch/_inductor/compile_fx.py` frames, `... (dynamo_timed)` ranges) that starts after the
first profiler step, and the `F/C` regions with C > 0 that first run there.  The first step's
compilation is one-off warm-up (`traceap.idle`'s `warmup`); the same work later is not.
Anchor: PyTorch's `torch._dynamo.config.recompile_limit` (8) exists because recompiles are a
steady-state cost; `TORCH_LOGS=recompiles` names their guard.

Priority over graph_break: a graph break is eager code *between* compiled regions of one step
(the `compile_gaps` mechanism); a recompile is compile work, and the idle account gives the
GPU idle under it to this pattern's `recompilation` mechanism first (before warm-up, which names
the same calls, and before compile_gaps), so a gap filled by a recompile is never a break too.
Time lost: that mechanism's idle time (the compile span and the relaunch after it, at most
`RELAUNCH_US` past it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import pattern_lost
from ..measures.compile_regions import recompile_rows, recompiled_frames
from ..measures.signals import cached, count_in, fmt_us, ramp, union_in
from ..trace import Trace
from ..units import plural
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first, named_rows


@dataclass(frozen=True)
class RecompileConfig:
    """Thresholds on the GPU idle a recompile causes (share of a window), as graph_break's
    (`BreakConfig.idle_lo/idle_hi`: TraceLens flags GPU idle over 15% of the time)."""

    idle_lo: float = 0.02
    idle_hi: float = 0.20


class Recompilation(AntiPattern):
    id = "recompilation"
    title = "torch.compile recompiling after warm-up (compile work in later steps)"
    mechanism = "Dynamo/Inductor compile again in a steady-state step while the GPU idles"
    amount = ("n_compile_spans",)
    fix = """\
See why each recompile happens, then keep the guards stable:

    TORCH_LOGS="recompiles" python train.py      # prints the failed guard of each recompile

Varying input shapes (the last batch, multi-scale training, variable image sizes): pad or
bucket them to a few fixed sizes, drop the ragged last batch, or mark the varying dimension
dynamic once so one graph serves all sizes:

    loader = DataLoader(dataset, batch_size=bs, drop_last=True)
    torch._dynamo.mark_dynamic(images, 0)        # batch dimension varies
    model = torch.compile(model, dynamic=True)   # or: dynamic shapes everywhere

Python values read in forward (a changing float, `self.training`, a step counter) become
guards: pass them as tensors, and compile the train and eval models separately."""
    letter = "R"
    color = "#332288"
    terminal_color = "#7A6FD0"
    short = "REC"
    account = IdleCause("recompilation")
    signature = ("torch.compile compiling after the first step: `torch/_dynamo/convert_frame.py` / "
                 "`compile_fx` / `(dynamo_timed)` host spans inside a later ProfilerStep, "
                 "`Torch-Compiled Region: F/C` with C > 0, the GPU idle meanwhile.")

    def __init__(self, config: RecompileConfig = RecompileConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        rows = recompile_rows(t)
        lost = pattern_lost(windows, self.id)
        compile_us = union_in(windows, t.ts[rows], t.end[rows])
        n = count_in(windows, t.ts[_outer(t, rows)])
        # the mechanism's idle is only under compile work after the first step and the relaunch
        # after it: a window it covers scores
        score = ramp(lost / windows.width_us, c.idle_lo, c.idle_hi)
        return {"score": score, "lost_us": lost, "compile_us": compile_us, "n": n}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        n = int(m["n"][idx].sum())
        comp = float(m["compile_us"][idx].sum())
        idle = float(m["lost_us"][idx].sum())
        frames = cached(t, "recompiled_frames", lambda: recompiled_frames(t))
        regions = (f"; recompiled regions {', '.join(frames[:4])}" if frames else "")
        text = (f"{plural(n, 'compile span')} after the first profiler step taking "
                f"{fmt_us(comp)} on the host{regions}; the GPU idle {fmt_us(idle)} meanwhile")
        return text, {"n_compile_spans": n, "compile_us": round(comp, 1),
                      "recompiled_regions": list(frames), "gpu_idle_us": round(idle, 1)}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_compile_spans", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """Compile spans after the first step, longest first."""
        rows = recompile_rows(trace)
        rows = rows[in_runs(trace, runs)[rows]]
        if not len(rows):
            rows = named_rows(trace, in_runs(trace, runs),
                              lambda n: "Torch-Compiled Region" in n or "TorchDynamo" in n)
            return ("Compiled regions (no compile work after the first step here)",
                    event_rows(trace, rows, limit))
        return ("Dynamo/Inductor compile work after the first profiler step, longest first",
                event_rows(trace, longest_first(trace, rows), limit))


def _outer(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The compile rows not nested in another compile row (one per recompile)."""
    if not len(rows):
        return rows
    o = rows[np.argsort(trace.ts[rows], kind="stable")]
    reach = np.maximum.accumulate(trace.end[o])
    keep = np.ones(len(o), dtype=bool)
    keep[1:] = trace.ts[o[1:]] >= reach[:-1]
    return o[keep]


PATTERN = register_pattern(Recompilation())
