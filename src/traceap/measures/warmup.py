"""One-off start-up: the calls, launches and steps a trace spends once, before its steady state.

Allocator growth (cudaMalloc, cudaHostAlloc), stream and CUDA-graph creation, module loading
(cuModuleLoad, the slow first launch of a kernel under lazy loading), torch.compile / Triton
compilation, autotuning, DataLoader worker start-up (a first `__next__` far longer than the
others), and a first profiler step much longer than the others whose extra time such calls
largely cover.  The idle account (`traceap.idle`, mechanism `warmup`) gives the GPU idle under
them to warm-up; the allocator-churn and recompilation measures start after its steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Kind, Trace, merged_intervals
from .signals import cached, rows_named

#: One-off start-up calls (runtime/driver API).
WARMUP_CALLS = (r"^(cuda|hip)(Malloc|MallocAsync|MallocManaged|MallocHost|HostAlloc|HostRegister"
                r"|ExtMallocWithFlags|StreamCreate\w*|StreamBeginCapture|StreamEndCapture"
                r"|GraphInstantiate\w*|ModuleLoad\w*)$"
                r"|^cu(MemAlloc\w*|MemCreate|MemHostAlloc|ModuleLoad\w*|LibraryLoad\w*"
                r"|GraphInstantiate\w*)$")
#: One-off start-up on the host (cpu ops, annotations, with_stack python frames).
WARMUP_HOST = (r"torch/_dynamo/convert_frame\.py|torch/_inductor/(compile_fx|codecache"
               r"|standalone_compile|async_compile)\.py|compile_or_warm_up|capture_model"
               r"|torch/cuda/graphs\.py|torch/cuda/__init__\.py\(\d+\): _lazy_init"
               r"|triton/compiler/compiler\.py\(\d+\): compile|autotuner\.py\(\d+\): _bench"
               r"|do_bench|cudnnFind|_MultiProcessingDataLoaderIter\.__init__"
               r"|dataloader\.py\(\d+\): _get_iterator")
LAUNCH_CALLS = r"LaunchKernel|LaunchCooperativeKernel|ModuleLaunchKernel|cuLaunch"
LOADER_MULTI_NEXT = r"_MultiProcessingDataLoaderIter.*__next__"
RUNTIME_KINDS = (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)


@dataclass(frozen=True)
class WarmupConfig:
    """How warm-up is recognised."""

    #: A first step this many times the median of the others is warm-up, when it also holds
    #: warm-up calls (a long first step alone may be an injected or real stall).
    first_step_ratio: float = 1.5
    #: ... and when warm-up calls cover at least this share of its excess over the median.
    first_step_explained: float = 0.25
    #: The first launch of a kernel taking this long is lazy module loading (HTA: a runtime
    #: call over 50 us is an outlier; steady-state launches take 3-20 us).
    slow_first_launch_us: float = 50.0
    #: A multi-process loader's first `__next__` this many times the median of the later ones
    #: is worker start-up.
    first_next_ratio: float = 3.0
    #: ... when the loader keeps up afterwards: its later `__next__` calls take under this share
    #: of a step (a prefetched batch returns in microseconds).  A loader that starves the GPU
    #: every step waits longest for its first batch (nothing prefetched yet): the same
    #: bottleneck, not start-up.
    loader_keeps_up: float = 0.05


def warmup_intervals(trace: Trace, config: WarmupConfig = WarmupConfig()
                     ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], list[int]]:
    """(starts, ends, intervals per source, warm-up step numbers) of the trace's warm-up."""
    calls = rows_named(trace, WARMUP_CALLS, RUNTIME_KINDS)
    host = rows_named(trace, WARMUP_HOST)
    parts: dict[str, tuple[np.ndarray, np.ndarray]] = {
        "allocator, streams, graphs, modules": (trace.ts[calls], trace.end[calls]),
        "compilation, autotuning, lazy init": (trace.ts[host], trace.end[host])}
    # Lazy module loading: the first launch of each kernel, when it is slow.
    launches = rows_named(trace, LAUNCH_CALLS, RUNTIME_KINDS)
    k = trace.rows(Kind.KERNEL)
    k = k[trace.launch[k] >= 0]
    if len(k) and len(launches):
        order = np.argsort(trace.ts[k], kind="stable")
        k = k[order]
        _, first = np.unique(trace.name[k], return_index=True)
        call = trace.launch[k[first]]
        slow = call[trace.dur[call] >= config.slow_first_launch_us]
        parts["first launches (module loading)"] = (trace.ts[slow], trace.end[slow])
    # DataLoader worker start-up: a first multi-process __next__ far longer than the rest.
    nxt = rows_named(trace, LOADER_MULTI_NEXT)
    if len(nxt) >= 2:
        s, e = merged_intervals(trace.ts[nxt], trace.end[nxt])
        later = float(np.median(e[1:] - s[1:])) if len(s) >= 2 else 0.0
        if (len(s) >= 2 and (e[0] - s[0]) >= config.first_next_ratio * later
                and later < config.loader_keeps_up * _typical_step_us(trace, s)):
            parts["DataLoader worker start-up"] = (s[:1], e[:1])
    starts = np.concatenate([p[0] for p in parts.values()])
    ends = np.concatenate([p[1] for p in parts.values()])
    steps: list[int] = []
    if len(trace.steps) >= 2 and len(starts):
        st = sorted(trace.steps, key=lambda x: x.start_us)
        first, rest = st[0], st[1:]
        dur = first.end_us - first.start_us
        med = float(np.median([x.end_us - x.start_us for x in rest]))
        # The warm-up calls must account for a good part of the extra time, or the long first
        # step is a stall of its own (a real or injected anti-pattern), not start-up.
        ms, me = merged_intervals(np.clip(starts, first.start_us, first.end_us),
                                  np.clip(ends, first.start_us, first.end_us))
        held = float(np.sum(me - ms))
        if (med > 0 and dur >= config.first_step_ratio * med
                and held >= config.first_step_explained * (dur - med)):
            parts["first profiler step"] = (np.array([first.start_us]), np.array([first.end_us]))
            steps.append(first.number)
            starts = np.append(starts, first.start_us)
            ends = np.append(ends, first.end_us)
    return starts, ends, {k: v for k, v in parts.items()}, steps


def _typical_step_us(trace: Trace, next_starts: np.ndarray) -> float:
    """The median profiler step, or without steps the median spacing of the loader's calls."""
    if len(trace.steps) >= 2:
        return float(np.median([x.end_us - x.start_us for x in trace.steps]))
    return float(np.median(np.diff(next_starts))) if len(next_starts) >= 3 else float("inf")


def warmup(trace: Trace, config: WarmupConfig = WarmupConfig()):
    """`warmup_intervals`, computed once per trace and config."""
    return cached(trace, f"warmup:{config!r}", lambda: warmup_intervals(trace, config))
