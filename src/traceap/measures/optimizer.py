"""The optimizer's kernels: per-parameter launches of a single-tensor `Optimizer.step` or a
`zero_grad` that fills every gradient, against multi-tensor (foreach) and fused kernels.

`torch.optim` runs an update either per parameter (`_single_tensor_sgd`, `_single_tensor_adam`:
an `aten::add_` / `mul_` / `addcdiv_` / `lerp_` / `sqrt` launch per parameter and per op, each
kernel a few us) or over lists of tensors (`foreach=True`, the default on CUDA since 2.0:
`multi_tensor_apply_kernel` handles up to ~110 tensors per launch) or in one fused kernel
(`fused=True`: `_fused_adam_`, apex's `multi_tensor_adam`).  `zero_grad(set_to_none=False)`
launches one fill per gradient.  The ranges are the profiler's `Optimizer.step#<Class>.step`
and `Optimizer.zero_grad#<Class>.zero_grad` annotations and the `_single_tensor_*` Python
frames (with_stack); a kernel is the optimizer's when its launch call runs inside one, on its
thread.  Anchor: TorchTidy's "single-tensor optimizer" and "zero_grad without set_to_none"
patterns (`torch.profiler._pattern_matcher`).
"""

from __future__ import annotations

import numpy as np

from ..trace import Kind, Trace, merged_intervals
from .signals import cached, name_mask, rows_named

#: The optimizer's host ranges: the profiler's annotations and the single-tensor frames.
OPTIMIZER_RANGES = (r"^Optimizer\.(step|zero_grad)#|torch/optim/\w+\.py\(\d+\): _single_tensor_"
                    r"|^_single_tensor_\w+$")
#: Kernels that update many tensors per launch: multi_tensor_apply (foreach, apex), fused
#: optimizers, Triton kernels of a compiled step.
MULTI_TENSOR = r"multi_tensor|_fused_|[Ff]used[A-Z_]?[a-z]*[Aa]dam|FusedSGD|^triton_"
HOST_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION)


def _thread_key(trace: Trace, rows: np.ndarray) -> np.ndarray:
    return trace.pid[rows].astype(np.int64) * (1 << 32) + trace.tid[rows].astype(np.int64)


def optimizer_calls(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, thread keys) of the optimizer's host ranges, merged per thread: one per
    `step` or `zero_grad` call."""
    def make():
        rows = rows_named(trace, OPTIMIZER_RANGES, HOST_KINDS)
        out_s, out_e, out_k = [], [], []
        key = _thread_key(trace, rows)
        for k in np.unique(key).tolist():
            on = rows[key == k]
            s, e = merged_intervals(trace.ts[on].astype(np.float64), trace.end[on].astype(np.float64))
            out_s.append(s)
            out_e.append(e)
            out_k.append(np.full(len(s), k, np.int64))
        if not out_s:
            return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
        s, e, k = np.concatenate(out_s), np.concatenate(out_e), np.concatenate(out_k)
        o = np.argsort(s, kind="stable")
        return s[o], e[o], k[o]
    return cached(trace, "optimizer:calls", make)


def optimizer_kernels(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kernel rows, index of the optimizer call that launched each, multi-tensor or fused?):
    the kernels launched from inside an optimizer range on its thread, in start order."""
    def make():
        s, e, key = optimizer_calls(trace)
        k = trace.rows(Kind.KERNEL)
        k = k[(trace.launch[k] >= 0) & ~trace.is_nccl[k]]
        empty = np.zeros(0, np.int64)
        if not len(s) or not len(k):
            return empty, empty, np.zeros(0, bool)
        call = trace.launch[k]
        at, kk = trace.ts[call], _thread_key(trace, call)
        owner = np.full(len(k), -1, np.int64)
        for th in np.unique(key).tolist():
            idx = np.flatnonzero(key == th)
            sel = np.flatnonzero(kk == th)
            j = np.searchsorted(s[idx], at[sel], side="right") - 1
            ok = (j >= 0) & (at[sel] < e[idx[np.maximum(j, 0)]])
            owner[sel[ok]] = idx[j[ok]]
        keep = owner >= 0
        k, owner = k[keep], owner[keep]
        o = np.argsort(trace.ts[k], kind="stable")
        k, owner = k[o], owner[o]
        multi = name_mask(trace, MULTI_TENSOR)[trace.name[k]] if len(k) else np.zeros(0, bool)
        return k, owner, multi
    return cached(trace, "optimizer:kernels", make)


def per_parameter_runs(trace: Trace, min_launches: int) -> list[tuple[np.ndarray, int]]:
    """Per optimizer call with at least `min_launches` per-parameter kernels (not multi-tensor,
    not fused): (its per-parameter kernel rows in start order, the number of distinct kernel
    names among them: the launches a foreach step would need at least)."""
    def make():
        k, owner, multi = optimizer_kernels(trace)
        k, owner = k[~multi], owner[~multi]
        out = []
        for c in np.unique(owner).tolist():
            rows = k[owner == c]
            if len(rows) >= min_launches:
                out.append((rows, int(len(np.unique(trace.name[rows])))))
        return out
    return cached(trace, f"optimizer:runs:{min_launches}", make)


__all__ = ["MULTI_TENSOR", "OPTIMIZER_RANGES", "optimizer_calls", "optimizer_kernels",
           "per_parameter_runs"]
