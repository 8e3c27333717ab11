"""single_process_dataloading: a `DataLoader(num_workers=0)` loads each batch in the training loop.

Mechanism: at every step start the main thread runs `_SingleProcessDataLoaderIter.__next__`
(dataset `__getitem__` for every sample, then `default_collate`'s `aten::stack`s) before it
can launch anything; the GPU, with little queued at a step boundary, idles for the whole
fetch.  Then the batch goes to the GPU (pinned, non-blocking: the copy itself is not the
problem here).  Label: where the GPU idles during the fetch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...trace import Kind
from ..dialect import Factory
from ...patterns._registry import register_piece
from .base import (Base, Block, Busy, Instance, Launch, NEST_US, Plan, Unusable, copy_args,
                   emit_call, host_op, loguniform, op_launch)

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "single_process_dataloading"
ANNOTATION = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
#: Python frames of a num_workers=0 fetch (torch/utils/data, PyTorch 2.x line numbers).
FRAMES = ("torch/utils/data/dataloader.py(631): __next__",
          "torch/utils/data/dataloader.py(675): _next_data",
          "torch/utils/data/_utils/fetch.py(51): fetch")


@dataclass(frozen=True)
class Config:
    """Sizes of one planted fetch."""

    #: Host time to load one batch in the main process (ms): ImageNet-style JPEG decode and
    #: augmentation take ~1-3 ms per image on one core (torchvision / Pillow-SIMD benchmarks),
    #: so 16-64 images ~20-150 ms; small in-memory datasets (CIFAR) ~2-5 ms per batch.
    stall_ms: tuple = (2.0, 60.0)
    #: Share of the fetch spent in default_collate's aten::stack (the rest is __getitem__).
    collate_share: tuple = (0.04, 0.12)
    #: Batch size on the wire (MB) and pinned HtoD bandwidth (GB/s, PCIe 4/5 x16 in practice).
    batch_mb: tuple = (2.0, 40.0)
    pinned_gbs: tuple = (18.0, 25.0)
    #: A stall shows on the GPU only where little work is queued: at most this share of it.
    max_backlog_share: float = 0.25
    #: At most this many steps get a planted fetch (long traces stay editable quickly).
    max_instances: int = 12


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """A fetch at the start of every step whose GPU backlog is small enough."""
    thread = base.main_key
    instances = []
    for T in base.batch_points(config.max_instances, "load batches before"):
        D = loguniform(rng, *config.stall_ms) * 1e3
        if base.tl.backlog_at([T])[0] > config.max_backlog_share * D:
            continue
        block = Block(T=T, thread=base.tl.main_thread)
        c = rng.uniform(*config.collate_share)
        fetch = block.add(Busy(D * (1 - c)))
        stacks = [host_op(block, ["aten::stack", "aten::cat"], D * c * share) for share in (0.85, 0.15)]
        nbytes = rng.uniform(*config.batch_mb) * 1e6
        gpu_us = nbytes / (rng.uniform(*config.pinned_gbs) * 1e3)
        copy = op_launch(block, ["aten::to", "aten::_to_copy", "aten::copy_"], 12.0,
                         Launch(rt_dur=8.0, stream=base.tl.compute_stream, gpu_dur=gpu_us), 4.0)

        def emit(f: Factory, fetch=fetch, stacks=stacks, copy=copy, nbytes=nbytes, gpu_us=gpu_us):
            t0, t1 = fetch.t0, stacks[-1].steps[-1].t1
            f.host(Kind.USER_ANNOTATION, ANNOTATION, t0, t1, thread)
            if base.dialect.with_stack:
                parent = None
                for d, name in enumerate(FRAMES):
                    pid = f.new_python_id()
                    f.host(Kind.PYTHON_FUNCTION, name, fetch.t0 + (d + 1) * NEST_US,
                           fetch.t1 - (d + 1) * NEST_US, thread,
                           args={"Python parent id": parent, "Python id": pid})
                    parent = pid
            for call in stacks:
                emit_call(f, base, call, thread)
            name = base.dialect.memcpy("HtoD", pinned=True)
            return emit_call(f, base, copy, thread,
                             memcpy={"name": name, "args": copy_args(nbytes, gpu_us)})

        instances.append(Instance([block], emit, min_idle_us=0.3 * D))
    if not instances:
        raise Unusable("every step starts with more GPU work queued than a batch fetch would "
                       "take: a stall there would not show")
    return Plan(PATTERN, instances)


# -- the natural label: where a real trace shows the pattern by itself ----------------------
def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Where a real trace shows this pattern by itself (`traceap label`; thresholds in
    `NaturalConfig`): (start, end) intervals."""
    tr = c.tr
    for r in c.rows_named("enumerate(DataLoader)#_SingleProcessDataLoaderIter").tolist():
        s, e = tr.ts[r], tr.end[r]
        if e - s < cfg.fetch_min_us:
            continue
        gs, ge = c.idle_in(s, e)
        if (ge - gs).sum() >= cfg.fetch_idle_share * (e - s):
            yield gs[0], ge[-1]


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
