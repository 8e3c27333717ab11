"""`traceap info`: what a user wants to know first about a trace (schema traceap.info/v1).

GPU busy and idle come from `traceap.idle`, the same account every analysis report uses, over
its GPU span: `gpu_busy_fraction` is its busy time (a compute kernel, memset or on-device copy
running) over the span, `gpu_idle_us` the rest (so busy + idle = the span), `gpu_idle` its split
by cause, and `nccl.exposed_us` its `communication` cause.  `gpu_active_fraction` is a second
quantity with its own name: any GPU work (NCCL kernels and host<->device copies included) over
the same span.
"""

from __future__ import annotations


import numpy as np

from . import idle as idle_mod
from .measures.copies import sync_rows
from .measures.signals import LOADER_NEXT, rows_named
from .trace import KIND_NAMES, LAUNCH_KINDS, CopyKind, Kind, MemKind, Trace, busy_union, merged_intervals

SCHEMA = "traceap.info/v1"
_COPY_NAMES = {CopyKind.HTOD: "HtoD", CopyKind.DTOH: "DtoH", CopyKind.DTOD: "DtoD",
               CopyKind.HTOH: "HtoH", CopyKind.PTOP: "PtoP", CopyKind.OTHER: "other"}


def _f(x) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 6)


def summarize(trace: Trace, top: int = 10) -> dict:
    """The `traceap.info/v1` object for one trace (the docs/FORMATS.md keys plus more)."""
    kind = trace.kind
    # np.unique over the kind column, not a Counter over 700k Python ints (a quarter second
    # of a large trace's analysis)
    codes, n = np.unique(np.asarray(kind, dtype=np.int64), return_counts=True)
    counts = {int(k): int(c) for k, c in zip(codes, n)}
    per_kind = {KIND_NAMES[Kind(k)]: c for k, c in sorted(counts.items())}
    if trace.meta.n_flows:
        per_kind["flow"] = trace.meta.n_flows
    kernels = np.flatnonzero(kind == Kind.KERNEL)
    memcpy = np.flatnonzero(kind == Kind.GPU_MEMCPY)
    nccl = kernels[trace.is_nccl[kernels]]
    gpu = trace.gpu_work_rows
    start, end = trace.span

    account = idle_mod.measure(trace)
    gpu_span = account.span_us if len(gpu) else None
    active = None
    if gpu_span:
        # Any GPU work over the idle account's span: the same span as busy and idle.
        g0, g1 = account.gpu_span
        active = busy_union(np.clip(trace.ts[gpu], g0, g1), np.clip(trace.end[gpu], g0, g1)) / gpu_span

    out = {
        "schema": SCHEMA,
        "trace": trace.meta.path,
        "span_us": [_f(start), _f(end)],
        "duration_us": _f(end - start),
        "n_events": int(len(trace)) + trace.meta.n_flows,
        "events_per_kind": per_kind,
        "n_cpu_ops": counts.get(Kind.CPU_OP, 0),
        "n_runtime_calls": counts.get(Kind.CUDA_RUNTIME, 0),
        "n_driver_calls": counts.get(Kind.CUDA_DRIVER, 0),
        "n_kernels": len(kernels),
        "n_memcpy": len(memcpy),
        "n_memset": counts.get(Kind.GPU_MEMSET, 0),
        "n_nccl_kernels": len(nccl),
        "gpu_streams": trace.gpu_streams,
        "n_profiler_steps": len(trace.steps),
        "steps": [{"number": s.number, "start_us": s.start_us, "dur_us": s.end_us - s.start_us}
                  for s in trace.steps],
        "gpu_name": trace.gpu_name,
        "n_gpus": len(trace.meta.device_properties) or None,
        "rank": trace.meta.rank,
        "world_size": trace.meta.world_size,
        "backend": trace.meta.backend,
        "gpu_busy_fraction": _f(account.busy_fraction) if gpu_span else None,
        "gpu_active_fraction": _f(active),
        "gpu_idle_us": _f(account.total_us) if gpu_span else None,
        "gpu_idle": ({**account.to_json(), "per_step": idle_mod.per_step(trace)}
                     if gpu_span else None),
        "top_kernels": _top_kernels(trace, kernels, top),
        "memcpy": _memcpy_summary(trace, memcpy),
        "nccl": _nccl_summary(trace, nccl, account),
        "launch": _launch_summary(trace, kernels),
        "step_time": _step_time(trace),
        "warnings": list(trace.meta.warnings),
    }
    return out


def step_intervals(trace: Trace) -> list[tuple[float, float]]:
    """The steps per-step numbers are about: the GPU idle account's steady profiler steps (a
    warm-up first step left out), or every profiler step when there are none (CPU-only)."""
    steady = idle_mod.measure(trace).steady_steps
    if steady:
        return [(float(s), float(e)) for s, e, _ in steady]
    return [(s.start_us, s.end_us) for s in trace.steps]


def step_numbers(trace: Trace) -> dict:
    """The host-side numbers of one trace over `step_intervals`: the steps, their median
    duration, and the time in `DataLoader.__next__` inside them (the union over threads, so
    nested frames count once).  The numbers `traceap diff` compares and the only ones a CPU-only
    recording has."""

    steps = step_intervals(trace)
    rows = rows_named(trace, LOADER_NEXT)
    s, e = trace.ts[rows], trace.end[rows]
    if steps:
        lo = np.array([x[0] for x in steps])
        hi = np.array([x[1] for x in steps])
        # Every loader call clipped to every step, then the union.
        ss = np.maximum(s[:, None], lo[None, :]).ravel()
        ee = np.minimum(e[:, None], hi[None, :]).ravel()
        keep = ee > ss
        loader = busy_union(ss[keep], ee[keep]) if keep.any() else 0.0
        step_us = float(np.median(hi - lo))
    else:
        loader = busy_union(s, e) if len(rows) else 0.0
        step_us = None
    return {"n_steps": len(steps), "step_us": step_us, "dataloader_us": float(loader),
            "dataloader_us_per_step": float(loader) / len(steps) if steps else None,
            "loader_calls": int(len(rows))}


def _step_time(trace: Trace) -> dict:
    """The "step_time" object: `step_numbers` rounded."""
    m = step_numbers(trace)
    return {"n_steps": m["n_steps"], "median_us": _f(m["step_us"]),
            "dataloader_us_per_step": _f(m["dataloader_us_per_step"]),
            "loader_calls": m["loader_calls"]}


def _top_kernels(trace: Trace, kernels: np.ndarray, top: int) -> list[dict]:
    if not len(kernels):
        return []
    codes = trace.name[kernels]
    total = np.bincount(codes, weights=trace.dur[kernels], minlength=len(trace.names))
    count = np.bincount(codes, minlength=len(trace.names))
    all_time = float(trace.dur[kernels].sum()) or 1.0
    best = np.argsort(-total)[:top]
    return [{"name": trace.names[c], "count": int(count[c]), "total_us": _f(total[c]),
             "mean_us": _f(total[c] / count[c]), "share": _f(total[c] / all_time)}
            for c in best if count[c]]


def _memcpy_summary(trace: Trace, memcpy: np.ndarray) -> dict:
    out: dict = {"count": int(len(memcpy)), "bytes": 0.0, "time_us": 0.0, "by_direction": {}}
    if not len(memcpy):
        return out
    nbytes = np.nan_to_num(trace.bytes[memcpy])
    out["bytes"] = float(nbytes.sum())
    out["time_us"] = _f(trace.dur[memcpy].sum())
    direction, src, dst = trace.copy_kind[memcpy], trace.copy_src[memcpy], trace.copy_dst[memcpy]
    host_kind = np.where(direction == CopyKind.DTOH, dst, src)
    for d in np.unique(direction):
        sel = direction == d
        by_mem = {}
        for mk in np.unique(host_kind[sel]):
            s2 = sel & (host_kind == mk)
            by_mem[MemKind(int(mk)).name.lower()] = {
                "count": int(s2.sum()), "bytes": float(nbytes[s2].sum()),
                "time_us": _f(trace.dur[memcpy][s2].sum())}
        out["by_direction"][_COPY_NAMES.get(CopyKind(int(d)), "other")] = {
            "count": int(sel.sum()), "bytes": float(nbytes[sel].sum()),
            "time_us": _f(trace.dur[memcpy][sel].sum()), "by_memory": by_mem}
    return out


def _nccl_summary(trace: Trace, nccl: np.ndarray, account: idle_mod.IdleAccount) -> dict:
    out = {"count": int(len(nccl)), "time_us": 0.0, "exposed_us": None, "exposed_fraction": None,
           "streams": []}
    if not len(nccl):
        return out
    out["time_us"] = _f(trace.dur[nccl].sum())
    out["streams"] = sorted(int(s) for s in np.unique(trace.stream[nccl]))
    comm_s, comm_e = merged_intervals(trace.ts[nccl], trace.end[nccl])
    comm = float(np.sum(comm_e - comm_s))
    # Exposed communication: the idle account's cause (NCCL with no compute beside it), the
    # one definition the analysis, the HTML report and the cross-rank view use too.
    exposed = account.by_cause["communication"]
    out["exposed_us"] = _f(exposed)
    out["exposed_fraction"] = _f(exposed / comm) if comm > 0 else None
    return out


def _launch_summary(trace: Trace, kernels: np.ndarray) -> dict:
    rt = np.flatnonzero(np.isin(trace.kind, LAUNCH_KINDS))
    delay = trace.launch_delay[kernels] if len(kernels) else np.zeros(0)
    delay = delay[np.isfinite(delay)]
    # Host-blocking syncs: the ones the host copy/sync finding counts (device-side waits such
    # as cudaStreamWaitEvent are sync calls too, but the host does not wait in them).
    blocking = sync_rows(trace)
    return {
        "runtime_time_us": _f(trace.dur[rt].sum()) if len(rt) else 0.0,
        "sync_calls": int(trace.is_sync.sum()),
        "sync_time_us": _f(trace.dur[trace.is_sync].sum()),
        "host_blocking_syncs": int(len(blocking)),
        "host_blocking_sync_time_us": _f(trace.dur[blocking].sum()) if len(blocking) else 0.0,
        "launch_delay_median_us": _f(np.median(delay)) if len(delay) else None,
        "launch_delay_p95_us": _f(np.percentile(delay, 95)) if len(delay) else None,
        "kernel_median_us": _f(np.median(trace.dur[kernels])) if len(kernels) else None,
    }
