"""nn.DataParallel: one process drives several GPUs, serialising replicate, scatter and gather.

Mechanism: every step `DataParallel.forward` broadcasts every parameter and buffer from the
first GPU to the others (replicate), splits the batch and copies the pieces over (scatter),
runs the replicas in Python threads that share one GIL (parallel_apply) and copies the outputs
back to the first GPU (gather); the backward reduces the gradients onto it again
(`BroadcastBackward` / `ReduceAddCoalesced`).  One host thread does this serially while the GPUs
wait, and the first GPU carries the loss and optimizer for all.  Evidence: `DataParallel.forward`
and the torch.nn.parallel frames and backward nodes (`measures.dataparallel.DP_HOST`) in a trace
with GPU work on two or more devices, and the copies/broadcasts to the other GPUs launched
inside them.  Anchor: the TensorBoard profiler plugin's recommendation "DataParallel -> use
DistributedDataParallel" (it flagged any DataParallel use); PyTorch's documentation recommends
DDP over DataParallel even on one node.

Time lost (the idle account's `dataparallel` mechanism, before the communication mechanisms):
the time inside those host spans during which no GPU of the trace computes, the serial part
DDP would run in parallel processes (its broadcasts included, when they are NCCL kernels).
Conservative: the extra load on the first GPU is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import pattern_lost
from ..measures.dataparallel import (cross_device_copies, dp_forward_rows, dp_rows,
                                     gpu_devices)
from ..measures.signals import cached, count_in, fmt_us, ramp, union_in
from ..trace import Trace
from ..windows import Windows
from ._registry import IdleCause, register_pattern
from .base import AntiPattern, Measures
from .proof import Proof, event_rows, in_runs, longest_first


@dataclass(frozen=True)
class DataParallelConfig:
    """Thresholds on the GPU idle inside DataParallel's serial work (share of a window), as
    graph_break's (TraceLens flags GPU idle over 15% of the time)."""

    idle_lo: float = 0.02
    idle_hi: float = 0.20


class DataParallel(AntiPattern):
    id = "dataparallel"
    title = "nn.DataParallel: one process drives several GPUs (serial replicate/scatter/gather)"
    mechanism = "one process replicates the model, scatters and gathers every step; the GPUs wait"
    amount = ("n_forwards",)
    fix = """\
Replace DataParallel by DistributedDataParallel, one process per GPU:

    # train.py, started with: torchrun --nproc_per_node=4 train.py
    import os, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = model.cuda(local_rank)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=per_gpu_bs, sampler=sampler, num_workers=8,
                        pin_memory=True)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ...

Each process keeps its own replica (no per-step broadcast), loads its own batch (no scatter)
and all-reduces gradients overlapped with the backward.  Lightning: `Trainer(strategy="ddp")`;
Accelerate: `accelerate launch train.py`."""
    letter = "V"
    color = "#999933"
    short = "DP"
    account = IdleCause("dataparallel")
    signature = ("`DataParallel.forward` with replicate/scatter/gather (torch/nn/parallel) or "
                 "`BroadcastBackward`/`ReduceAddCoalesced` nodes, kernels and copies on several "
                 "GPUs from one process, the GPUs idle while the host replicates.")

    def __init__(self, config: DataParallelConfig = DataParallelConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        rows = dp_rows(t)
        lost = pattern_lost(windows, self.id)
        dp_us = union_in(windows, t.ts[rows], t.end[rows])
        fw = dp_forward_rows(t)
        copies = cached(t, "dp_copies", lambda: cross_device_copies(t))
        # the mechanism's idle is there only where DataParallel's host work (and the relaunch
        # after it) is: a window it covers scores, whether or not the host span reaches into it
        score = ramp(lost / windows.width_us, c.idle_lo, c.idle_hi)
        return {"score": score, "lost_us": lost, "dp_us": dp_us,
                "n_forwards": count_in(windows, t.ts[fw]),
                "n_copies": count_in(windows, t.ts[copies])}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        n = int(m["n_forwards"][idx].sum())
        host = float(m["dp_us"][idx].sum())
        idle = float(m["lost_us"][idx].sum())
        nc = int(m["n_copies"][idx].sum())
        devs = len(gpu_devices(t))
        text = (f"{n} DataParallel forward(s) driving {devs} GPUs from one process; its "
                f"replicate/scatter/gather host work takes {fmt_us(host)} with {nc} copies or "
                f"broadcasts to the other GPUs, and no GPU computes for {fmt_us(idle)} of it")
        return text, {"n_forwards": n, "n_devices": devs, "dp_host_us": round(host, 1),
                      "n_cross_device_copies": nc, "gpu_idle_us": round(idle, 1)}

    def supported(self, numbers: dict) -> bool:
        return numbers.get("time_lost_us", 0.0) > 0 and numbers.get("dp_host_us", 0.0) > 0

    def proof_events(self, trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
        """DataParallel's host spans, then its copies to the other GPUs, longest first."""
        rows = dp_rows(trace)
        rows = rows[in_runs(trace, runs)[rows]]
        copies = cross_device_copies(trace)
        copies = copies[in_runs(trace, runs)[copies]]
        both = np.concatenate((longest_first(trace, rows), longest_first(trace, copies)))
        return ("DataParallel's replicate/scatter/gather and its copies to the other GPUs",
                event_rows(trace, both, limit))


PATTERN = register_pattern(DataParallel())
