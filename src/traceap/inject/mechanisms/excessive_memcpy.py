"""excessive_memcpy: `.item()` / `.cpu()` calls inside the step, each a copy and a sync.

Mechanism: every `.item()` copies a scalar to pageable host memory and synchronises the
stream: the host waits until all queued GPU work has run, then the GPU waits until the host
launches again.  A loop of them (logging each loss term, metrics on the GPU tensors) drains
the queue again and again; larger `.cpu()` copies of outputs add transfer time.  Label:
where the GPU idles during the burst.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..dialect import Factory
from ...patterns._registry import register_piece
from .base import Base, Block, Instance, Plan, Unusable, copy_args, emit_call, item_sync

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "excessive_memcpy"


@dataclass(frozen=True)
class Config:
    """Sizes of one planted burst."""

    #: `.item()` calls per burst: a dict of 8-32 loss / metric terms logged every step.
    items: tuple = (8, 32)
    #: Python between two calls (us): dict iteration, formatting, an eager op (~10-40 us).
    python_us: tuple = (15.0, 40.0)
    #: Larger `.cpu()` copies per burst and their size (MB), at pageable DtoH bandwidth.
    cpu_copies: tuple = (0, 3)
    cpu_copy_mb: tuple = (0.5, 8.0)
    pageable_gbs: tuple = (6.0, 10.0)
    max_instances: int = 12


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """A burst of read-backs at a point inside every step (after its first half)."""
    steps = base.steps_or_stretches()
    if not steps:
        raise Unusable("no step or top-level work on the main thread")
    thread = base.main_key
    instances = []
    for _row, lo, hi, kids in steps[: config.max_instances]:
        starts = base.start_rel(kids)
        cand = starts[(starts > lo + 0.3 * (hi - lo))] if len(kids) else np.zeros(0)
        if not len(cand):
            continue
        T = float(rng.choice(cand))
        block = Block(T=T, thread=base.tl.main_thread)
        gbs = rng.uniform(*config.pageable_gbs)
        calls = [(item_sync(base, block, 4.0, gbs, rng.uniform(*config.python_us)), 4.0)
                 for _ in range(int(rng.integers(config.items[0], config.items[1] + 1)))]
        for _ in range(int(rng.integers(config.cpu_copies[0], config.cpu_copies[1] + 1))):
            b = rng.uniform(*config.cpu_copy_mb) * 1e6
            calls.append((item_sync(base, block, b, gbs, rng.uniform(*config.python_us),
                                    name="aten::to"), b))

        def emit(f: Factory, calls=calls, gbs=gbs):
            spans = []
            name = base.dialect.memcpy("DtoH", pinned=False)
            for call, b in calls:
                dur = call.steps[1].gpu_dur
                spans += emit_call(f, base, call, thread,
                                   memcpy={"name": name, "args": copy_args(b, dur)})
            return spans

        instances.append(Instance([block], emit, min_idle_us=5.0 * len(calls)))
    if not instances:
        raise Unusable("no step has work in its second part to read values back after")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
#: Runtime calls that wait on the GPU only on the GPU side (never block the host).
_GPU_SIDE = ("cudaStreamWaitEvent", "hipStreamWaitEvent")


def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    rt = np.flatnonzero(tr.is_sync)
    rt = rt[~np.isin(tr.names_array[tr.name[rt]], _GPU_SIDE)]
    if not len(rt):
        return
    for s0, s1 in c.steps or [(tr.span[0], tr.span[1])]:
        inside = rt[(tr.ts[rt] >= s0) & (tr.ts[rt] < s1)]
        gaps = []
        for r in inside.tolist():
            gs, ge = c.idle_in(tr.end[r] - 1.0, min(s1, tr.end[r] + 10_000.0))
            if len(gs) and gs[0] <= tr.end[r] + 1.0 and ge[0] - gs[0] >= cfg.sync_idle_us:
                gaps.append((gs[0], ge[0]))
        total = sum(b - a for a, b in gaps)
        if len(gaps) >= cfg.syncs_per_step and total >= cfg.sync_step_share * (s1 - s0):
            yield from gaps


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
