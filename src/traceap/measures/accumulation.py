"""Gradient accumulation: micro-steps per optimizer step, and the all-reduces of each.

Measurements of the trace, below both the grad_accum_allreduce rule and the idle account
(`traceap.idle`'s `accum_allreduce` mechanism).  A micro-step starts at a data-parallel
wrapper's forward (`DistributedDataParallel.forward`, `FullyShardedDataParallel.forward`: their
record_functions) and runs to the next one or to the optimizer step (`Optimizer.step#...`,
`## optimizer ##`); the micro-steps between two optimizer steps accumulate into one update.
A micro-step "all-reduces" when an all-reduce (an NCCL/RCCL kernel whose name or launching op
says all-reduce) is launched in it.  With N > 1 such micro-steps before one optimizer step,
the all-reduces of the first N - 1 are wasted: only the sum at the last one is used
(`DistributedDataParallel.no_sync`).  A hand-written all-reduce loop without a wrapper's
forward marks no micro-steps and is not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Kind, merged_intervals
from .compile_regions import OPTIMIZER
from .signals import HOST_KINDS, cached, name_mask, rows_named, through_resume

#: The forward of a data-parallel wrapper: one per micro-step.
WRAPPER_FORWARD = r"^(DistributedDataParallel|FullyShardedDataParallel)\.forward$"
#: An all-reduce by its kernel's name (NCCL) or its launching op's (RCCL's generic kernel).
ALLREDUCE = r"(?i)all_?reduce"


@dataclass(frozen=True)
class Accumulation:
    """What the accumulation looks like in a trace."""

    #: Optimizer steps with two or more all-reducing micro-steps before them.
    n_updates: int
    #: All-reducing micro-steps per such optimizer step (median), 0 without any.
    micro_steps: float
    #: The all-reduce kernels of the non-final micro-steps (trace rows): the wasted ones.
    wasted: np.ndarray
    #: Every all-reduce kernel launched in a micro-step before an optimizer step.
    all_reduces: np.ndarray


def allreduce_kernels(trace) -> np.ndarray:
    """NCCL/RCCL all-reduce kernels (by their name, or their launching op's name)."""
    k = trace.rows(Kind.KERNEL)
    k = k[trace.is_nccl[k]]
    if not len(k):
        return k
    mask = name_mask(trace, ALLREDUCE)
    hit = mask[trace.name[k]]
    # the launching op (record_param_comms) and the op around it (c10d::allreduce_)
    op = trace.cpu_op[k]
    for _ in range(2):
        ok = op >= 0
        hit[ok] |= mask[trace.name[op[ok]]]
        op = np.where(ok, trace.parent[np.maximum(op, 0)], -1)
    return k[hit]


def launch_time(trace, rows: np.ndarray) -> np.ndarray:
    """Host time each GPU op was launched (its runtime call's start; its own start unlinked)."""
    call = trace.launch[rows]
    return np.where(call >= 0, trace.ts[np.maximum(call, 0)], trace.ts[rows])


def accumulation(trace) -> Accumulation:
    """Micro-steps and their all-reduces between consecutive optimizer steps (cached)."""
    def make() -> Accumulation:
        none = Accumulation(0, 0.0, np.zeros(0, np.int64), np.zeros(0, np.int64))
        ar = allreduce_kernels(trace)
        fw = rows_named(trace, WRAPPER_FORWARD, HOST_KINDS)
        opt = rows_named(trace, OPTIMIZER, HOST_KINDS)
        if not len(ar) or len(fw) < 2 or not len(opt):
            return none
        opt_at, _ = merged_intervals(trace.ts[opt], trace.end[opt])
        fw_at = np.unique(trace.ts[fw])
        at = launch_time(trace, ar)
        wasted, counted, per_update = [], [], []
        lo = -np.inf
        for o in opt_at.tolist():
            starts = fw_at[(fw_at > lo) & (fw_at < o)]
            lo = o
            if not len(starts):
                continue
            # micro-step i: [starts[i], starts[i+1]) and the last one up to the optimizer
            edges = np.r_[starts, o]
            inside = (at >= edges[0]) & (at < o)
            which = np.searchsorted(edges, at[inside], side="right") - 1
            rows = ar[inside]
            counted.append(rows)
            steps = np.unique(which)
            if len(steps) < 2:
                continue
            per_update.append(len(steps))
            wasted.append(rows[which != steps[-1]])
        if not per_update:
            return Accumulation(0, 0.0, np.zeros(0, np.int64),
                                np.concatenate(counted) if counted else np.zeros(0, np.int64))
        return Accumulation(len(per_update), float(np.median(per_update)),
                            np.sort(np.concatenate(wasted)), np.sort(np.concatenate(counted)))
    return cached(trace, "accumulation", make)


#: The GPU idle right after a wasted all-reduce that is still its own: the compute DDP's
#: end-of-backward wait held back relaunching (as `compile_regions.RELAUNCH_US`).
RELAUNCH_US = 2000.0


def wasted_intervals(trace) -> tuple[np.ndarray, np.ndarray]:
    """Where the wasted all-reduces can explain GPU idle: their kernels, each to where the GPU
    resumes after it (at most `RELAUNCH_US` later)."""
    w = accumulation(trace).wasted
    s, e = merged_intervals(trace.ts[w], trace.end[w])
    return s, through_resume(trace, e, RELAUNCH_US)
