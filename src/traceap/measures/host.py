"""What the host did between framework calls: the user's Python, or work the profiler missed.

A framework call is an op named `ns::name` (ATen and other registered ops) or a runtime or
driver call; between two of them the host runs Python or something unrecorded.  The idle account
(`traceap.idle`: `python_host`, `unrecorded_host`), the CPU-bound rule and the sync-cost
measure (`copies.sync_costs`) read the same holes with the same thresholds (`HostConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Kind, Trace, merged_intervals
from .signals import cached, name_mask

#: Framework calls: ATen and other registered ops (`ns::name`) and runtime/driver calls.  User
#: ranges (record_function, `ProfilerStep#3`, python frames) say where, not that work ran.
FRAMEWORK_OP = r"::"


@dataclass(frozen=True)
class HostConfig:
    """When a hole between framework calls is the user's Python, and when unrecorded work."""

    #: The host recording no framework call (op, runtime call) for longer than this is doing
    #: something the profiler did not see.  Python between two launches takes 10-150 us in the
    #: real traces at hand (1.2 ms at most with 6x planted overhead, docs/INJECT.md); the
    #: unrecorded stretches of the validation traces last 148 ms to 1.3 s.
    unrecorded_host_us: float = 5000.0
    #: Python between two framework calls longer than this many times the framework call
    #: before it is the user's code holding the GPU up, not dispatch.  Chosen on the validation
    #: split of the real-based benchmark (`benchmarks/real_rules_report.py`): at 2 healthy
    #: small-model windows stay under the CPU-bound rule's flag (99%) while planted Python is found.
    python_ratio: float = 2.0


def framework_calls(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the merged stretches in which some thread is inside a framework call
    (an op named `ns::name`, a runtime or driver call).  Sorted, disjoint."""
    def make():
        cpu = trace.rows(Kind.CPU_OP)
        if len(cpu) and len(trace.names):
            cpu = cpu[name_mask(trace, FRAMEWORK_OP)[trace.name[cpu]]]
        rows = np.concatenate((cpu, trace.rows(Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)))
        if not len(rows):
            return np.zeros(0), np.zeros(0)
        return merged_intervals(trace.ts[rows], trace.end[rows])
    return cached(trace, "host:framework_calls", make)


def host_holes(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the stretches in which no thread of the trace was inside a framework
    call (an op named `ns::name`, a runtime or driver call): Python between launches, or work
    the profiler did not see.  Sorted, disjoint."""
    s, e = framework_calls(trace)
    return e[:-1], s[1:]


def python_holes(trace: Trace, config: HostConfig = HostConfig()
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The host holes in which the user's Python outlasts the framework: longer than
    `config.python_ratio` x the framework call just before them (and not unrecorded work)."""
    def make():
        h0, h1 = host_holes(trace)
        if not len(h0):
            return h0, h1
        # The framework call before hole i is the merged call that ends where the hole starts.
        s, e = framework_calls(trace)
        before = e[:-1] - s[:-1]
        long = h1 - h0
        keep = (long > config.python_ratio * before) & (long <= config.unrecorded_host_us)
        return h0[keep], h1[keep]
    return cached(trace, f"host:python_holes:{config!r}", make)


def unrecorded_host(trace: Trace, longer_than_us: float) -> tuple[np.ndarray, np.ndarray]:
    """The host holes longer than `longer_than_us`: host time the profiler did not record."""
    h0, h1 = host_holes(trace)
    long = (h1 - h0) > longer_than_us
    return h0[long], h1[long]
