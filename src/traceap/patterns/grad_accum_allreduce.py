"""Gradient accumulation that all-reduces every micro-step (no `no_sync`).

Mechanism: with gradient accumulation, N micro-steps (forward + backward) add their gradients
before one optimizer step.  DistributedDataParallel all-reduces the gradients in every backward
unless the non-final micro-steps run under `model.no_sync()`, so N - 1 of the N all-reduce
rounds move data whose sum is only needed once: N x the communication, and DDP's end-of-backward
wait exposes each round's tail.  Evidence (`measures.accumulation`): between two optimizer steps
(`Optimizer.step#...`, `## optimizer ##`), two or more micro-steps (each starts at a
`DistributedDataParallel.forward` / `FullyShardedDataParallel.forward`) launch NCCL all-reduce
kernels.  Anchor: the TensorBoard profiler plugin suggested gradient accumulation when
communication exceeds 10% of the step, which only pays with `no_sync`; PyTorch's DDP docs
(`no_sync`), Lightning and Accelerate (`accelerator.accumulate`) skip the sync the same way.

Whose time it is: the all-reduces of the non-final micro-steps would not run at all with the
fix, so the idle account gives the GPU idle while they run (and no compute does) to this
pattern's `accum_allreduce` mechanism, placed before the other NCCL mechanisms
(nccl_blocks_compute_stream, small_nccl_kernels, nccl_compute_no_overlap); the final
micro-step's all-reduce stays theirs.  No microsecond is in two findings.  Conservative: the
part of a wasted all-reduce hidden under compute (bandwidth, SMs it takes) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import pattern_lost
from ..measures.accumulation import accumulation
from ..measures.signals import count_in, fmt_us, ramp, sum_in
from ..trace import Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


@dataclass(frozen=True)
class AccumConfig:
    """Thresholds on the GPU idle under wasted all-reduces (share of a window), as the
    exposed-communication rule's (TraceLens: exposed communication over 5% of GPU time)."""

    idle_lo: float = 0.02
    idle_hi: float = 0.20


class GradAccumAllreduce(AntiPattern):
    id = "grad_accum_allreduce"
    title = "Gradient accumulation all-reduces every micro-step (no no_sync)"
    mechanism = "each accumulation micro-step all-reduces gradients that only the last one needs"
    amount = ("n_wasted_allreduces",)
    fix = """\
All-reduce only on the micro-step that ends the accumulation:

    from contextlib import nullcontext
    for i, (images, targets) in enumerate(loader):
        last = (i + 1) % accum_steps == 0
        with nullcontext() if last else model.no_sync():   # model: DistributedDataParallel
            loss = criterion(model(images), targets) / accum_steps
            loss.backward()
        if last:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

Lightning does this for you with `Trainer(accumulate_grad_batches=N)`; Accelerate with
`Accelerator(gradient_accumulation_steps=N)` and `with accelerator.accumulate(model):`.
FSDP: `model.no_sync()` too (at the cost of unsharded gradients in memory)."""
    letter = "K"
    color = "#882255"
    terminal_color = "#CC6699"
    short = "GAA"
    account = IdleCause("accum_allreduce")
    signature = ("two or more `DistributedDataParallel.forward` micro-steps per `Optimizer.step`, "
                 "each launching NCCL AllReduce kernels (ncclKernel_AllReduce / "
                 "ncclDevKernel_AllReduce), the GPU idle while the extra ones run.")

    def __init__(self, config: AccumConfig = AccumConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        acc = accumulation(t)
        w = acc.wasted
        lost = pattern_lost(windows, self.id)
        n = count_in(windows, t.ts[w])
        comm = sum_in(windows, t.ts[w], t.dur[w])
        # the mechanism's idle is only under the wasted all-reduces (a long one spans windows
        # its start is not in) and the relaunch after them: a window it covers scores
        score = ramp(lost / windows.width_us, c.idle_lo, c.idle_hi)
        return {"score": score, "lost_us": lost, "n": n, "comm_us": comm}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        acc = accumulation(windows.trace)
        n = int(m["n"][idx].sum())
        comm = float(m["comm_us"][idx].sum())
        idle = float(m["lost_us"][idx].sum())
        text = (f"{acc.micro_steps:g} all-reducing micro-steps per optimizer step "
                f"({acc.n_updates} optimizer step(s)); {n} all-reduce kernels of the non-final "
                f"micro-steps run {fmt_us(comm)}, {fmt_us(idle)} of it with no compute beside it")
        return text, {"micro_steps": acc.micro_steps, "n_updates": acc.n_updates,
                      "n_wasted_allreduces": n, "wasted_comm_us": round(comm, 1),
                      "gpu_idle_us": round(idle, 1)}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("n_wasted_allreduces", 0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """The all-reduces of non-final micro-steps, longest first."""
        w = accumulation(trace).wasted
        w = w[in_runs(trace, runs)[w]]
        return ("All-reduce kernels of non-final accumulation micro-steps (no_sync removes them)",
                event_rows(trace, longest_first(trace, w), limit))


PATTERN = register_pattern(GradAccumAllreduce())
