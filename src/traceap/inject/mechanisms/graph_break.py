"""graph_break: a torch.compile'd step split into several graphs by graph breaks.

Mechanism: the step's work runs as consecutive `Torch-Compiled Region: i/0` frames; at each
break Dynamo falls back to eager Python (the code it could not trace), often a
data-dependent `.item()` / `nonzero()` that copies to the host and synchronises, then looks
up the next frame in its cache (`TorchDynamo Cache Lookup`).  Meanwhile nothing is launched
and the GPU drains and idles.  Label: where the GPU idles at the breaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...trace import Kind
from ..dialect import Factory
from ...patterns._registry import register_piece
from .base import Base, Block, Busy, Instance, Plan, Unusable, emit_call, item_sync

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "graph_break"


@dataclass(frozen=True)
class Config:
    """Sizes of the planted breaks."""

    #: Compiled regions per step (so regions - 1 breaks).
    regions: tuple = (2, 4)
    #: Eager Python at a break (us): the untraced code plus re-entering a frame, 0.2-2 ms.
    eager_us: tuple = (200.0, 2000.0)
    #: `TorchDynamo Cache Lookup` (us): 22.5 us in ../shared's torch_compile_triton trace,
    #: up to ~100 us with many guards.
    lookup_us: tuple = (15.0, 100.0)
    #: Chance a break is data-dependent (an `.item()`-style sync).
    sync_chance: float = 0.6
    min_kids: int = 4
    max_instances: int = 12


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """Compiled regions over each step's top-level work, with eager breaks between them."""
    steps = base.steps_or_stretches()
    thread = base.main_key
    instances = []
    parent = base.doc.trace.parent
    for _row, lo, hi, kids in steps[: config.max_instances]:
        # regions wrap siblings only (ops of one parent: a python frame or the step), so a
        # region never cuts through a frame; take the parent with the most ops
        if len(kids):
            par = parent[kids]
            vals, counts = np.unique(par, return_counts=True)
            p0 = vals[counts.argmax()]
            kids = kids[par == p0]
            # an op that outlives its parent (a loader call running into the next step) would
            # carry its region across the parent's end
            if p0 >= 0:
                kids = kids[base.doc.trace.end[kids] <= base.doc.trace.end[p0]]
        if len(kids) < config.min_kids:
            continue
        n_reg = int(min(rng.integers(config.regions[0], config.regions[1] + 1), len(kids)))
        cuts = np.sort(rng.choice(np.arange(1, len(kids)), size=n_reg - 1, replace=False))
        runs = np.split(kids, cuts)
        breaks = []
        for k in range(1, len(runs)):
            T = float(base.start_rel(runs[k][:1])[0])
            block = Block(T=T, thread=base.tl.main_thread)
            eager = block.add(Busy(rng.uniform(*config.eager_us)))
            sync = (item_sync(base, block, 4.0, 8.0, 10.0) if rng.random() < config.sync_chance
                    else None)
            lookup = block.add(Busy(rng.uniform(*config.lookup_us)))
            breaks.append((block, eager, sync, lookup))
        region_rows = [(r[0], r[-1], f"Torch-Compiled Region: {k}/0") for k, r in enumerate(runs)]

        def emit(f: Factory, breaks=breaks, region_rows=region_rows):
            spans = []
            for block, eager, sync, lookup in breaks:
                if sync is not None:
                    name = base.dialect.memcpy("DtoH", pinned=False)
                    spans += emit_call(f, base, sync, thread,
                                       memcpy={"name": name, "args": {"bytes": 4}})
                f.host(Kind.CPU_OP, "TorchDynamo Cache Lookup", lookup.t0, lookup.t1, thread)
            return spans

        # every break must show: the GPU idles for at least a third of its eager Python
        min_idle = 0.3 * min(b[1].dur for b in breaks)
        instances.append(Instance([b[0] for b in breaks], emit, min_idle_us=min_idle,
                                  wrap=region_rows))
    if not instances:
        raise Unusable(f"no step has {config.min_kids} or more top-level ops to compile in pieces")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    r = c.rows_named("Torch-Compiled Region")
    if len(r) < 2:
        return
    r = r[np.argsort(tr.ts[r])]
    for a, b in zip(r[:-1].tolist(), r[1:].tolist()):
        s, e = tr.end[a], tr.ts[b]
        if e - s < cfg.break_gap_us:
            continue
        if c.step_of(s) != c.step_of(e):
            continue  # a step boundary between two regions is not a break
        gs, ge = c.idle_in(s, e)
        if (ge - gs).sum() >= 0.5 * (e - s):
            yield gs[0], ge[-1]


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
