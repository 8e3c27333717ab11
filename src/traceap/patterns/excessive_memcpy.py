"""Excessive host<->device copies and the synchronisations they force.

Mechanism: `.item()`, `.cpu()`, `.numpy()`, `print(loss)` or building tensors on the host inside
the loop each produce a DtoH/HtoD memcpy and a `cudaStreamSynchronize` (or a synchronous
`cudaMemcpy`): the host waits for the device to drain, then the device waits for the host to
launch again.  Time lost = the `host_copy_sync` idle of `traceap.idle` that belongs to this
pattern: copy time no compute overlaps, and the GPU gap after each sync that the sync can have
caused (all of it when the sync fetched values to the host, at most the time the host waited in
it for a bare event/stream sync).  Copies and syncs inside a
torch.compile graph break (a data-dependent `.item()`/`nonzero` between compiled regions) are the
break's, and a trace with only device-to-device copies and free syncs has no finding.  Anchors: TraceLens flags a memcpy direction over 5% of time or over 10
transfers; nsys-ai flags sync APIs over 1 ms and 2% of GPU time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..idle import pattern_lost
from ..trace import CopyKind, Kind, merged_intervals
from ..windows import Windows
from .base import AntiPattern, Measures
from .graph_break import compile_gaps
from .signals import (cached, compute_rows, count_in, fmt_bytes, fmt_us, name_mask, overlap_in,
                      ramp, rows_named, rows_in_windows, spans, starved_gaps, sum_in, top_names, union_in)

SCALAR_OPS = r"^aten::(item|_local_scalar_dense)$|^aten::(to|_to_copy|copy_)$"


@dataclass(frozen=True)
class MemcpyConfig:
    """Thresholds on the share of a window lost to copies and sync bubbles."""

    lost_lo: float = 0.03
    lost_hi: float = 0.25
    #: Host time blocked in copies + syncs (the host cannot run ahead of the device).
    host_lo: float = 0.10     # TraceLens: a memcpy direction over 5% of time
    host_hi: float = 0.50
    host_weight: float = 0.8
    #: Fewer transfers + syncs than this in a window is one batch upload, not a habit.
    count_lo: float = 1.0
    count_hi: float = 4.0
    #: A GPU gap counts as a sync bubble when a sync returned within this long of its start.
    sync_tol_us: float = 20.0
    #: Syncs per window that make a habit, and the small bubble share that then suffices.
    many_lo: float = 4.0
    many_hi: float = 12.0
    habit_lost_lo: float = 0.01
    habit_lost_hi: float = 0.05
    #: HtoD copies at least this big are input batches, not the per-sample habit.
    batch_bytes: float = 64e3
    #: A window whose copies and syncs cost the GPU less than this share scores in proportion
    #: (a free sync is not a habit worth flagging).
    cost_gate: float = 0.01


def host_copies(trace, batch_bytes: float = 64e3) -> np.ndarray:
    """The copies of the habit: every DtoH copy, and HtoD copies smaller than an input batch
    (`torch.tensor(x, device=...)`, per-sample uploads).  Batch uploads are the normal
    once-per-step input transfer (pinned) or the no_pin_memory pattern (pageable)."""
    def make():
        rows = trace.rows(Kind.GPU_MEMCPY)
        kind = trace.copy_kind[rows]
        nb = np.nan_to_num(trace.bytes[rows])
        small_up = (kind == CopyKind.HTOD) & (nb > 0) & (nb < batch_bytes)
        return rows[(kind == CopyKind.DTOH) | small_up]
    return cached(trace, f"host_copies:{batch_bytes}", make)


#: `cudaStreamWaitEvent` makes a *stream* wait on the device; the host does not block.
DEVICE_SIDE_WAITS = r"StreamWaitEvent"


def sync_rows(trace) -> np.ndarray:
    """Runtime calls that block the host until the device catches up."""
    def make():
        rows = np.flatnonzero(trace.is_sync)
        if not len(rows):
            return rows
        return rows[~name_mask(trace, DEVICE_SIDE_WAITS)[trace.name[rows]]]
    return cached(trace, "sync_rows", make)


def fetch_syncs(trace, tol_us: float) -> np.ndarray:
    """Per row of `sync_rows`: the sync fetched values to the host (a DtoH copy ends inside it,
    as with `.item()`, `.tolist()`, `.cpu()` or a synchronous `cudaMemcpy`)."""
    def make():
        sync = sync_rows(trace)
        rows = trace.rows(Kind.GPU_MEMCPY)
        ends = np.sort(trace.end[rows[trace.copy_kind[rows] == CopyKind.DTOH]])
        if not len(sync) or not len(ends):
            return np.zeros(len(sync), dtype=bool)
        lo = np.searchsorted(ends, trace.ts[sync] - tol_us, side="left")
        hi = np.searchsorted(ends, trace.end[sync] + tol_us, side="right")
        return hi > lo
    return cached(trace, f"fetch_syncs:{tol_us}", make)


def sync_bubbles(trace, tol_us: float) -> tuple[np.ndarray, np.ndarray]:
    """The price of each host-blocking sync: the starved GPU gap that begins as it returns.

    A sync that fetched values to the host is charged the whole gap: the host then works on what
    it fetched, and keeping the values on the GPU removes the wait and that work.  A bare sync
    (an event, stream or device sync, nothing fetched) is charged at most the time the host
    blocked in it: that wait is how far the host ran ahead of the device, the lead it would have
    kept without the sync.  The rest of such a gap is the host's own time between launches:
    16 event syncs of 3 us do not cost the 8 ms gap that follows them."""
    def make():
        g0, g1, _ = starved_gaps(trace)
        sync = sync_rows(trace)
        # A DtoH copy whose launch call lasted until the copy ended (pageable DtoH, or a copy
        # behind other work) blocked the host like a sync, and fetched.
        copies = trace.rows(Kind.GPU_MEMCPY)
        copies = copies[(trace.copy_kind[copies] == CopyKind.DTOH) & (trace.launch[copies] >= 0)]
        calls = trace.launch[copies]
        blocking = calls[trace.end[calls] >= trace.end[copies] - tol_us]
        if not len(g0) or not len(sync) + len(blocking):
            return np.zeros(0), np.zeros(0)
        rows = np.concatenate((sync, blocking))
        fetched = np.concatenate((fetch_syncs(trace, tol_us), np.ones(len(blocking), bool)))
        order = np.argsort(trace.end[rows], kind="stable")
        ends, waits, fetched = trace.end[rows][order], trace.dur[rows][order], fetched[order]
        j = np.searchsorted(ends, g1, side="right") - 1  # last sync ending before the gap ends
        ok = j >= 0
        jj = np.maximum(j, 0)
        last = np.where(ok, ends[jj], -np.inf)
        hit = ok & (last >= g0 - tol_us)
        cost = np.where(fetched[jj], g1 - g0, np.minimum(g1 - g0, waits[jj]))
        return g0[hit], (g0 + cost)[hit]
    return cached(trace, f"sync_bubbles:{tol_us}", make)


class ExcessiveMemcpy(AntiPattern):
    id = "excessive_memcpy"
    title = "Frequent host<->device copies and synchronisations (.item(), .cpu())"
    mechanism = "DtoH/HtoD copies with cudaStreamSynchronize stall the host and then the GPU"
    fix = """\
Keep values on the GPU inside the loop and synchronise rarely:

    # before: a sync (DtoH copy + cudaStreamSynchronize) every iteration
    running_loss += loss.item()
    # after: accumulate on the device, read once per N steps / per epoch
    running_loss += loss.detach()
    if step % log_every == 0:
        print(running_loss.item() / log_every); running_loss.zero_()

Also: create tensors directly on the device (`torch.zeros(n, device=device)`, not
`torch.zeros(n).to(device)`), avoid `.cpu()`/`.numpy()`/`print(tensor)`/Python `if tensor:` in
the step, and use `torch.cuda.set_sync_debug_mode("warn")` to find the remaining syncs."""

    def __init__(self, config: MemcpyConfig = MemcpyConfig()):
        self.config = config

    def measure(self, windows: Windows) -> Measures:
        t, c = windows.trace, self.config
        w = windows.width_us
        copies = outside_breaks(t, host_copies(t, c.batch_bytes))
        sync = outside_breaks(t, sync_rows(t))
        comp = compute_rows(t)
        copy_us = union_in(windows, *spans(t, copies))
        exposed = copy_us - overlap_in(windows, spans(t, copies), spans(t, comp))
        b0, b1 = sync_bubbles(t, c.sync_tol_us)
        bubble_us = union_in(windows, b0, b1)
        sync_us = union_in(windows, *spans(t, sync))
        host_us = union_in(windows, np.concatenate((t.ts[copies], t.ts[sync])),
                           np.concatenate((t.end[copies], t.end[sync])))
        n_copies = count_in(windows, t.ts[copies])
        n_sync = count_in(windows, t.ts[sync])
        lost = pattern_lost(windows, self.id)
        # Counted per episode (a run of windows the copies and syncs cost idle time in): the
        # gap after a burst of `.item()` calls reaches windows where none starts.
        count = ramp(per_episode(n_copies + n_sync, lost > 0), c.count_lo, c.count_hi)
        # Many syncs in one window are the habit itself (a sync per item of a loop), even when
        # each bubble is short.
        habit = ramp(n_sync, c.many_lo, c.many_hi) * ramp(lost / w, c.habit_lost_lo, c.habit_lost_hi)
        score = np.maximum.reduce([ramp(lost / w, c.lost_lo, c.lost_hi), habit,
                                   c.host_weight * ramp(host_us / w, c.host_lo, c.host_hi)]) * count
        # No measured cost, no finding: syncs that cost the GPU nothing are not the habit.
        score = score * ramp(lost / w, 0.0, c.cost_gate)
        nbytes = sum_in(windows, t.ts[copies], np.nan_to_num(t.bytes[copies]))
        dtoh = count_in(windows, t.ts[copies[t.copy_kind[copies] == CopyKind.DTOH]])
        return {"score": score, "lost_us": lost, "copy_us": copy_us, "exposed_copy_us": exposed,
                "sync_us": sync_us, "bubble_us": bubble_us, "n_copies": n_copies,
                "n_dtoh": dtoh, "n_sync": n_sync, "bytes": nbytes}

    def describe(self, windows: Windows, idx: np.ndarray, m: Measures) -> tuple[str, dict]:
        t = windows.trace
        s = {k: float(m[k][idx].sum()) for k in ("copy_us", "exposed_copy_us", "sync_us",
                                                  "bubble_us", "n_copies", "n_dtoh", "n_sync",
                                                  "bytes")}
        ops = rows_in_windows(windows, rows_named(t, SCALAR_OPS), idx)
        callers = top_names(t, ops, k=2)
        syncs = top_names(t, rows_in_windows(windows, sync_rows(t), idx), k=2)
        parts = []
        if s["n_copies"]:
            parts.append(f"{int(s['n_copies'])} host<->device copies ({int(s['n_dtoh'])} DtoH, "
                         f"{fmt_bytes(s['bytes'])}, {fmt_us(s['copy_us'])}, "
                         f"{fmt_us(s['exposed_copy_us'])} not overlapped by compute)")
        if s["n_sync"]:
            what = ", ".join(f"{n} x{c}" for n, c, _ in syncs)
            parts.append(f"{int(s['n_sync'])} host-blocking syncs ({what}; {fmt_us(s['sync_us'])})")
        text = " and ".join(parts) or "host<->device traffic"
        if callers:
            text += " from " + ", ".join(f"{n} x{c}" for n, c, _ in callers)
        if s["n_sync"]:
            text += (f"; the GPU then idled {fmt_us(s['bubble_us'])} waiting for the next launch "
                     f"(a sync that fetched nothing is charged at most the time the host waited "
                     f"in it)")
        return text, {k: round(v, 1) for k, v in s.items()}

    def title_for(self, numbers: dict) -> str:
        if not numbers.get("n_copies"):
            return "Host-blocking synchronisations (.item(), .cpu(), torch.cuda.synchronize)"
        if not numbers.get("n_sync"):
            return "Frequent host<->device copies (.cpu(), torch.tensor(..., device=...))"
        return self.title

    def supported(self, numbers: dict) -> bool:
        return (numbers.get("time_lost_us", 0.0) > 0
                and numbers.get("n_copies", 0) + numbers.get("n_sync", 0) > 0)


def per_episode(values: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Per window: the sum of `values` over its run of consecutive `active` windows (its own
    value where it is not active)."""
    active = np.asarray(active, dtype=bool)
    if not active.any():
        return np.asarray(values, dtype=np.float64).copy()
    starts = active & ~np.r_[False, active[:-1]]
    run = np.cumsum(starts)
    sums = np.bincount(run[active], weights=np.asarray(values, float)[active],
                       minlength=run.max() + 1)
    return np.where(active, sums[run], values)


def outside_breaks(trace, rows: np.ndarray) -> np.ndarray:
    """Rows that do not start inside a torch.compile graph break (whose copies and syncs are
    the break's: `.item()` between compiled regions is a graph break, not a memcpy habit)."""
    g0, g1 = compile_gaps(trace)
    if not len(g0) or not len(rows):
        return rows
    s, e = merged_intervals(g0, g1)
    at = trace.ts[rows]
    j = np.searchsorted(s, at, side="right") - 1
    inside = (j >= 0) & (at < e[np.maximum(j, 0)])
    return rows[~inside]


PATTERN = ExcessiveMemcpy()
