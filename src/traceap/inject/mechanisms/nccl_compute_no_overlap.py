"""nccl_compute_no_overlap: the gradient all-reduce runs after the backward, exposed.

Mechanism: all gradients are all-reduced in one collective after `loss.backward()` returns
(no DDP hooks, or `no_sync` until the end), on the NCCL stream; the optimizer's kernels wait
for it (`cudaStreamWaitEvent`), so the whole communication is on the critical path with no
compute to hide it.  Label: the collective's span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..dialect import Factory
from ..physics import Barrier
from ...patterns._registry import register_piece
from ...trace import merged_intervals
from .base import (ALLREDUCE_HOST_US, Base, Block, Busy, Instance, Plan, Unusable, collective,
                   distributed_info, emit_collective, world_size)

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "nccl_compute_no_overlap"
#: Names that start the optimizer step (torch.optim's record_function, fused/foreach ops).
OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#", "aten::_foreach_",
                      "aten::_fused_adam", "aten::_fused_sgd")


@dataclass(frozen=True)
class Config:
    """Sizes of one planted all-reduce."""

    #: All gradients at once (MB): ResNet-50 ~100 MB fp32, ViT-B ~350 MB.
    grads_mb: tuple = (20.0, 400.0)
    bus_gbs: tuple = (15.0, 150.0)
    max_instances: int = 8


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """One all-reduce of every gradient right before each step's optimizer."""
    world = world_size(base, rng)
    code, key = base.nccl_stream()
    compute = base.tl.compute_stream
    tr = base.doc.trace
    opt_codes = [i for i, n in enumerate(tr.names) if n.startswith(OPTIMIZER_PREFIXES)]
    opt_rows = np.flatnonzero(np.isin(tr.name, opt_codes)) if opt_codes else np.zeros(0, int)
    opt_rows = opt_rows[base.doc.thread[base.doc.row_event[opt_rows]] == base.tl.main_thread]
    opt_starts = base.start_rel(opt_rows)
    thread = base.main_key
    instances = []
    for _row, lo, hi, kids in base.steps_or_stretches()[: config.max_instances]:
        inside = opt_starts[(opt_starts > lo) & (opt_starts < hi)]
        if len(inside):
            T = float(inside.min())
        elif len(kids) >= 2:
            T = float(base.start_rel(kids[-1:])[0])  # the step's last top-level op
        else:
            continue
        nbytes = rng.uniform(*config.grads_mb) * 1e6
        gpu_us = nbytes * 2 * (world - 1) / world / (rng.uniform(*config.bus_gbs) * 1e3)
        block = Block(T=T, thread=base.tl.main_thread)
        call = collective(block, code, gpu_us, rng.uniform(*ALLREDUCE_HOST_US), compute)
        record = block.add(Busy(4.0))
        wait = block.add(Busy(3.0))
        block.add(Barrier(compute, call.steps[1]))

        def emit(f: Factory, call=call, nbytes=nbytes, record=record, wait=wait):
            spans = emit_collective(f, base, call, thread, nbytes, world, key)
            ext = f.new_ext()
            f.runtime(base.dialect.rt("EventRecord"), record.t0, record.t1, thread, ext)
            f.runtime(base.dialect.rt("StreamWaitEvent"), wait.t0, wait.t1, thread, ext)
            return spans

        instances.append(Instance([block], emit, label="span"))
    if not instances:
        raise Unusable("no step with an optimizer or two top-level ops to all-reduce before")
    return Plan(PATTERN, instances, distributed_info(base, world))


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    k = c.nccl_k
    if c.compute_stream is not None:
        k = k[tr.stream[k] != c.compute_stream]
    if not len(k):
        return
    ns, ne = merged_intervals(tr.ts[k], tr.end[k])
    for s, e in zip(ns, ne):
        gs, ge = c.idle_in(s, e)
        for a, b in zip(gs, ge):
            if b - a >= cfg.exposed_min_us:
                yield a, b


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
