"""nccl_blocks_compute_stream: a collective issued on the compute stream.

Mechanism: an all-reduce launched on the current (compute) stream -- a custom
communication hook, `async_op=False` inside a `torch.cuda.stream(...)` mix-up, or a process
group created with the default stream -- runs in stream order with the kernels: every
kernel after it waits until the communication is done, nothing overlaps it.  Label: the
collective's span on the compute stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..dialect import Factory
from ...patterns._registry import register_piece
from .base import (ALLREDUCE_HOST_US, Base, Block, Instance, Plan, Unusable, collective,
                   distributed_info, emit_collective, late_points, world_size)

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "nccl_blocks_compute_stream"


@dataclass(frozen=True)
class Config:
    """Sizes of one planted collective."""

    #: Gradient bucket (MB): DDP's default bucket_cap_mb is 25; first bucket 1 MB.
    bucket_mb: tuple = (4.0, 100.0)
    #: All-reduce bus bandwidth (GB/s): ~10-20 over PCIe, 100-200 over NVLink (nccl-tests).
    bus_gbs: tuple = (15.0, 150.0)
    #: Collectives per step on the compute stream.
    count: tuple = (1, 2)
    max_instances: int = 8


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """One or two all-reduces on the compute stream in every step's backward."""
    world = world_size(base, rng)
    compute = base.tl.compute_stream
    key = base.compute
    instances = []
    for _row, lo, hi, _kids in base.steps_or_stretches()[: config.max_instances]:
        pts, thread = late_points(base, lo, hi)
        if not len(pts):
            continue
        k = int(rng.integers(config.count[0], config.count[1] + 1))
        for T in np.sort(rng.choice(pts, size=min(k, len(pts)), replace=False)):
            nbytes = rng.uniform(*config.bucket_mb) * 1e6
            # ring all-reduce moves 2 (n - 1) / n of the buffer over the slowest link
            gpu_us = nbytes * 2 * (world - 1) / world / (rng.uniform(*config.bus_gbs) * 1e3)
            block = Block(T=float(T), thread=thread)
            call = collective(block, compute, gpu_us, rng.uniform(*ALLREDUCE_HOST_US), None)
            tkey = base.thread_key(thread)

            def emit(f: Factory, call=call, nbytes=nbytes, tkey=tkey):
                return emit_collective(f, base, call, tkey, nbytes, world, key)

            instances.append(Instance([block], emit, label="span"))
    if not instances:
        raise Unusable("no backward (or late step) boundary to issue a collective at")
    return Plan(PATTERN, instances, distributed_info(base, world))


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    if c.compute_stream is None:
        return
    k = c.nccl_k[(tr.stream[c.nccl_k] == c.compute_stream) & (tr.dur[c.nccl_k] >= cfg.blocking_nccl_min_us)]
    comp_start = np.sort(tr.ts[c.compute_k[tr.stream[c.compute_k] == c.compute_stream]])
    for r in k.tolist():
        # only where compute is queued behind it on the same stream
        j = np.searchsorted(comp_start, tr.end[r])
        if j < len(comp_start):
            yield tr.ts[r], tr.end[r]


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
