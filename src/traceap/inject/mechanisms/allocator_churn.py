"""allocator_churn: cudaMalloc / cudaFree pairs inside steady-state steps.

Mechanism: `torch.cuda.empty_cache()` in the loop (or shapes that change every step) makes the
caching allocator give memory back and take it again: the first `cudaFree` waits for the device
to drain, each free and each `cudaMalloc` then blocks the host in the driver, so nothing is
launched and the GPU runs dry.  Planted in every profiler step after the first (the first is
where a real run's cache grows: warm-up), or without steps in the later stretches of the
trace's top-level work, where the GPU has the least work queued; the calls
keep the trace's API (cuda* / hip*), the mallocs sit under `aten::empty_strided` as the caching
allocator's do.  Label: where the GPU waits during the calls and the relaunch after them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.allocator import churn_calls
from ...patterns._registry import register_piece
from ...trace import Kind
from ..dialect import Factory
from .base import Base, Block, Busy, Instance, Plan, Sync, Unusable, loguniform

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "allocator_churn"


@dataclass(frozen=True)
class Config:
    """Sizes of one planted free/malloc round."""

    #: Blocks given back and taken again per step (empty_cache frees every cached segment:
    #: 2-13 hipFree per call in the MI300 capture traces of ../shared/traces).
    n_blocks: tuple = (2, 6)
    #: One cudaFree / hipFree once the device is idle (us): 145-810 in the MI300 traces.
    free_us: tuple = (120.0, 800.0)
    #: One cudaMalloc / hipMalloc (us): 10-290 on MI300, 40 us-11 ms in HTA's CUDA benchmarks.
    malloc_us: tuple = (60.0, 2000.0)
    #: The call's host overhead in aten::empty_strided around the malloc (us).
    op_us: float = 6.0
    max_instances: int = 12
    #: Without profiler steps: top-level work cut into this many stretches, planted in those
    #: starting after this share of the GPU span (the rule's start-up third, with a margin).
    stretches: int = 6
    after_share: float = 0.45


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """A free/malloc round in every step after the first, where the least GPU work is queued."""
    steps = base.step_spans()
    if len(steps) >= 2:
        steady = steps[1:]
    else:
        # Without steps the rule counts the calls after the first third of the GPU span: plant
        # in the stretches of top-level work that start well after it.
        tr = base.doc.trace
        g = tr.gpu_work_rows
        lo_g, hi_g = base.rel(tr.ts[g].min()), base.rel(tr.end[g].max())
        steady = [s for s in base.pseudo_steps(config.stretches)
                  if s[1] >= lo_g + config.after_share * (hi_g - lo_g)]
    thread = base.tl.main_thread
    instances = []
    for _row, lo, hi, kids in steady[:config.max_instances]:
        T = base.quietest_start(lo, hi, kids, thread)
        if T is None:
            continue
        n = int(rng.integers(config.n_blocks[0], config.n_blocks[1] + 1))
        block = Block(T=T, thread=thread)
        frees = [(block.add(Sync(stream=None, min_dur=2.0)),
                  block.add(Busy(loguniform(rng, *config.free_us))))]
        frees += [(block.add(Busy(loguniform(rng, *config.free_us))),) for _ in range(n - 1)]
        mallocs = [(block.add(Busy(config.op_us)), block.add(Busy(loguniform(rng, *config.malloc_us))),
                    block.add(Busy(config.op_us))) for _ in range(n)]

        def emit(f: Factory, frees=frees, mallocs=mallocs):
            key = base.main_key
            d = base.dialect
            for steps_ in frees:
                f.runtime(d.rt("Free"), steps_[0].t0, steps_[-1].t1, key, f.new_ext())
            for pre, call, post in mallocs:
                ext = f.new_ext()
                f.host(Kind.CPU_OP, "aten::empty_strided", pre.t0, post.t1, key, ext=ext)
                f.runtime(d.rt("Malloc"), call.t0, call.t1, key, ext)
            return []

        instances.append(Instance([block], emit, min_idle_us=100.0))
    if not instances:
        raise Unusable("no step after the first with host work to plant allocator calls in")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Steady-state allocator calls (`traceap.measures.allocator`: after the first profiler
    step and the warm-up ones) lasting >= `cfg.allocator_min_us`, during which the GPU runs no
    kernel for at least half of the call: (start, end) intervals."""
    from ...idle import measure
    tr = c.tr
    calls, empty = churn_calls(tr, measure(tr).warmup_steps)
    rows = np.concatenate((calls, empty))
    for r in rows[tr.dur[rows] >= cfg.allocator_min_us].tolist():
        gs, ge = c.idle_in(tr.ts[r], tr.end[r])
        if (ge - gs).sum() >= 0.5 * tr.dur[r]:
            yield tr.ts[r], tr.end[r]


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
