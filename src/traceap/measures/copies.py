"""Host<->device copies and host-blocking syncs: which copies are a habit, which are pageable
uploads, and the GPU gap each sync costs.

Measurements of the trace, below both the rules that score them (the host copy/sync rule and
the pageable-copy rule) and the idle account (`traceap.idle`, cause `host_copy_sync`), so that both
count the same copies.  The configs are the rules' configs: one threshold, one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import CopyKind, Kind, MemKind, merged_intervals
from ..windows import covered_time
from .host import HostConfig, unrecorded_host, user_code
from .host_init import init_copies
from .signals import busy_rows, cached, name_mask, starved_gaps, subtract


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
    #: Share of the whole trace that copies and syncs cost the GPU, below which no window
    #: scores in full ("excessive" is a habit of the run, not one data-dependent sync).
    #: Chosen on the real validation split (N = 50/100/200 pooled, `traceap.patterns` rules
    #: alone): off 95.0 / 70.4 window / trace AUC; 0.25-1% 95.2 / 93.4; 0.5-1.5% 95.2 / 94.2;
    #: 0.5-2% 95.2 / 94.1; 1-3% 95.2 / 93.7.  Healthy particle-transformer forwards lose
    #: 0.0-0.9% of the trace to one data-dependent sync; planted habits 0.9-29% (median 14%).
    trace_lo: float = 0.005
    trace_hi: float = 0.015


def host_copies(trace, batch_bytes: float = 64e3) -> np.ndarray:
    """The copies of the habit: every DtoH copy, and HtoD copies smaller than an input batch
    (`torch.tensor(x, device=...)`, per-sample uploads).  Batch uploads are the normal
    once-per-step input transfer (pinned) or the pageable-copy pattern (pageable).  Not the
    uploads of tensors just created on the host (`host_init.init_copies`): their own pattern."""
    def make():
        rows = trace.rows(Kind.GPU_MEMCPY)
        rows = np.setdiff1d(rows, init_copies(trace)[2])
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


def blocking_dtoh_calls(trace, tol_us: float = 0.0) -> np.ndarray:
    """Launch calls of DtoH copies that lasted until the copy ended (within `tol_us`): a
    pageable DtoH, or a copy behind other work, blocked the host like a sync."""
    copies = trace.rows(Kind.GPU_MEMCPY)
    copies = copies[(trace.copy_kind[copies] == CopyKind.DTOH) & (trace.launch[copies] >= 0)]
    calls = trace.launch[copies]
    return calls[trace.end[calls] >= trace.end[copies] - tol_us]


def sync_bubbles(trace, tol_us: float) -> tuple[np.ndarray, np.ndarray]:
    """The price of each host-blocking sync: the starved GPU gap that begins as it returns.

    A sync that fetched values to the host is charged the whole gap that begins as it returns:
    the host then works on what it fetched, and keeping the values on the GPU removes the wait
    and that work.  A bare sync (an event, stream or device sync, nothing fetched) is charged
    at most the time the host blocked in it: 16 event syncs of 3 us do not cost the 8 ms gap
    that follows them.  The later gaps a sync's lost lead causes are `sync_debt`'s."""
    def make():
        g0, g1, _ = starved_gaps(trace)
        rows, fetched = _blocking_calls(trace, tol_us)
        if not len(g0) or not len(rows):
            return np.zeros(0), np.zeros(0)
        ends, waits = trace.end[rows], trace.dur[rows]
        j = np.searchsorted(ends, g1, side="right") - 1  # last sync ending before the gap ends
        ok = j >= 0
        jj = np.maximum(j, 0)
        last = np.where(ok, ends[jj], -np.inf)
        hit = ok & (last >= g0 - tol_us)
        cost = np.where(fetched[jj], g1 - g0, np.minimum(g1 - g0, waits[jj]))
        return g0[hit], (g0 + cost)[hit]
    return cached(trace, f"sync_bubbles:{tol_us}", make)


def _blocking_calls(trace, tol_us: float) -> tuple[np.ndarray, np.ndarray]:
    """(rows, fetched): host-blocking syncs and blocking DtoH launch calls in the order they
    return, and whether each fetched values to the host (`fetch_syncs`; a blocking DtoH did)."""
    def make():
        sync = sync_rows(trace)
        blocking = blocking_dtoh_calls(trace, tol_us)  # blocked like a sync, and fetched
        rows = np.concatenate((sync, blocking))
        fetched = np.concatenate((fetch_syncs(trace, tol_us), np.ones(len(blocking), bool)))
        order = np.argsort(trace.end[rows], kind="stable")
        return rows[order], fetched[order]
    return cached(trace, f"blocking_calls:{tol_us}", make)


def sync_debt(trace, tol_us: float) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the later starved gaps a sync's lost lead accounts for.

    The time the host blocked in a sync is how far it had run ahead of the device: the lead it
    would have kept without the sync.  A host that was far ahead (a deep queue of embedding
    lookups, a compiled graph launched at once) and then runs at the device's pace after the
    sync starves the device in later gaps too, until it would have used that lead up.  Per host
    thread, syncs in the order they return (`_blocking_calls`): each leaves a debt equal to the
    compute the device ran while the host blocked in it (at least what the previous one left
    unpaid: a burst of `.item()` calls loses the lead once).  The gaps that end after it
    returns, before the next one does, and whose ending work that thread launched pay it off in
    order: the one it returns into as in `sync_bubbles` (at least up to the debt), the others
    each up to what is left, charged from their start.  The debt ends with the sync's profiler
    step."""
    return cached(trace, f"sync_debt:{tol_us}", lambda: _sync_debt(trace, tol_us))


def _sync_debt(trace, tol_us: float) -> tuple[np.ndarray, np.ndarray]:
    g0, g1, nxt = starved_gaps(trace)
    rows, fetched = _blocking_calls(trace, tol_us)
    if not len(g0) or not len(rows):
        return np.zeros(0), np.zeros(0)
    # The lead a sync loses is the compute the device still ran while the host waited in it:
    # waiting for a collective (other ranks) or for an idle device is no lead.
    busy = busy_rows(trace)
    bs, be = merged_intervals(trace.ts[busy], trace.end[busy])
    f = covered_time(bs, be, np.concatenate((trace.ts[rows], trace.end[rows])))
    lead = f[len(rows):] - f[:len(rows)]
    # A profiler step is where a sync's lead stops: the lead a step-end `loss.item()` loses
    # would only have carried into the next step's start, the cost every training loop that
    # logs its loss pays, not a habit to flag.  -1: before the first step, or no steps.
    st = sorted(trace.steps, key=lambda x: x.start_us)
    step_lo = np.array([x.start_us for x in st], dtype=np.float64)
    step_hi = np.array([x.end_us for x in st], dtype=np.float64)

    def step_of(x: np.ndarray) -> np.ndarray:
        if not st:
            return np.full(len(x), -1)
        k = np.searchsorted(step_lo, x, side="right") - 1
        return np.where((k >= 0) & (x < step_hi[np.maximum(k, 0)]), k, -1)
    call = trace.launch[nxt]
    gap_tid = np.where(call >= 0, trace.tid[np.maximum(call, 0)], np.iinfo(np.int64).min)
    out0, out1 = [], []
    sync_tid = trace.tid[rows]
    for tid in np.unique(sync_tid):
        mine = gap_tid == tid
        if not mine.any():
            continue
        s0, s1 = g0[mine], g1[mine]
        gap_step = step_of(s0)
        sel = sync_tid == tid
        ends, leads, fet = trace.end[rows[sel]], lead[sel], fetched[sel]
        sync_step = step_of(ends)
        # Segment of sync i: the gaps ending after it returns and before the next one does.
        cut = np.searchsorted(s1, ends, side="right")
        debt = 0.0
        for i in range(len(ends)):
            a = int(cut[i])
            b = int(cut[i + 1]) if i + 1 < len(ends) else len(s1)
            if i and sync_step[i] != sync_step[i - 1]:
                debt = 0.0
            debt = max(debt, float(leads[i]))
            # the gaps of this sync's segment inside its own step (a prefix: both in time order)
            b = a + int(np.sum(gap_step[a:b] == sync_step[i]))
            if a >= b or debt <= 0:
                continue
            seg0, seg1 = s0[a:b], s1[a:b]
            length = seg1 - seg0
            charge = np.zeros(len(length))
            first = 0
            if seg0[0] <= ends[i] + tol_us:  # the gap it returns into, as in sync_bubbles
                charge[0] = length[0] if fet[i] else min(float(length[0]), debt)
                debt -= float(charge[0])
                first = 1
            if debt > 0 and first < len(length):
                rest = length[first:]
                before = np.cumsum(rest) - rest
                charge[first:] = np.clip(debt - before, 0.0, rest)
                debt -= float(rest.sum())
            debt = max(debt, 0.0)
            paid = charge > 0
            out0.append(seg0[paid])
            out1.append(seg0[paid] + charge[paid])
    if not out0:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(out0), np.concatenate(out1)


def sync_costs(trace, tol_us: float, host: HostConfig = HostConfig()
               ) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the GPU idle host-blocking syncs cost: the gap each returns into
    (`sync_bubbles`), and the later starved gaps of the lead it lost (`sync_debt`) where the host
    ran framework calls only.  Where the user's code or unrecorded work held the host up in
    those later gaps (`host.user_code`: Python, ops on host tensors; `host.unrecorded_host`), that
    is named first: it would have eaten the lead too, and it is what the user can see and
    change."""
    def make():
        b0, b1 = sync_bubbles(trace, tol_us)
        h0, h1 = unrecorded_host(trace, host.unrecorded_host_us)
        p0, p1 = user_code(trace, host)
        d0, d1 = subtract(*sync_debt(trace, tol_us), np.r_[h0, p0], np.r_[h1, p1])
        return merged_intervals(np.concatenate((b0, d0)), np.concatenate((b1, d1)))
    return cached(trace, f"sync_costs:{tol_us}:{host!r}", make)


@dataclass(frozen=True)
class PinConfig:
    """Thresholds: share of a window spent in pageable copies or blocked launching them."""

    time_lo: float = 0.01
    time_hi: float = 0.10
    #: A copy smaller than this is a scalar or metadata, not an input batch.
    bytes_lo: float = 64e3
    #: A `Host -> Device` copy (kind unknown) counts when its launch blocked this much of it.
    blocking_share: float = 0.8
    unknown_weight: float = 0.7


def pageable_h2d(trace, config: PinConfig = PinConfig()) -> tuple[np.ndarray, np.ndarray]:
    """(rows, weight): HtoD copies from pageable memory (1.0) or unknown host memory that
    blocked their launch (config.unknown_weight); not the uploads of tensors just created on
    the host (`host_init.init_copies`: their own pattern)."""
    def make():
        rows = trace.rows(Kind.GPU_MEMCPY)
        rows = np.setdiff1d(rows, init_copies(trace)[2])
        rows = rows[trace.copy_kind[rows] == CopyKind.HTOD]
        src = trace.copy_src[rows]
        launch = trace.launch[rows]
        blocked = np.where(launch >= 0, trace.dur[np.maximum(launch, 0)], 0.0)
        sync_like = blocked >= config.blocking_share * trace.dur[rows]
        unknown = np.isin(src, (MemKind.HOST, MemKind.UNKNOWN)) & sync_like
        keep = (src == MemKind.PAGEABLE) | unknown
        return rows[keep], np.where(src[keep] == MemKind.PAGEABLE, 1.0, config.unknown_weight)
    return cached(trace, f"pageable_h2d:{config}", make)
