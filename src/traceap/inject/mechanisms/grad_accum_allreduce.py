"""grad_accum_allreduce: an accumulation micro-step that all-reduces before the real one.

Mechanism: the step becomes the last of two accumulation micro-steps.  At its start the
previous micro-step ends: its wrapper forward (`DistributedDataParallel.forward`, the
micro-step's marker) and, without `no_sync`, its backward's all-reduce round (`c10d::allreduce_`
> `record_param_comms` > `nccl:all_reduce` > launch, NCCL AllReduce kernels on the NCCL stream)
followed by DDP's end-of-backward wait (`cudaEventRecord` + `cudaStreamWaitEvent`: the compute
stream waits for the round) and the micro-step's `loss.item()` (logging), which therefore waits
for the round too.  It is planted right before the step's own wrapper forward (else its first
kernel launch): the next micro-step.  A DDP base's round is cloned from its own kernels in that step
(names, durations, sizes); a base without one gets 25 MB buckets (DDP's `bucket_cap_mb`) of 20-400
MB of gradients, and its own final micro-step (a marker, then the final round launched beside
the forward, not labelled: that communication is needed).  The planted micro-step's compute is
not planted (the fix keeps it).  Label: where the GPU waits while the host waits for the round,
and later waits it caused up to the round's length (what the fix gives back; not the drain of a
deep queue by the `loss.item()`, which `no_sync` keeps) and up to the idle the plant added after
it, net (`inject.core._net_caps`: where the host's delay only moves the base's own gaps, or the
round runs where the base idled anyway, the gaps that grew are offset by gaps that shrank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...measures.accumulation import WRAPPER_FORWARD, allreduce_kernels, launch_time
from ...measures.compile_regions import OPTIMIZER
from ...measures.signals import rows_named
from ...patterns._registry import register_piece
from ...trace import Kind
from ..dialect import Factory
from ..physics import Barrier
from .base import (ALLREDUCE_HOST_US, Base, Block, Busy, Instance, Plan, Unusable, collective,
                   distributed_info, emit_call, emit_collective, item_sync, world_size)

if TYPE_CHECKING:
    from ..natural import NaturalConfig, NaturalContext

PATTERN = "grad_accum_allreduce"
FORWARD = "DistributedDataParallel.forward"


@dataclass(frozen=True)
class Config:
    """Sizes of a planted micro-step's all-reduce round (bases without their own)."""

    #: All gradients (MB): ResNet-50 ~100 MB fp32, ViT-B ~350 MB.
    grads_mb: tuple = (20.0, 400.0)
    #: DDP's default bucket size (`bucket_cap_mb=25`).
    bucket_mb: float = 25.0
    max_buckets: int = 16
    bus_gbs: tuple = (15.0, 150.0)
    #: The wrapper's forward entry before its compute (us): DDP's pre-forward hooks.
    marker_us: tuple = (20.0, 60.0)
    max_instances: int = 8


def plan(base: Base, rng: np.random.Generator, config: Config = Config()) -> Plan:
    """A previous micro-step's all-reduce round at the start of each step with an optimizer."""
    world = world_size(base, rng)
    code, key = base.nccl_stream()
    compute = base.tl.compute_stream
    tr = base.doc.trace
    on_main = base.doc.thread[base.doc.row_event] == base.tl.main_thread
    opt = rows_named(tr, OPTIMIZER)
    opt_at = base.start_rel(opt[on_main[opt]])
    fw_at = base.start_rel(rows_named(tr, WRAPPER_FORWARD))
    ar = allreduce_kernels(tr)
    ar_at = base.rel(launch_time(tr, ar))
    k = tr.rows(Kind.KERNEL)
    k = k[~tr.is_nccl[k] & (tr.launch[k] >= 0)]
    k = k[on_main[tr.launch[k]]]
    launches = np.sort(base.start_rel(tr.launch[k]))
    thread = base.main_key
    instances = []
    for _row, lo, hi, kids in base.steps_or_stretches():
        if len(instances) >= config.max_instances:
            break
        o = opt_at[(opt_at > lo) & (opt_at < hi)]
        if not len(o) or not len(kids):
            continue
        o = float(o.min())
        first = float(base.start_rel(kids).min())
        own = ar[(ar_at >= first) & (ar_at < o)]
        own_fw = fw_at[(fw_at >= first) & (fw_at < o)]
        ddp = bool(len(own) and len(own_fw))
        # Where the round costs what it costs: right before the step's first kernel launch after
        # its wrapper forward began (the compute waits for the round there), not at the step's
        # start, where the host may prepare the batch with the GPU idle anyway.  The base's
        # wrapper forward then starts the planted micro-step, and a new marker after the round
        # the base's own.
        since = float(own_fw.min()) if ddp else first
        go = launches[(launches >= since) & (launches < o)]
        if not len(go):
            continue
        T = float(go.min())
        if ddp:
            own = own[np.argsort(tr.ts[own])]
            nel = tr.comm_nelems[own]
            round_ = [(tr.names[tr.name[r]], float(tr.dur[r]),
                       float(nel[i]) * 4 if nel[i] > 0 else config.bucket_mb * 1e6)
                      for i, r in enumerate(own)]
            final = None
        else:
            round_ = _buckets(base, rng, config, world)
            final = _buckets(base, rng, config, world)
        block = Block(T=T, thread=base.tl.main_thread)
        marker = None if ddp else block.add(Busy(rng.uniform(*config.marker_us)))
        calls = [collective(block, code, dur, rng.uniform(*ALLREDUCE_HOST_US), compute)
                 for _name, dur, _nb in round_]
        record = block.add(Busy(4.0))
        wait = block.add(Busy(3.0))
        block.add(Barrier(compute, calls[-1].steps[1]))
        # the micro-step's `loss.item()` (logging): behind DDP's wait, it waits for the round
        item = item_sync(base, block, 4.0, 8.0, 10.0)
        marker_b = block.add(Busy(rng.uniform(*config.marker_us)))
        final_calls = [] if final is None else [
            collective(block, code, dur, rng.uniform(*ALLREDUCE_HOST_US), None)
            for _name, dur, _nb in final]

        def emit(f: Factory, marker=marker, calls=calls, round_=round_, record=record, wait=wait,
                 item=item, marker_b=marker_b, final_calls=final_calls, final=final):
            if marker is not None:
                f.host(Kind.USER_ANNOTATION, FORWARD, marker.t0, marker.t1, thread)
            spans = []
            for c, (name, _dur, nb) in zip(calls, round_):
                spans += emit_collective(f, base, c, thread, nb, world, key,
                                         kernel_name=name or None)
            ext = f.new_ext()
            f.runtime(base.dialect.rt("EventRecord"), record.t0, record.t1, thread, ext)
            f.runtime(base.dialect.rt("StreamWaitEvent"), wait.t0, wait.t1, thread, ext)
            emit_call(f, base, item, thread, memcpy={
                "name": base.dialect.memcpy("DtoH", pinned=False), "args": {"bytes": 4}})
            f.host(Kind.USER_ANNOTATION, FORWARD, marker_b.t0, marker_b.t1, thread)
            for c, (_name, _dur, nb) in zip(final_calls, final or ()):
                emit_collective(f, base, c, thread, nb, world, key)
            return spans  # the planted round only: the final one is needed communication

        # `no_sync` removes the round, not the micro-step's `loss.item()`: behind a deep queue
        # that sync drains it and what follows starts late by the drain, a wait the fix keeps.
        # The host gets back at most the round's length, so that is all the wait it caused
        # later that the label may claim.
        instances.append(Instance([block], emit, label="span",
                                  max_caused_us=sum(dur for _name, dur, _nb in round_)))
    if not instances:
        raise Unusable("no step with an optimizer step (Optimizer.step / ## optimizer ##) after "
                       "its first op: nothing to accumulate into")
    return Plan(PATTERN, instances, distributed_info(base, world))


def _buckets(base: Base, rng: np.random.Generator, config: Config, world: int) -> list:
    """(kernel name or '', duration us, bytes) of DDP's buckets of a drawn gradient size."""
    total = rng.uniform(*config.grads_mb) * 1e6
    n = int(min(config.max_buckets, np.ceil(total / (config.bucket_mb * 1e6))))
    bw = rng.uniform(*config.bus_gbs) * 1e3
    sizes = [total / n] * n
    return [("", nb * 2 * (world - 1) / world / bw, nb) for nb in sizes]


# -- the natural label: where a real trace shows the pattern by itself ----------------------
#: An all-reduce of a non-final micro-step counts where no compute kernel runs beside it for
#: >= 200 us (the graph-break label's gap; DDP's last bucket leaves less exposed).
MIN_IDLE_US = 200.0


def natural_label(c: NaturalContext, cfg: NaturalConfig):
    """Compute idle under the all-reduces of non-final accumulation micro-steps."""
    from ...measures.accumulation import accumulation
    yield from c.idle_under(accumulation(c.tr).wasted, MIN_IDLE_US)


register_piece("inject", PATTERN, plan)
register_piece("label", PATTERN, natural_label)
