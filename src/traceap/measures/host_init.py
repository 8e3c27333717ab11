"""Tensors created on the host and then copied to the GPU inside the step.

`torch.zeros(n).cuda()`, `torch.arange(L).to(device)`, `torch.randn(shape).to(device)`: the
tensor is built by the CPU (an ATen factory op that launches no kernel), then `aten::to` >
`aten::_to_copy` > `aten::copy_` copies it host-to-device, usually from pageable memory (the
launch blocks for the copy).  Creating it on the device (`device="cuda"`) runs one tiny fill
kernel instead of a host loop plus a transfer.  Anchor: TorchTidy's "extra CUDA copy" pattern
(`torch.profiler._pattern_matcher.ExtraCUDACopyPattern`: a factory op on the CPU followed by
`aten::to` to CUDA).

A match is an HtoD copy (not from pinned memory) launched under an `aten::to` /
`aten::_to_copy` / `aten::copy_` chain that starts at most `InitConfig.max_gap_us` after an
outermost factory op of the same thread and the same enclosing range ended, that factory op
having launched no GPU work.  Measured here so the idle account (mechanism `cpu_tensor_init`,
ahead of the other copies) and the copy rules agree on which copies are these:
`no_pin_memory` and `excessive_memcpy` leave them out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import CopyKind, Kind, MemKind, Trace
from .signals import cached, name_mask

#: ATen factory ops that fill a new tensor with values (on the host when no kernel runs under
#: them).  Not `aten::empty`: an uninitialised tensor copied to the GPU is a staging buffer
#: filled in between (DLRM's input pipeline in ../shared/traces: 12 such 2-MB uploads a trace).
FACTORIES = (r"^aten::(zeros|ones|full|arange|range|linspace|logspace|eye|rand|randn"
             r"|randint|randperm|normal_|uniform_|bernoulli_|zeros_like|ones_like|full_like"
             r"|rand_like|randn_like)$")
#: The op chain of `tensor.to(device)` / `.cuda()`.
TO_CHAIN = r"^aten::(to|_to_copy|copy_)$"


@dataclass(frozen=True)
class InitConfig:
    """What makes a copy the upload of a tensor just created on the host."""

    #: Python between the factory call and `.to(device)` on the same line or the next
    #: (`torch.zeros(n).cuda()`: a few us; 10-150 us between framework calls in the real
    #: traces at hand, `measures.host.HostConfig.unrecorded_host_us`'s note).
    max_gap_us: float = 200.0


def init_copies(trace: Trace, config: InitConfig = InitConfig()
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(factory op rows, `to` op rows, HtoD copy rows), one triple per upload of a tensor the
    host has just created, in time order."""
    return cached(trace, f"host_init:{config!r}", lambda: _init_copies(trace, config))


def _init_copies(trace: Trace, config: InitConfig):
    t = trace
    empty = np.zeros(0, np.int64)
    if not len(t.names):
        return empty, empty, empty
    copies = t.rows(Kind.GPU_MEMCPY)
    # A factory makes pageable memory (`pin_memory=True` on a factory is rare): a pinned upload
    # right after a small factory op is an input batch (DLRM's `## load_batch ##`).
    copies = copies[(t.copy_kind[copies] == CopyKind.HTOD) & (t.launch[copies] >= 0)
                    & (t.copy_src[copies] != MemKind.PINNED)]
    if not len(copies):
        return empty, empty, empty
    chain = name_mask(t, TO_CHAIN)
    # The outermost op of the `to` chain around each copy's launch call (from the innermost
    # cpu_op enclosing the call: a runtime call can nest in another one by rounding).
    call = t.launch[copies]
    op = np.where(t.cpu_op[call] >= 0, t.cpu_op[call], t.parent[call]).astype(np.int64)
    lost = (op < 0) | ~chain[t.name[np.maximum(op, 0)]]
    op[lost] = _enclosing_to(t, call[lost])
    ok = op >= 0
    copies, op = copies[ok], op[ok]
    for _ in range(4):  # aten::to > aten::_to_copy > aten::copy_: at most a few levels
        up = t.parent[op].astype(np.int64)
        climb = (up >= 0) & chain[t.name[np.maximum(up, 0)]]
        if not climb.any():
            break
        op = np.where(climb, up, op)
    if not len(op):
        return empty, empty, empty
    fac = t.rows(Kind.CPU_OP)
    fac = fac[name_mask(t, FACTORIES)[t.name[fac]]]
    par = t.parent[fac].astype(np.int64)
    fac = fac[(par < 0) | ~name_mask(t, FACTORIES)[t.name[np.maximum(par, 0)]]]  # outermost
    if not len(fac):
        return empty, empty, empty
    fac = fac[~_launched_under(t, fac)]
    # Per copy: the factory op on the same thread that ended last before its `to` began.
    key_f, key_o = _thread_key(t, fac), _thread_key(t, op)
    order = np.lexsort((t.end[fac], key_f))
    fac, key_f = fac[order], key_f[order]
    out_f, out_o, out_c = [], [], []
    for k in np.unique(key_o).tolist():
        on_f = fac[key_f == k]
        if not len(on_f):
            continue
        sel = np.flatnonzero(key_o == k)
        ends = t.end[on_f]
        j = np.searchsorted(ends, t.ts[op[sel]], side="right") - 1
        hit = j >= 0
        jj = np.maximum(j, 0)
        gap = t.ts[op[sel]] - ends[jj]
        hit &= gap <= config.max_gap_us
        # One line of code makes and uploads it: both ops sit in the same enclosing range (a
        # factory op before the step, then the step's first upload, is not one tensor)
        hit &= t.parent[on_f[jj]] == t.parent[op[sel]]
        out_f.append(on_f[jj[hit]])
        out_o.append(op[sel[hit]])
        out_c.append(copies[sel[hit]])
    if not out_f:
        return empty, empty, empty
    f, o, c = np.concatenate(out_f), np.concatenate(out_o), np.concatenate(out_c)
    order = np.argsort(t.ts[c], kind="stable")
    return f[order], o[order], c[order]


def _thread_key(t: Trace, rows: np.ndarray) -> np.ndarray:
    """One int64 per row naming its (pid, tid)."""
    return t.pid[rows].astype(np.int64) * (1 << 32) + t.tid[rows].astype(np.int64)


def _enclosing_to(t: Trace, calls: np.ndarray) -> np.ndarray:
    """Per runtime call: the `aten::to` / `aten::_to_copy` of its thread whose time span holds
    its start (-1: none), for calls the call tree lost (ranges rounded into partial overlap)."""
    out = np.full(len(calls), -1, np.int64)
    if not len(calls):
        return out
    to = t.rows(Kind.CPU_OP)
    to = to[name_mask(t, r"^aten::(to|_to_copy)$")[t.name[to]]]
    kt, kc = _thread_key(t, to), _thread_key(t, calls)
    for k in np.unique(kc).tolist():
        on = to[kt == k]
        on = on[np.argsort(t.ts[on], kind="stable")]
        sel = np.flatnonzero(kc == k)
        j = np.searchsorted(t.ts[on], t.ts[calls[sel]], side="right") - 1
        ok = (j >= 0) & (t.ts[calls[sel]] < t.end[on[np.maximum(j, 0)]])
        out[sel[ok]] = on[j[ok]]
    return out


def _launched_under(t: Trace, ops: np.ndarray) -> np.ndarray:
    """Per op: a runtime/driver call of its thread starts inside it (it put work on the GPU)."""
    rt = t.rows(Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)
    out = np.zeros(len(ops), bool)
    if not len(rt):
        return out
    krt, kop = _thread_key(t, rt), _thread_key(t, ops)
    for k in np.unique(kop).tolist():
        starts = np.sort(t.ts[rt[krt == k]])
        sel = np.flatnonzero(kop == k)
        lo = np.searchsorted(starts, t.ts[ops[sel]], side="left")
        hi = np.searchsorted(starts, t.end[ops[sel]], side="right")
        out[sel] = hi > lo
    return out


def init_intervals(trace: Trace, config: InitConfig = InitConfig()) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) the host spends making each such tensor and uploading it: from the
    factory op's start to the end of its `to` chain or of the copy, whichever is later."""
    f, o, c = init_copies(trace, config)
    return trace.ts[f].astype(np.float64), np.maximum(trace.end[o], trace.end[c])


__all__ = ["FACTORIES", "InitConfig", "TO_CHAIN", "init_copies", "init_intervals"]
