"""unfused_optimizer: an optimizer step split into per-parameter kernels.

Mechanism: `torch.optim.SGD(..., foreach=False)` (or Adam's single-tensor path) runs
`_single_tensor_sgd`: per parameter, `aten::add_` (weight decay), `aten::mul_` + `aten::add_`
(momentum), `aten::add_` (the update), each one launch of a tiny elementwise kernel; the host
needs 10-30 us per launch and the kernel a few us, so the GPU waits between them.  Planted in
every step (after the first, where there are two or more) inside the trace's
`Optimizer.step#...` range, where the least GPU work is queued (at its first or its last op), or
at the step's last top-level op under a new `Optimizer.step#SGD.step` range when the trace
records none.  Kernel names are ATen's elementwise templates (the same on CUDA and ROCm).  Label:
from the first to the last per-parameter kernel (`Instance.label = "work"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.optimizer import optimizer_calls, per_parameter_runs
from ...patterns._registry import register_piece
from ...trace import Kind
from ..dialect import Factory
from .base import (NEST_US, Base, Block, Busy, Instance, Launch, Plan, Unusable, emit_call,
                   op_launch)

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "unfused_optimizer"

_EW = ("void at::native::vectorized_elementwise_kernel<4, at::native::{f}, at::detail::Array<char*, "
       "{n}> >(int, at::native::{f}, at::detail::Array<char*, {n}>)")
_MUL = "AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >"
#: The ops of `_single_tensor_sgd` with momentum and weight decay, per parameter, and the
#: kernel each launches (names as in the real V100 / A100 traces of tests/data).
SGD_OPS = (
    ("aten::add_", _EW.format(f="CUDAFunctor_add<float>", n=3)),                     # d_p += wd * p
    ("aten::mul_", _EW.format(f=_MUL, n=2)),                                         # buf *= momentum
    ("aten::add_", _EW.format(f="CUDAFunctor_add<float>", n=3)),                     # buf += d_p
    ("aten::add_", _EW.format(f="CUDAFunctor_add<float>", n=3)),                     # p -= lr * buf
)


@dataclass(frozen=True)
class Config:
    """Sizes of one planted single-tensor step."""

    #: Parameter tensors: ResNet-18 has 62, ResNet-50 161, ViT-B/16 152; per step, a share of
    #: them is planted (the rest of the step keeps the trace's own kernels).
    params: tuple = (24, 96)
    #: Host time per op (us): the aten op's dispatch + cudaLaunchKernel (8-20 us in the
    #: V100 / A100 traces of tests/data) and the Python loop between parameters.
    op_us: tuple = (6.0, 12.0)
    launch_us: tuple = (4.0, 8.0)
    python_us: tuple = (3.0, 10.0)
    #: One tiny elementwise kernel (us): 2-6 us for a few-MB tensor.
    kernel_us: tuple = (1.5, 6.0)
    max_instances: int = 12
    #: Skip a step whose optimizer starts with more GPU work queued than this share of the
    #: planted host time (as the no_pin_memory plant).
    max_backlog_share: float = 0.25


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """Per-parameter SGD launches inside every step's optimizer (after the first step)."""
    steps = base.steady_steps_or_stretches()
    if not steps:
        raise Unusable("no step or top-level work on the main thread to run an optimizer in")
    tr = base.doc.trace
    thread = base.tl.main_thread
    os_, oe, _ = optimizer_calls(tr)
    os_, oe = base.rel(os_), base.rel(oe)
    top = base.start_rel(base.top_rows(thread))
    ops = tr.rows(Kind.CPU_OP)
    ops = np.sort(base.start_rel(ops[base.doc.thread[base.doc.row_event[ops]] == thread]))
    instances = []
    for _row, lo, hi, kids in steps[:config.max_instances]:
        starts = np.sort(base.start_rel(kids)) if len(kids) else top[(top >= lo) & (top < hi)]
        if not len(starts):
            continue
        # inside the trace's own optimizer range (its first with ops): at its first or its
        # last op; else before the step's last top-level op, under a new range
        cand, wrap = np.zeros(0), True
        for a, b in zip(os_[(os_ >= lo) & (os_ < hi)], oe[(os_ >= lo) & (os_ < hi)]):
            cand = ops[(ops > a + NEST_US) & (ops < b)]
            if len(cand):
                wrap = False
                break
        if wrap:
            cand = starts[-1:]
        if not len(cand):
            continue
        cand = np.unique(np.r_[cand[0], cand[-1]])
        backlog = base.tl.backlog_at(cand)
        T = float(cand[int(np.argmin(backlog))])
        n_params = int(rng.integers(config.params[0], config.params[1] + 1))
        # Behind a deep GPU queue the launches hide (the kernels run back to back when the
        # queue drains): the plant would cost the GPU nothing here.
        if backlog.min() > config.max_backlog_share * n_params * len(SGD_OPS) * config.op_us[0]:
            continue
        block = Block(T=T, thread=thread)
        calls = []
        for _ in range(n_params):
            block.add(Busy(rng.uniform(*config.python_us)))
            for name, kernel in SGD_OPS:
                launch = Launch(rt_dur=rng.uniform(*config.launch_us),
                                stream=base.tl.compute_stream, gpu_dur=rng.uniform(*config.kernel_us))
                pre = rng.uniform(*config.op_us) * 0.7
                calls.append((op_launch(block, [name], pre, launch, 0.3 * pre), kernel))

        def emit(f: Factory, calls=calls, block=block, wrap=wrap):
            spans = []
            if wrap:
                f.host(Kind.USER_ANNOTATION, "Optimizer.step#SGD.step", block.t0, block.t1,
                       base.main_key)
            for call, kernel in calls:
                spans += emit_call(f, base, call, base.main_key,
                                   kernel={"name": kernel, "args": {"grid": [160, 1, 1],
                                                                    "block": [128, 1, 1]}})
            # one span: the first to the last per-parameter kernel (their gaps are the cost)
            return [(min(a for a, _ in spans), max(b for _, b in spans))]

        instances.append(Instance([block], emit, label="work"))
    if not instances:
        raise Unusable("no step with host work to run a per-parameter optimizer in, or every "
                       "step's optimizer runs behind a deep GPU queue")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Optimizer calls (`traceap.measures.optimizer`) with >= `cfg.optimizer_min_launches`
    per-parameter kernels of a median <= `cfg.optimizer_tiny_us`, whose GPU idles for at least half of the stretch from the first to
    the last of them: (start, end) intervals."""
    tr = c.tr
    for rows, _ in per_parameter_runs(tr, cfg.optimizer_min_launches):
        if float(np.median(tr.dur[rows])) > cfg.optimizer_tiny_us:
            continue
        a, b = float(tr.ts[rows].min()), float(tr.end[rows].max())
        gs, ge = c.idle_in(a, b)
        if b > a and (ge - gs).sum() >= 0.5 * (b - a):
            yield a, b


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
