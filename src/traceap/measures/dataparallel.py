"""nn.DataParallel's serial work: one process replicating the model to, scattering inputs to
and gathering outputs from several GPUs, every step.

Measurements of the trace, below both the dataparallel rule and the idle account
(`traceap.idle`'s `dataparallel` mechanism).  `DataParallel.forward` (its record_function)
holds the replicate (a broadcast of every parameter and buffer to each GPU), the scatter of the
inputs, the replicas' forwards in Python threads and the gather of their outputs; in the
backward, `BroadcastBackward` / `ReduceAddCoalesced` / `Gather`'s backward reduce and
scatter again.  With one GPU DataParallel calls the module directly: it only counts with GPU
work on two or more devices in the one trace.
"""

from __future__ import annotations

import numpy as np

from ..trace import Kind, merged_intervals
from .signals import HOST_KINDS, cached, rows_named, through_resume

#: DataParallel's host work: its record_function, the torch.nn.parallel frames of a with_stack
#: trace, and the backward nodes of its autograd Functions (torch/nn/parallel/_functions.py).
DP_HOST = (r"^DataParallel\.forward$"
           r"|torch/nn/parallel/(data_parallel|replicate|scatter_gather|comm|_functions)\.py"
           r"|^(autograd::engine::evaluate_function: )?(Broadcast|ReduceAddCoalesced|Gather"
           r"|Scatter)Backward\d*$")
#: Its forward (one call per step and model).
DP_FORWARD = r"^DataParallel\.forward$|torch/nn/parallel/data_parallel\.py\(\d+\): forward$"
#: The parts that are serial by construction (with_stack frames only).
DP_SERIAL = (r"torch/nn/parallel/(replicate\.py\(\d+\): replicate|scatter_gather\.py\(\d+\): "
             r"(scatter_kwargs|gather))$")


def gpu_devices(trace) -> np.ndarray:
    """The devices that ran GPU work (kernels, copies, memsets) in the trace."""
    g = trace.gpu_work_rows
    return np.unique(trace.device[g][trace.device[g] >= 0])


def dp_rows(trace) -> np.ndarray:
    """DataParallel's host rows (`DP_HOST`), none unless the trace drives two or more GPUs."""
    def make():
        if len(gpu_devices(trace)) < 2:
            return np.zeros(0, np.int64)
        return rows_named(trace, DP_HOST, HOST_KINDS)
    return cached(trace, "dp_rows", make)


def dp_forward_rows(trace) -> np.ndarray:
    """`DataParallel.forward` calls (of a trace that drives two or more GPUs)."""
    rows = dp_rows(trace)
    if not len(rows):
        return rows
    fw = rows_named(trace, DP_FORWARD, HOST_KINDS)
    return np.intersect1d(fw, rows)


#: The GPU idle right after DataParallel's host work that is still its own: the replicas'
#: and the base forward's first launches (as `compile_regions.RELAUNCH_US`).
RELAUNCH_US = 2000.0


def dp_intervals(trace) -> tuple[np.ndarray, np.ndarray]:
    """Where DataParallel's serial work can explain GPU idle: its host spans, each to where the
    GPU resumes after it (at most `RELAUNCH_US` later); the idle account counts only the time
    no GPU of the trace computes in them."""
    rows = dp_rows(trace)
    s, e = merged_intervals(trace.ts[rows], trace.end[rows])
    return s, through_resume(trace, e, RELAUNCH_US)


def cross_device_copies(trace) -> np.ndarray:
    """Copies and NCCL kernels on the devices other than the one running the most compute,
    launched inside DataParallel's host spans: the replicate's broadcasts, the scattered
    inputs."""
    rows = dp_rows(trace)
    if not len(rows):
        return rows
    devs = gpu_devices(trace)
    g = trace.gpu_work_rows
    comp = g[(trace.kind[g] == Kind.KERNEL) & ~trace.is_nccl[g]]
    busiest = devs[np.argmax([trace.dur[comp][trace.device[comp] == d].sum() for d in devs])]
    cand = g[(trace.device[g] != busiest)
             & ((trace.kind[g] == Kind.GPU_MEMCPY) | trace.is_nccl[g])]
    launch = trace.launch[cand]
    at = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)], trace.ts[cand])
    s, e = merged_intervals(trace.ts[rows], trace.end[rows])
    j = np.searchsorted(s, at, side="right") - 1
    inside = (j >= 0) & (at < e[np.maximum(j, 0)])
    return cand[inside]
