"""NCCL collectives the communication rules and the idle account both measure.

`blocking_nccl`: NCCL kernels on a stream that carries the model's compute, the signature of
the collectives-on-the-compute-stream rule, and the collectives the exposed-communication rule
leaves to it.  `small_nccl`: short (or small) collectives, the small-collectives signature.  The idle
account (`traceap.idle`, cause `communication`) splits exposed communication with the same rows.
`host_late_under_nccl`: where a collective only looks exposed, because the host had not
launched the next work yet (the account gives that time to the host-side causes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .copies import blocking_dtoh_calls, sync_rows
from .gaps import idle_gaps, queued_intervals
from .signals import (cached, compute_streams, intersect, name_mask, nccl_rows, rows_named,
                      subtract)

#: The host side of a collective: c10d's op, its record_param_comms and nccl:* ranges.
COLLECTIVE_HOST = r"^(c10d::|c10d_functional::|_c10d_functional::|nccl:|rccl:|record_param_comms$)"


@dataclass(frozen=True)
class BlockConfig:
    """Thresholds: share of a window a compute stream spends in NCCL."""

    time_lo: float = 0.02
    time_hi: float = 0.15
    #: Score of a window holding any such kernel, however short: each one stalls the stream...
    presence: float = 0.55
    #: ... once the trace holds this many (one stray all-gather of metrics is not a habit).
    presence_min: int = 3
    #: A stream is a compute stream when it carries this share of compute-kernel time.
    compute_share: float = 0.1


def blocking_nccl(trace, config: BlockConfig) -> np.ndarray:
    """NCCL kernel rows on a compute stream."""
    def make():
        n = nccl_rows(trace)
        return n[np.isin(trace.stream[n], compute_streams(trace, config.compute_share))]
    return cached(trace, f"blocking_nccl:{config}", make)


@dataclass(frozen=True)
class SmallNcclConfig:
    """Thresholds: what a short collective is, and how many per window and per step."""

    short_us: float = 50.0
    small_bytes: float = 1 << 20
    per_window_lo: float = 1.0
    per_window_hi: float = 5.0
    per_step_lo: float = 4.0
    per_step_hi: float = 16.0
    #: Share of a window inside a burst of small collectives for a full score.
    burst_lo: float = 0.3
    burst_hi: float = 0.8
    #: A pause this many times the median spacing ends a burst (so does a step boundary).
    burst_break: float = 10.0


def small_nccl(trace, config: SmallNcclConfig) -> np.ndarray:
    """NCCL kernel rows that are short (or small, when sizes are recorded)."""
    def make():
        n = nccl_rows(trace)
        nelems = trace.comm_nelems[n]
        by_size = (nelems > 0) & (nelems * 4 < config.small_bytes)
        by_time = (nelems <= 0) & (trace.dur[n] < config.short_us)
        return n[by_size | by_time]
    return cached(trace, f"small_nccl:{config}", make)


def host_late_under_nccl(trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) in which a collective runs, no compute does, no compute is queued behind
    anything (`gaps.queued_intervals`) and the host is not blocked in a sync: the device idles
    because the host has not launched the next work yet, and the collective only looks exposed.
    Overlapping it better would not shorten the step; the host-side causes explain the gap.
    Real DDP's exposed all-reduce has the optimizer's kernels queued behind it (the HTA and
    PARAM DLRM traces: 80-100% of the exposed time; `benchmarks/nccl_queued.py`)."""
    def make():
        nc = nccl_rows(trace)
        if not len(nc):
            return np.zeros(0), np.zeros(0)
        gs, ge = idle_gaps(trace)
        n0, n1 = intersect(trace.ts[nc], trace.end[nc], gs, ge)
        q0, q1 = queued_intervals(trace)
        w = np.concatenate((sync_rows(trace), blocking_dtoh_calls(trace)))
        return subtract(n0, n1, np.concatenate((q0, trace.ts[w])),
                        np.concatenate((q1, trace.end[w])))
    return cached(trace, "comm:host_late", make)


def host_late_outside_collectives(trace) -> tuple[np.ndarray, np.ndarray]:
    """`host_late_under_nccl` less the time the host is inside a collective's own call path
    (c10d's op, record_param_comms, nccl:* ranges: 100-200 us each).  Many small collectives
    keep the host late in exactly those calls: that lateness is their cost."""
    def make():
        l0, l1 = host_late_under_nccl(trace)
        comm = rows_named(trace, COLLECTIVE_HOST)
        return subtract(l0, l1, trace.ts[comm], trace.end[comm])
    return cached(trace, "comm:host_late_outside", make)


def collective_calls(trace, kernels: np.ndarray) -> np.ndarray:
    """Rows of the outermost collective host call (c10d's op, record_param_comms, nccl:*
    ranges: `COLLECTIVE_HOST`) around the launch of each of `kernels`, each row once.  Many
    small collectives keep the device idle between their kernels while the host is in these
    calls launching the next one: with the kernels, the time that bucketing them removes."""
    coll = name_mask(trace, COLLECTIVE_HOST)
    launch = trace.launch[kernels].astype(np.int64)
    p = trace.parent[launch[launch >= 0]].astype(np.int64)
    top = np.full(len(p), -1, dtype=np.int64)
    todo = np.flatnonzero(p >= 0)
    while len(todo):  # one level of the call tree per pass; the outermost match wins
        q = p[todo]
        hit = coll[trace.name[q]]
        top[todo[hit]] = q[hit]
        p[todo] = trace.parent[q]
        todo = todo[p[todo] >= 0]
    return np.unique(top[top >= 0])
