"""no_pin_memory: batches copied to the GPU from pageable memory.

Mechanism: `batch.to("cuda")` from pageable (not pinned) memory is staged by the driver
through a bounce buffer: `cudaMemcpyAsync` blocks the host for the whole transfer and the
copy runs at pageable bandwidth (3-8 GB/s instead of ~20-25), on the compute stream, so the
compute waits for it and nothing new is launched meanwhile.  Label: where the GPU's compute
idles around the copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..dialect import Factory
from ...patterns._registry import register_piece
from ...trace import CopyKind, Kind, MemKind
from .base import Base, Block, Instance, Launch, Plan, Unusable, copy_args, emit_call, op_launch

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "no_pin_memory"


@dataclass(frozen=True)
class Config:
    """Sizes of one planted input copy."""

    #: The input batch (MB): 32x3x224x224 fp32 = 19 MB; 8-64 images of 224-512 px.
    batch_mb: tuple = (4.0, 64.0)
    #: Pageable HtoD bandwidth (GB/s): 3-8 on PCIe 3/4 hosts (NVIDIA bandwidthTest, pageable;
    #: traceap.synth.platforms uses 6-9).
    pageable_gbs: tuple = (3.0, 8.0)
    #: The targets tensor copied after the batch (bytes).
    target_bytes: tuple = (256.0, 65536.0)
    max_backlog_share: float = 0.25
    max_instances: int = 12


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """Blocking pageable copies of the batch at the start of every step with a small backlog."""
    thread = base.main_key
    instances = []
    for T in base.batch_points(config.max_instances, "copy batches before"):
        nbytes = rng.uniform(*config.batch_mb) * 1e6
        gbs = rng.uniform(*config.pageable_gbs)
        gpu_us = nbytes / (gbs * 1e3)
        if base.tl.backlog_at([T])[0] > config.max_backlog_share * gpu_us:
            continue
        block = Block(T=T, thread=base.tl.main_thread)
        calls = []
        for b in (nbytes, rng.uniform(*config.target_bytes)):
            dur = max(b / (gbs * 1e3), 1.0)
            calls.append((op_launch(block, ["aten::to", "aten::_to_copy", "aten::copy_"], 14.0,
                                    Launch(rt_dur=10.0, stream=base.tl.compute_stream,
                                           gpu_dur=dur, blocking=True), 5.0), b, dur))

        def emit(f: Factory, calls=calls):
            spans = []
            name = base.dialect.memcpy("HtoD", pinned=False)
            for call, b, dur in calls:
                spans += emit_call(f, base, call, thread,
                                   memcpy={"name": name, "args": copy_args(b, dur)})
            return spans

        instances.append(Instance([block], emit, min_idle_us=0.3 * gpu_us))
    if not instances:
        raise Unusable("every step starts with more GPU work queued than a batch copy takes")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    m = tr.rows(Kind.GPU_MEMCPY)
    m = m[(tr.copy_kind[m] == CopyKind.HTOD) & (tr.copy_src[m] == MemKind.PAGEABLE) & (tr.launch[m] >= 0)]
    if not len(m):
        return
    rt = tr.launch[m]
    blocking = tr.end[rt] >= tr.end[m] - 1.0
    m = m[blocking]
    for s0, s1 in c.steps or [(tr.span[0], tr.span[1])]:
        inside = m[(tr.ts[m] >= s0) & (tr.ts[m] < s1)]
        total = tr.dur[inside].sum()
        if total < max(cfg.pageable_min_us, cfg.pageable_step_share * (s1 - s0)):
            continue
        idle = sum((lambda g: (g[1] - g[0]).sum())(c.idle_in(tr.ts[r], tr.end[r])) for r in inside.tolist())
        if idle >= 0.5 * total:
            for r in inside.tolist():
                yield tr.ts[r], tr.end[r]


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
