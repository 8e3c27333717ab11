"""small_nccl_kernels: gradients all-reduced one small tensor at a time.

Mechanism: without DDP's bucketing (a hand-written loop of `dist.all_reduce(p.grad)`, or
`bucket_cap_mb` set tiny) the backward issues tens to hundreds of all-reduces of a few KB:
each costs ~30-80 us of host time and a 5-40 us latency-bound NCCL kernel, so the run is
paid in launch latency, not bandwidth.  Label: the span of each dense run of collectives.
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

PATTERN = "small_nccl_kernels"


@dataclass(frozen=True)
class Config:
    """Sizes of one planted run."""

    #: Collectives per run (one per parameter tensor of a small / medium model).
    count: tuple = (20, 200)
    #: Kernel time of one tiny all-reduce (us): NCCL LL latency 5-40 us intra-node.
    kernel_us: tuple = (5.0, 40.0)
    #: Message size (bytes): a bias or norm weight, a few KB.
    bytes: tuple = (512.0, 65536.0)
    host_us: tuple = ALLREDUCE_HOST_US
    max_instances: int = 8


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """A dense run of tiny all-reduces inside the backward of every step."""
    code, key = base.nccl_stream()
    world = world_size(base, rng)
    instances = []
    for _row, lo, hi, _kids in base.steps_or_stretches()[: config.max_instances]:
        pts, thread = late_points(base, lo, hi)
        if not len(pts):
            continue
        T = float(rng.choice(pts))
        block = Block(T=T, thread=thread)
        n = int(rng.integers(config.count[0], config.count[1] + 1))
        calls = []
        for _ in range(n):
            nbytes = float(rng.uniform(*config.bytes))
            calls.append((collective(block, code, rng.uniform(*config.kernel_us),
                                     rng.uniform(*config.host_us), base.tl.compute_stream), nbytes))
        tkey = base.thread_key(thread)

        def emit(f: Factory, calls=calls, tkey=tkey):
            spans = []
            for call, nbytes in calls:
                spans += emit_collective(f, base, call, tkey, nbytes, world, key)
            return [(spans[0][0], spans[-1][1])]

        instances.append(Instance([block], emit, label="span"))
    if not instances:
        raise Unusable("no backward (or late step) boundary to issue collectives at")
    return Plan(PATTERN, instances, distributed_info(base, world))


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    k = c.nccl_k[np.argsort(tr.ts[c.nccl_k], kind="stable")]
    if len(k) < cfg.tiny_run_min:
        return
    nbytes = np.where(tr.comm_nelems[k] >= 0, tr.comm_nelems[k] * 4.0, 0.0)
    tiny = (tr.dur[k] <= cfg.tiny_nccl_us) & (nbytes <= cfg.tiny_nccl_bytes)
    start, end = tr.ts[k], tr.end[k]
    run = []
    for i in range(len(k) + 1):
        ok = i < len(k) and tiny[i] and (not run or start[i] - end[run[-1]] <= cfg.tiny_run_gap_us)
        if ok:
            run.append(i)
            continue
        if len(run) >= cfg.tiny_run_min:
            yield start[run[0]], end[run[-1]]
        run = [i] if i < len(k) and tiny[i] else []


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
