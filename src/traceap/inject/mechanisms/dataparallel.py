"""dataparallel: nn.DataParallel's scatter and replicate at the start of every forward.

Mechanism: `DataParallel.forward` (its record_function) first scatters the batch: a piece of
the input is copied to each other GPU (`aten::to` > `aten::_to_copy` > `aten::copy_`,
`Memcpy PtoP (Device -> Device)`); then replicates the module: `broadcast_coalesced` sends
all parameters and buffers from the first GPU to the others (NCCL broadcast kernels on each
other device) and Python rebuilds every submodule for every GPU.  One host thread does this
serially before any replica launches its forward, so the GPU waits.  The trace then has
GPU work on several devices from one process.  Label: where the GPU waits.  The replicas'
forwards and the gather are not planted (the base's forward stands for the first replica's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...patterns._registry import register_piece
from ...trace import Kind
from ..dialect import Factory
from .base import (NEST_US, Base, Block, Busy, Instance, Launch, Plan, Unusable, copy_args,
                   emit_call, op_launch)

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "dataparallel"
#: The python frames of DataParallel.forward's serial parts (PyTorch 2.5 line numbers).
FORWARD_FRAME = "torch/nn/parallel/data_parallel.py(171): forward"
SCATTER_FRAME = "torch/nn/parallel/scatter_gather.py(61): scatter_kwargs"
REPLICATE_FRAME = "torch/nn/parallel/replicate.py(92): replicate"


@dataclass(frozen=True)
class Config:
    """Sizes of DataParallel's serial work per step."""

    #: GPUs driven by the one process (the node's GPUs).
    gpus: tuple = (2, 4, 8)
    #: Python replicating the module tree per step, as a share of the median step: DDP runs
    #: the same training 1.1-1.5x faster than DataParallel on one node (PyTorch's DDP notes and
    #: tutorial benchmarks), most of it the replicate; at least 1 ms, at most 100 ms.
    replicate_share: tuple = (0.08, 0.3)
    replicate_ms: tuple = (1.0, 100.0)
    #: Parameters and buffers broadcast to each other GPU (MB), over NVLink/PCIe (GB/s).
    params_mb: tuple = (20.0, 300.0)
    p2p_gbs: tuple = (20.0, 100.0)
    #: The input piece scattered to each other GPU (MB).
    chunk_mb: tuple = (1.0, 10.0)
    #: DataParallel.forward's own Python before the scatter (us).
    entry_us: tuple = (80.0, 300.0)
    max_instances: int = 8


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """Scatter and replicate before the first top-level op of every step."""
    thread = base.main_key
    d0 = int(base.compute[0])
    n_gpus = int(rng.choice(config.gpus))
    others = [d for d in range(max(n_gpus, d0 + 1) + 1) if d != d0][: n_gpus - 1]
    # a new stream on each other GPU: stream ids are the trace's own, unique over its devices
    top = max((int(s) for _d, s in base.doc.gpu_stream_keys if str(s).isdigit()), default=7)
    keys = {d: (d, top + 1 + i) for i, d in enumerate(others)}
    codes = {d: base.tl.n_streams + 1 + i for i, d in enumerate(others)}
    params = rng.uniform(*config.params_mb) * 1e6
    bw = rng.uniform(*config.p2p_gbs) * 1e3
    steps = base.steps_or_stretches()
    med = float(np.median([hi - lo for _r, lo, hi, _k in steps])) if steps else 0.0
    instances = []
    for T in base.batch_points(config.max_instances, "scatter and replicate before"):
        block = Block(T=T, thread=base.tl.main_thread)
        entry = block.add(Busy(rng.uniform(*config.entry_us)))
        chunk = rng.uniform(*config.chunk_mb) * 1e6
        scatter = [op_launch(block, ["aten::to", "aten::_to_copy", "aten::copy_"], 12.0,
                             Launch(rt_dur=8.0, stream=codes[d], gpu_dur=chunk / bw), 4.0)
                   for d in others]
        gap = block.add(Busy(4.0))  # between the scatter's and the replicate's frames
        rep_us = float(np.clip(rng.uniform(*config.replicate_share) * med,
                               *np.multiply(config.replicate_ms, 1e3)))
        # replicate broadcasts first, then rebuilds the modules in Python: the broadcasts run
        # under that Python (a model too big to broadcast in it is sent in the time there is)
        gpu_us = min(params / bw, 0.8 * rep_us)
        bcast = [block.add(Launch(rt_dur=7.0, stream=codes[d], gpu_dur=gpu_us)) for d in others]
        rep = block.add(Busy(rep_us))
        tail = block.add(Busy(20.0))

        def emit(f: Factory, entry=entry, scatter=scatter, gap=gap, rep=rep, bcast=bcast,
                 tail=tail, chunk=chunk):
            t0, t1 = entry.t0, tail.t1
            ext = f.new_ext()
            f.host(Kind.USER_ANNOTATION, "DataParallel.forward", t0, t1, thread, ext=ext)
            if base.dialect.with_stack:
                # frames enclose their ops, siblings apart: scatter [entry's end, the gap's
                # middle), replicate [the gap's middle, the tail)
                mid = 0.5 * (gap.t0 + gap.t1)
                top = f.new_python_id()
                f.host(Kind.PYTHON_FUNCTION, FORWARD_FRAME, t0 + NEST_US / 2, t1 - NEST_US / 2,
                       thread, args={"Python parent id": None, "Python id": top})
                for name, a, b in ((SCATTER_FRAME, entry.t1 - NEST_US / 2, mid - NEST_US / 2),
                                   (REPLICATE_FRAME, mid + NEST_US / 2, rep.t1 + NEST_US / 2)):
                    f.host(Kind.PYTHON_FUNCTION, name, a, b, thread,
                           args={"Python parent id": top, "Python id": f.new_python_id()})
            spans = []
            copy = "Memcpy DtoD (Device -> Device)" if base.dialect.amd else \
                "Memcpy PtoP (Device -> Device)"
            for d, call in zip(others, scatter):
                spans += emit_call(f, base, call, thread, memcpy={
                    "name": copy, "args": copy_args(chunk, chunk / bw), "stream_key": keys[d]})
            for d, st in zip(others, bcast):
                rt, corr = f.runtime(base.dialect.launch_name, st.t0, st.t1, thread, ext)
                op = f.gpu(Kind.KERNEL, _broadcast_kernel(base), st.gpu_t0, st.gpu_t1, keys[d],
                           corr, ext, {"grid": [8, 1, 1], "block": [512, 1, 1]})
                f.flows(rt, op, corr)
            return spans

        host = rep.dur + entry.dur
        instances.append(Instance([block], emit, min_idle_us=0.3 * host))
    if not instances:
        raise Unusable("no step or top-level work on the main thread to scatter before")
    return Plan(PATTERN, instances)


def _broadcast_kernel(base: Base) -> str:
    """broadcast_coalesced's NCCL kernel as this trace's NCCL / RCCL generation names it."""
    style = base.dialect.nccl_style
    if style == "rccl":
        return "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
    if style == "old":
        return "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
    return "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


# -- the natural label: where a real trace shows the pattern by itself ----------------------
#: A stretch inside DataParallel's host work counts when no compute kernel runs for >= 200 us
#: (the graph-break label's gap: launches and Python inside one forward leave less).
MIN_IDLE_US = 200.0


def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """GPU idle stretches inside DataParallel's host work of a multi-GPU trace."""
    from ...measures.dataparallel import dp_rows
    yield from c.idle_under(dp_rows(c.tr), MIN_IDLE_US)


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
