"""NCCL collectives as c10d issues them (the `c10d::` > `record_param_comms` > `nccl:` nesting
and the kernel on the NCCL or compute stream), DDP's gradient buckets, and DDP's finalize."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ops
from ._state import COMPUTE_STREAM, RunState


@dataclass
class _Reduction:
    """DDP's gradient buckets during one backward: what is filled, sent and left for later."""

    stream: int                     # where the all-reduces run
    first_cap: float                # bytes: DDP's first bucket
    cap: float                      # bytes: every later bucket (bucket_cap_mb)
    filled: float = 0.0
    n_buckets: int = 0
    pending: list[float] = field(default_factory=list)   # all-reduces after backward
    spans: list[tuple[float, float]] = field(default_factory=list)  # NCCL kernels sent

    @property
    def limit(self) -> float:
        """The size at which the current bucket is sent."""
        return self.first_cap if self.n_buckets == 0 else self.cap


class Communication(RunState):
    """c10d collectives, blocking (work.wait) collectives, bucket copies and DDP's finalize."""

    #: per collective: c10d op, annotation, `Collective name`, bus-traffic factor per rank count
    _COLL = {"AllReduce": ("c10d::allreduce_", "nccl:all_reduce", "allreduce", lambda n: 2 * (n - 1) / n),
             "Broadcast": ("c10d::broadcast_", "nccl:broadcast", "broadcast", lambda n: 1.0),
             "AllGather": ("c10d::_allgather_base_", "nccl:_all_gather_base", "_allgather_base",
                           lambda n: (n - 1) / n),
             "ReduceScatter": ("c10d::_reduce_scatter_base_", "nccl:_reduce_scatter_base",
                               "_reduce_scatter_base", lambda n: (n - 1) / n)}

    def allreduce(self, tid: int, nbytes: float, stream: int) -> tuple[float, float]:
        """One bucket: c10d::allreduce_ > record_param_comms > nccl:all_reduce > NCCL kernel."""
        return self.collective(tid, "AllReduce", nbytes, stream)

    def collective(self, tid: int, coll: str, nbytes: float, stream: int,
                   dt: str = "fp32") -> tuple[float, float]:
        """One NCCL collective as c10d issues it: event wait on the NCCL stream, then the kernel."""
        cfg, e = self.cfg, self.eng
        p = cfg.platform
        c10d, ann_name, coll_name, traffic = self._COLL[coll]
        nel = int(nbytes // (4 if dt == "fp32" else 1))
        ranks = str(list(range(cfg.world_size)))
        comms = {"Process Group Name": "0", "Process Group Description": "default_pg",
                 "Process Group Ranks": ranks, "Group size": cfg.world_size,
                 "In msg nelems": nel, "Out msg nelems": nel,
                 "dtype": "Float" if dt == "fp32" else "Byte",
                 "In split size": "[]", "Out split size": "[]", "Collective name": coll_name}
        outer = e.begin(tid, c10d, cat="cpu_op", gpu=False)
        e.clock[tid] += e.host(6.0)
        rpc = e.begin(tid, "record_param_comms", cat="cpu_op", gpu=False,
                      args={**comms, "Global rank start": 0, "Global rank stride": 1})
        # c10d's host path per collective (work object, events, watchdog) is ~100-200 us in
        # real traces (record_param_comms 190 us in the A100 DDP trace): tiny buckets pay it often
        e.clock[tid] += e.host(25.0)
        ann = e.begin(tid, ann_name)
        e.clock[tid] += e.host(40.0)
        if stream != COMPUTE_STREAM:
            e.runtime(tid, "cudaEventRecord", e.rt_cost(2.5), ann.ext)
            e.runtime(tid, "cudaStreamWaitEvent", e.rt_cost(2.0), ann.ext)
        ws = cfg.world_size
        bus = traffic(ws) * nbytes / (p.nccl_bus_gbs * 1e3)
        # ring latency (2(n-1) steps) + waiting for the slowest peer to arrive
        lat = 8.0 + 2 * (ws - 1) * p.nccl_hop_us + float(self.rng.exponential(25.0))
        dur = bus + lat
        proto = ops.nccl_protocol(nbytes, cfg.nccl_ll_max, cfg.nccl_ll128_max)
        name = ops.nccl_kernel(coll, dt if coll != "Broadcast" else "i8", proto, self.nccl_version)
        s, en = e.launch(tid, name, dur, stream, ann.ext, 544, 96, 87568,
                         not_before=e.stream_free(COMPUTE_STREAM), extra_args=comms)
        e.clock[tid] += e.host(35.0)
        e.end(ann)
        e.clock[tid] += e.host(20.0)
        e.end(rpc)
        e.clock[tid] += e.host(4.0)
        e.end(outer)
        return s, en

    def blocking_collective(self, tid: int, coll: str, nbytes: float,
                            dt: str = "fp32") -> tuple[float, float]:
        """A collective whose result the next compute op needs (work.wait() on the stream):
        the compute stream waits for it, the host does not.  Returns its (start, end)."""
        e = self.eng
        s, en = self.collective(tid, coll, nbytes, self.nccl_stream, dt)
        e.runtime(tid, "cudaStreamWaitEvent", e.rt_cost(2.0), e.next_ext())
        e.free[COMPUTE_STREAM] = max(e.stream_free(COMPUTE_STREAM), en)
        return s, en

    def ddp_finalize(self) -> None:
        """DDP's finalize: gradients become views of the reduced buckets, and the compute
        stream waits for the communication stream."""
        e = self.eng
        main = e.main
        n_par = sum(1 for x in self.layers if x.params_m > 0)
        for _ in range(min(n_par, 400)):
            x, t = e.next_ext(), e.clock[main]
            e.clock[main] += e.host(2.0)
            for child in ("aten::narrow", "aten::slice", "aten::view"):
                e.cpu_event(main, child, e.clock[main], e.host(1.5), e.next_ext())
                e.clock[main] += e.host(2.0)
            e.cpu_event(main, "torch.distributed.ddp.reducer::copy_bucket_to_grad", t,
                        e.clock[main] - t, x)
            e.clock[main] += e.host(1.0)
        e.runtime(main, "cudaStreamWaitEvent", e.rt_cost(2.0), e.next_ext())
        e.free[COMPUTE_STREAM] = max(e.stream_free(COMPUTE_STREAM), e.stream_free(self.nccl_stream))

    def copy_into_bucket(self, tid: int, nbytes: float) -> None:
        """DDP copies each gradient into its flat bucket (gradient_as_bucket_view=False)."""
        e = self.eng
        x, t = e.next_ext(), e.clock[tid]
        e.clock[tid] += e.host(4.0)
        e.memcpy(tid, "DtoD (Device -> Device)", nbytes, self.cfg.platform.hbm_gbs * 0.4,
                 COMPUTE_STREAM, x, blocking=False)
        e.clock[tid] += e.host(2.0)
        e.cpu_event(tid, "aten::copy_", t, e.clock[tid] - t, x)
