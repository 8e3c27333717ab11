"""cpu_tensor_init: tensors created on the host, then copied to the GPU, inside the step.

Mechanism: `torch.zeros(shape).cuda()`, `torch.arange(n).to(device)`, `torch.randn(...).to(device)`:
an ATen factory op fills the tensor on the CPU (no kernel under it), then `aten::to` >
`aten::_to_copy` > `aten::copy_` uploads it from pageable memory, the launch blocking for the
copy.  Planted in every step (after the first, where there are two or more; else in each
stretch of top-level work) where the GPU has the least work queued: 1-3 such tensors of
0.1-8 MB, each filled at the host speed of its factory, copied at pageable bandwidth on the
compute stream.  Label: where the GPU waits during them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.host_init import init_copies
from ...patterns._registry import register_piece
from ..dialect import Factory
from .base import (Base, Block, Busy, Instance, Launch, Plan, Unusable, copy_args, emit_call,
                   host_op, loguniform, op_launch)

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "cpu_tensor_init"

#: Factory op stacks and the host fill speed (GB/s) of each: memset-like fills run at memory
#: speed, a host normal RNG at 50-100 M floats/s.
FACTORY_OPS = (
    (["aten::zeros", "aten::zero_", "aten::fill_"], (2.0, 8.0)),
    (["aten::ones", "aten::fill_"], (2.0, 8.0)),
    (["aten::full", "aten::fill_"], (2.0, 8.0)),
    (["aten::arange"], (1.0, 4.0)),
    (["aten::randn", "aten::normal_"], (0.2, 0.4)),
)


@dataclass(frozen=True)
class Config:
    """Sizes of one planted host tensor and its upload."""

    #: Tensors made per step: masks, position ids, anchor grids, noise.
    per_step: tuple = (1, 3)
    #: Tensor size (MB): a 8x224x224 fp32 mask is 1.6 MB, 8x3x224x224 noise 4.8 MB.
    mb: tuple = (0.1, 8.0)
    #: Pageable HtoD bandwidth (GB/s): as the no_pin_memory plant.
    pageable_gbs: tuple = (3.0, 8.0)
    #: Python between the factory call and `.to(device)` (us).
    python_us: tuple = (3.0, 30.0)
    max_instances: int = 12


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """Host tensor creation + upload in every step, where the least GPU work is queued."""
    steps = base.steady_steps_or_stretches()
    if not steps:
        raise Unusable("no step or top-level work on the main thread to create tensors in")
    thread = base.tl.main_thread
    instances = []
    for _row, lo, hi, kids in steps[:config.max_instances]:
        T = base.quietest_start(lo, hi, kids, thread)
        if T is None:
            continue
        block = Block(T=T, thread=thread)
        calls = []
        copy_us = 0.0
        for _ in range(int(rng.integers(config.per_step[0], config.per_step[1] + 1))):
            names, fill = FACTORY_OPS[int(rng.integers(len(FACTORY_OPS)))]
            nbytes = loguniform(rng, *config.mb) * 1e6
            make = host_op(block, names, 5.0 + nbytes / (rng.uniform(*fill) * 1e3))
            block.add(Busy(rng.uniform(*config.python_us)))
            dur = max(nbytes / (rng.uniform(*config.pageable_gbs) * 1e3), 1.0)
            copy_us += dur
            upload = op_launch(block, ["aten::to", "aten::_to_copy", "aten::copy_"], 14.0,
                               Launch(rt_dur=10.0, stream=base.tl.compute_stream, gpu_dur=dur,
                                      blocking=True), 5.0)
            calls.append((make, upload, nbytes, dur))

        def emit(f: Factory, calls=calls):
            spans = []
            name = base.dialect.memcpy("HtoD", pinned=False)
            for make, upload, nbytes, dur in calls:
                emit_call(f, base, make, base.main_key)
                spans += emit_call(f, base, upload, base.main_key,
                                   memcpy={"name": name, "args": copy_args(nbytes, dur)})
            return spans

        instances.append(Instance([block], emit, min_idle_us=max(30.0, 0.3 * copy_us)))
    if not instances:
        raise Unusable("no step with host work to create tensors in")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Uploads of tensors just created on the host (`traceap.measures.host_init`) during which
    the GPU runs no kernel for at least half of the factory op and the upload together, the
    pair lasting >= `cfg.host_init_min_us`: (start, end) intervals."""
    tr = c.tr
    fac, op, cp = init_copies(tr)
    for f, o, k in zip(fac.tolist(), op.tolist(), cp.tolist()):
        a, b = float(tr.ts[f]), float(max(tr.end[o], tr.end[k]))
        if b - a < cfg.host_init_min_us:
            continue
        gs, ge = c.idle_in(a, b)
        if (ge - gs).sum() >= 0.5 * (b - a):
            yield a, b


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
