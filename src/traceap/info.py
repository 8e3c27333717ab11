"""`traceap info`: what a user wants to know first about a trace (schema traceap.info/v1).

GPU idle time and exposed communication come from `traceap.idle`, the same account every
analysis report uses: `gpu_idle_us` is its total (no compute kernel, memset or on-device copy
running in the GPU span), `gpu_idle` its split by cause, and `nccl.exposed_us` its
`communication` cause.  `gpu_busy_fraction` keeps its docs/FORMATS.md meaning (any GPU activity over
the span of GPU work), so busy + idle can exceed 100% by the communication- and copy-only time.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from . import idle as idle_mod
from .trace import KIND_NAMES, LAUNCH_KINDS, CopyKind, Kind, MemKind, Trace, busy_union, merged_intervals

SCHEMA = "traceap.info/v1"
_COPY_NAMES = {CopyKind.HTOD: "HtoD", CopyKind.DTOH: "DtoH", CopyKind.DTOD: "DtoD",
               CopyKind.HTOH: "HtoH", CopyKind.PTOP: "PtoP", CopyKind.OTHER: "other"}


def _f(x) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 6)


def summarize(trace: Trace, top: int = 10) -> dict:
    """The `traceap.info/v1` object for one trace (the docs/FORMATS.md keys plus more)."""
    kind = trace.kind
    counts = Counter(int(k) for k in kind)
    per_kind = {KIND_NAMES[Kind(k)]: c for k, c in sorted(counts.items())}
    if trace.meta.n_flows:
        per_kind["flow"] = trace.meta.n_flows
    kernels = np.flatnonzero(kind == Kind.KERNEL)
    memcpy = np.flatnonzero(kind == Kind.GPU_MEMCPY)
    nccl = kernels[trace.is_nccl[kernels]]
    gpu = trace.gpu_work_rows
    start, end = trace.span

    gpu_busy = gpu_span = None
    if len(gpu):
        g0, g1 = float(trace.ts[gpu].min()), float(trace.end[gpu].max())
        gpu_span = g1 - g0
        busy = busy_union(trace.ts[gpu], trace.end[gpu])
        gpu_busy = busy / gpu_span if gpu_span > 0 else 1.0
    account = idle_mod.measure(trace)

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
        "gpu_busy_fraction": _f(gpu_busy),
        "gpu_idle_us": _f(account.total_us) if gpu_span else None,
        "gpu_idle": ({**account.to_json(), "per_step": idle_mod.per_step(trace)}
                     if gpu_span else None),
        "top_kernels": _top_kernels(trace, kernels, top),
        "memcpy": _memcpy_summary(trace, memcpy),
        "nccl": _nccl_summary(trace, nccl, account),
        "launch": _launch_summary(trace, kernels),
        "warnings": list(trace.meta.warnings),
    }
    return out


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
    return {
        "runtime_time_us": _f(trace.dur[rt].sum()) if len(rt) else 0.0,
        "sync_calls": int(trace.is_sync.sum()),
        "sync_time_us": _f(trace.dur[trace.is_sync].sum()),
        "launch_delay_median_us": _f(np.median(delay)) if len(delay) else None,
        "launch_delay_p95_us": _f(np.percentile(delay, 95)) if len(delay) else None,
        "kernel_median_us": _f(np.median(trace.dur[kernels])) if len(kernels) else None,
    }
