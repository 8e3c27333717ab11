"""Unfused optimizer: `Optimizer.step` (or `zero_grad`) launching kernels parameter by parameter.

Mechanism: a single-tensor optimizer (`foreach=False`, or an optimizer without a foreach path)
launches one tiny elementwise kernel per parameter and per op (`aten::add_`, `mul_`,
`addcdiv_`, `lerp_`, `sqrt`: hundreds to thousands per step for a vision backbone), and
`zero_grad(set_to_none=False)` one fill per gradient.  Each kernel runs a few us; the host
needs 10-30 us to issue the next one, so the GPU spends the optimizer mostly waiting for
launches.  A foreach step runs the same arithmetic in a few `multi_tensor_apply` launches, a
fused one in one kernel (`traceap.measures.optimizer`).

Account: `BusyInefficient` (the GPU works, but in launch-bound slivers).  Time lost, stated
and conservative: per optimizer call with at least `min_launches` per-parameter kernels of a
tiny median length, the GPU idle between its first and last per-parameter kernel, each gap up
to `launch_gap_us` (the launch waits a foreach step removes; a longer gap is host work),
less what a foreach step would still leave (one gap of the median length per distinct
kernel name: its launches), and less every idle us the idle account gives to a pattern (a
`.item()` sync inside the step is `excessive_memcpy`'s, Python between launches
`cpu_bound`'s): no microsecond is lost twice.  The kernels' own time is not counted (a
foreach kernel moves the same bytes); gaps the host hides under a deep GPU queue are not idle
and cost nothing here.  Those gaps are launch-bound idle in the idle account (no pattern),
where the launch-bound note may mention them too.
Anchors: TorchTidy's "single-tensor optimizer" and "zero_grad without set_to_none" patterns;
nsys-ai flags at least 5 launches averaging under 10 us.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import MECHANISM_IDS, measure, pattern_of
from ..measures.gaps import idle_gaps
from ..measures.optimizer import optimizer_kernels, per_parameter_runs
from ..measures.signals import (cached, fmt_us, intersect, ramp, steady_from, subtract, sum_in,
                                union_in)
from ..trace import Trace
from ..windows import Windows
from ._registry import BusyInefficient, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs


@dataclass(frozen=True)
class OptimizerConfig:
    """Which optimizer calls are unfused, and the share of a window they must cost."""

    #: Per-parameter kernels in one optimizer call: nsys-ai flags at least 5 launches
    #: averaging under 10 us (a 4-parameter toy model's SGD step stays quiet below it).
    min_launches: int = 5
    #: ... whose median kernel is tiny (nsys-ai: launches averaging under 10 us; an update of a
    #: 100 MB tensor takes ~100 us on an A100): Shampoo's per-block matrix work is not this.
    tiny_kernel_us: float = 20.0
    #: A gap between two of them counts up to this (HTA: a launch delay over 100 us is an
    #: outlier); longer is host work of its own (a preconditioner on the CPU), not launching.
    launch_gap_us: float = 100.0
    #: As the host-blocking rules: 1% of a window starts to count, 10% scores in full.
    lost_lo: float = 0.01
    lost_hi: float = 0.10


class UnfusedOptimizer(AntiPattern):
    id = "unfused_optimizer"
    title = "Optimizer updates parameters one by one (no foreach / fused kernels)"
    mechanism = ("Optimizer.step / zero_grad launch tiny per-parameter kernels; the GPU waits "
                 "for each launch")
    amount = ("n_launches",)
    fix = """\
Update all parameters in a few multi-tensor kernels, and drop gradients instead of zeroing them:

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)    # one kernel per step
    # or foreach=True (SGD, Adam, AdamW, ...; the CUDA default since PyTorch 2.0 unless an
    # argument such as differentiable=True or a non-CUDA tensor turns it off)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    ...
    opt.zero_grad(set_to_none=True)   # the default since 2.0: no fill kernel per gradient

Custom optimizers: write the update with torch._foreach_* ops (torch._foreach_mul_,
torch._foreach_add_) over the parameter lists, or compile the step (torch.compile(opt.step))."""
    letter = "U"
    color = "#B15928"
    short = "UFO"
    account = BusyInefficient()
    signature = ("inside `Optimizer.step#...` / `Optimizer.zero_grad#...` many tiny elementwise "
                 "kernels (`vectorized_elementwise_kernel` add/mul/addcdiv/fill, a few us each) "
                 "launched one per parameter, with GPU gaps between them; no "
                 "`multi_tensor_apply_kernel` or fused optimizer kernel.")

    def __init__(self, config: OptimizerConfig = OptimizerConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        gs, ge, factor, rows = lost_gaps(t, c)
        gap_us = union_in(windows, gs, ge)
        lost = gap_us * factor
        score = ramp(lost / windows.width_us, c.lost_lo, c.lost_hi)
        return {"score": score, "lost_us": lost, "gap_us": gap_us,
                "n": sum_in(windows, t.ts[rows], np.ones(len(rows))),
                "kernel_us": sum_in(windows, t.ts[rows], t.dur[rows].astype(np.float64))}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        n = int(m["n"][idx].sum())
        kern = float(m["kernel_us"][idx].sum())
        gaps = float(m["gap_us"][idx].sum())
        runs = unfused_runs(t, self.config)
        _, _, multi = optimizer_kernels(t)
        text = (f"{n} per-parameter optimizer kernels in {len(runs)} optimizer calls "
                f"({fmt_us(kern / max(n, 1))} each on average, {fmt_us(kern)} in all); the GPU "
                f"idled {fmt_us(gaps)} between them waiting for launches"
                + ("" if multi.any() else "; no multi-tensor or fused kernel"))
        return text, {"n_launches": n, "n_calls": len(runs), "kernel_us": round(kern, 1),
                      "gap_us": round(gaps, 1), "multi_tensor_kernels": int(multi.sum())}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_launches", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """The first per-parameter kernels of the flagged optimizer calls, in time order."""
        rows = np.concatenate([r for r, _ in unfused_runs(trace, self.config)]
                              or [np.zeros(0, np.int64)])
        rows = rows[in_runs(trace, runs)[rows]]
        return ("Per-parameter optimizer kernels, in launch order",
                event_rows(trace, rows, limit))


def unfused_runs(trace: Trace, c: OptimizerConfig) -> list[tuple[np.ndarray, int]]:
    """The optimizer calls with at least `c.min_launches` per-parameter kernels whose median
    runs under `c.tiny_kernel_us` (`per_parameter_runs`: rows, distinct kernel names), in the
    steady state (the first step's optimizer makes its state parameter by parameter)."""
    first = steady_from(trace)
    return [(rows, n) for rows, n in per_parameter_runs(trace, c.min_launches)
            if float(np.median(trace.dur[rows])) <= c.tiny_kernel_us
            and float(trace.ts[rows].min()) >= first]


def lost_gaps(trace: Trace, c: OptimizerConfig) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """(starts, ends) of the GPU idle between the per-parameter kernels of each unfused
    optimizer call (less the idle a pattern already holds, each gap up to `c.launch_gap_us`),
    the share of it a foreach step would remove (see the module docstring), and the
    per-parameter kernel rows."""
    def make():
        runs = unfused_runs(trace, c)
        empty = np.zeros(0)
        if not runs:
            return empty, empty, 0.0, np.zeros(0, np.int64)
        acc = measure(trace)
        owned = [m for m in MECHANISM_IDS if pattern_of(m)]
        seg = [acc.segments(m) for m in owned]
        ps = np.concatenate([s for s, _ in seg]) if seg else empty
        pe = np.concatenate([e for _, e in seg]) if seg else empty
        g0, g1 = idle_gaps(trace)
        out_s, out_e, gaps, lost = [], [], 0.0, 0.0
        for rows, n_names in runs:
            lo, hi = float(trace.ts[rows].min()), float(trace.end[rows].max())
            s, e = intersect(g0, g1, np.array([lo]), np.array([hi]))
            s, e = subtract(s, e, ps, pe)
            e = np.minimum(e, s + c.launch_gap_us)
            if not len(s):
                continue
            # What a foreach step still leaves: one launch gap per distinct kernel.
            keep = n_names * float(np.median(e - s))
            total = float(np.sum(e - s))
            out_s.append(s)
            out_e.append(e)
            gaps += total
            lost += max(0.0, total - keep)
        if not out_s:
            return empty, empty, 0.0, np.concatenate([r for r, _ in runs])
        return (np.concatenate(out_s), np.concatenate(out_e), lost / max(gaps, 1e-9),
                np.concatenate([r for r, _ in runs]))
    return cached(trace, f"unfused_optimizer:gaps:{c!r}", make)


PATTERN = register_pattern(UnfusedOptimizer())
