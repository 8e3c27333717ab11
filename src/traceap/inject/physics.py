"""The delay model: how host stalls and new GPU work move the rest of a real trace.

A trace is a queue system: the host launches GPU work, each stream runs its work in order,
and the host waits for the GPU only at blocking calls.  An edit is a list of `Block`s, each
placed at an original host time T on one thread: host work (`Busy`), launches of new GPU
work (`Launch`), blocking waits (`Sync`) and cross-stream waits (`Barrier`).  `propagate`
replays the trace in launch order with these rules:

* host: every host event at or after T moves by the time the block took; events spanning T
  are stretched (the shift is one step function per process; it drops only at blocking calls
  that waited in the base, below, and events spanning such a drop shrink by it);
* GPU: an op starts at max(its original start, its launch + its launch latency, the end of
  the previous op on its stream, the end of the other-stream op it waited for + the same
  gap, any barrier) -- so a stall moves only work launched after it, work already queued
  drains first, and new work on a stream delays what follows it.  What bound an op in the
  base keeps binding it: a launch-bound op keeps its own latency, a queued one its gap
  behind its stream (and the trace's smallest latency); an op that started right when
  another stream's op ended waited for it (an event wait the trace does not show) and still
  does; one that waited for something the trace does not show (another rank) keeps its base
  start as the floor.  Untouched stretches replay to ~2 us;
* blocking calls (device/stream/event syncs, copies that outlive their call) end when the
  GPU work they wait for ends; that is where a GPU delay reaches the host again, and where a
  host delay the queue hid is taken back: the shift drops by up to the time the call waited
  in the base.  Mechanisms place stalls where the GPU backlog is small (`backlog_at`), so
  that they show.

Times are microseconds relative to the trace start (`Timeline.t0`) while computing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trace import SYNC_CALLS, Kind
from .edit import Doc

#: Runtime calls in SYNC_CALLS that do not block the host (the wait happens on the GPU).
GPU_SIDE_WAITS = frozenset({"cudaStreamWaitEvent", "hipStreamWaitEvent"})
#: Return latency of a blocking call after the GPU work it waits for ends, when the trace has
#: no waiting call to measure it on (CUDA sync return latency is a few us on A100/H100).
DEFAULT_SYNC_RETURN_US = 3.0
#: An op "waited" when it started this much after both its launch and its stream (us) ...
WAIT_SLACK_US = 2.0
#: ... and another stream's op had ended at most this long before (us): the event latency.
WAIT_MATCH_US = 15.0
#: An op that started this long after its launch onto an idle stream waited for something else
#: (another stream's event the trace does not match, another rank), not for its launch: launch
#: latency is 5-50 us (HTA's kernel-launch stats), a thousand-fold less than the 37-41 ms such
#: ops of HTA's trace_diff rank waited.  The bundled CNN and test traces have none.
MAX_LAUNCH_LATENCY_US = 1000.0
#: `Timeline.sync_stream` of a blocking call that waited for no stream the trace shows (-1: the
#: whole device).
WAITS_FOR_NONE = -2
#: Launch latency of new GPU work when the trace gives no better number (empty-queue launch
#: latency of cudaLaunchKernel is ~5-10 us on recent NVIDIA GPUs: HTA's kernel-launch stats).
DEFAULT_LAUNCH_LATENCY_US = 6.0


# -- what an edit inserts ---------------------------------------------------------------------
@dataclass
class Busy:
    """The host is busy for `dur` us (new CPU ops, Python, a collate, ...)."""

    dur: float
    t0: float = np.nan
    t1: float = np.nan


@dataclass
class Launch:
    """A runtime call of `rt_dur` us launching one GPU op of `gpu_dur` us on `stream`.

    `after_stream`: the op also waits for the work queued on that stream (an event wait, as
    DDP's all-reduce waits for the gradients).  `blocking`: the call returns only when the op
    is done (pageable copies, cudaMemcpy).
    """

    rt_dur: float
    stream: int
    gpu_dur: float
    after_stream: int | None = None
    blocking: bool = False
    t0: float = np.nan
    t1: float = np.nan
    gpu_t0: float = np.nan
    gpu_t1: float = np.nan


@dataclass
class Sync:
    """A blocking wait for `stream` (None: the whole device); the call lasts at least `min_dur`."""

    stream: int | None
    min_dur: float
    t0: float = np.nan
    t1: float = np.nan


@dataclass
class Barrier:
    """The next op on `stream` may not start before `launch`'s GPU op ends (cudaStreamWaitEvent)."""

    stream: int
    launch: Launch


@dataclass
class Block:
    """New host activity at original time `T` (relative us) on thread `thread` (doc code)."""

    T: float
    thread: int
    steps: list = field(default_factory=list)
    tag: object = None
    t0: float = np.nan   # new time of the block's start
    t1: float = np.nan   # new time of its end

    def add(self, step):
        """Append a step and return it."""
        self.steps.append(step)
        return step


# -- the base trace, as the model sees it ------------------------------------------------------
class Timeline:
    """GPU ops, launches and blocking calls of one base trace, ready for `propagate`."""

    def __init__(self, doc: Doc):
        self.doc = doc
        tr = doc.trace
        ev_of = doc.row_event
        self.t0 = float(np.nanmin(doc.ts[np.isfinite(doc.ts)])) if len(doc.ts) else 0.0
        rows = tr.gpu_work_rows
        self.op_rows = rows
        self.op_event = ev_of[rows]
        self.op_stream = doc.gpu_stream[self.op_event].astype(np.int64)
        self.n_streams = len(doc.gpu_stream_keys)
        start = tr.ts[rows] - self.t0
        dur = tr.dur[rows]
        launch = tr.launch[rows]
        linked = launch >= 0
        L = np.full(len(rows), np.nan)
        L[linked] = tr.ts[launch[linked]] - self.t0
        lat = start[linked] - L[linked]
        # The smallest launch latency the trace shows: no op can start sooner after its launch.
        self.lat_min = float(np.min(lat)) if len(lat) else 0.0
        ok = lat[lat >= 0]
        self.lat_new = (float(np.clip(np.percentile(ok, 10), 2.0, 20.0)) if len(ok)
                        else DEFAULT_LAUNCH_LATENCY_US)
        self.linked_fraction = float(linked.mean()) if len(rows) else 0.0
        L_eff = np.where(linked, L, start - max(self.lat_min, 0.0))
        # Work on one stream runs in launch order: make the key monotone along each stream.
        key = L_eff.copy()
        by_stream = np.lexsort((start, self.op_stream))
        for s in np.unique(self.op_stream):
            idx = by_stream[self.op_stream[by_stream] == s]
            key[idx] = np.maximum.accumulate(L_eff[idx])
        order = np.lexsort((start, key))
        self.order = order
        self.start, self.dur, self.end = start, dur, start + dur
        self.L = L
        #: the launch time an op is moved by: its runtime call's, or (unlinked) its start
        #: minus the smallest launch latency
        self.L_eff = L_eff
        self.key = key
        pid_of_launch = np.full(len(rows), -1, np.int64)
        pid_of_launch[linked] = tr.pid[launch[linked]]
        self.main_thread = self._main_thread()
        self.main_pid = int(doc.thread_pid[self.main_thread]) if self.main_thread >= 0 else -1
        self.by_main = (pid_of_launch == self.main_pid) | ~linked
        self._syncs(tr)
        self._waits()
        self.compute_stream = self._compute_stream()

    def _main_thread(self) -> int:
        """The thread with the ProfilerStep annotations, else the one launching most work."""
        doc, tr = self.doc, self.doc.trace
        steps = [i for i, n in enumerate(doc.names) if n.startswith("ProfilerStep#")]
        if steps:
            ev = np.flatnonzero(np.isin(doc.name, steps) & (doc.ph == 0))
            if len(ev):
                return int(np.bincount(doc.thread[ev]).argmax())
        rt = np.isin(tr.kind, (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER))
        ev = doc.row_event[np.flatnonzero(rt)]
        if not len(ev):
            cpu = doc.row_event[np.flatnonzero(tr.kind == Kind.CPU_OP)]
            return int(np.bincount(doc.thread[cpu]).argmax()) if len(cpu) else -1
        return int(np.bincount(doc.thread[ev]).argmax())

    def _waits(self) -> None:
        """Ops that waited for work on another stream (an event wait the trace does not show).

        An op that started well after both its launch and its stream's previous op, right
        when an op of another stream ended, waited for that op (cudaStreamWaitEvent: DDP's
        all-reduce waits for the gradients, the optimizer for the all-reduce).  When that op
        moves, this one moves with it.
        """
        n = len(self.start)
        self.dep = np.full(n, -1, np.int64)
        self.dep_gap = np.zeros(n)
        self.lat = np.full(n, self.lat_min)
        self.stream_gap = np.zeros(n)  # how long after its stream's previous op it starts
        if n < 2:
            return
        by = np.lexsort((self.start, self.op_stream))
        prev_end = np.full(n, -np.inf)  # latest end of the ops before it on its stream
        for s in np.unique(self.op_stream).tolist():
            on = by[self.op_stream[by] == s]
            pe = np.maximum.accumulate(self.end[on])
            prev_end[on[1:]] = pe[:-1]
        launch_ok = np.where(np.isfinite(self.L), self.L + self.lat_min, -np.inf)
        expected = np.maximum(launch_ok, prev_end)
        slack = self.start - expected
        # What bound an op's start in the base keeps binding it.  Its launch, when the stream
        # was idle as the launch arrived (or freed up within WAIT_SLACK_US of it): it keeps its
        # own launch latency (that varies by tens of us; one beyond MAX_LAUNCH_LATENCY_US is a
        # wait, below).  Its stream, when it was queued behind the op before it: it keeps its
        # gap behind that op (the GPU's few us between queued kernels, up to the event latency
        # WAIT_MATCH_US as for another stream's op), so a host delay is absorbed by the queue.
        # A queued op that started later than that waited for something else: another
        # stream's op (below) or something the trace does not show (another rank: an NCCL
        # kernel's peers, the compute waiting for it).  That wait is kept against what it
        # waited for, not against its launch: another stream's op moves it, an unseen cause
        # does not (its base start stays the floor).  Taken as launch-bound, its own latency
        # (158 ms on HTA's TorchRec rank) moved it, and all queued behind it, by every host
        # delay.
        lat_own = self.start - self.L
        launch_bound = (np.isfinite(lat_own) & (launch_ok + WAIT_SLACK_US > prev_end)
                        & (lat_own <= MAX_LAUNCH_LATENCY_US))
        self.lat = np.where(launch_bound, np.maximum(lat_own, self.lat_min), self.lat_min)
        behind = self.start - prev_end
        self.stream_gap = np.where(~launch_bound & (behind <= WAIT_MATCH_US),
                                   np.maximum(behind, 0.0), 0.0)
        waited = np.flatnonzero(slack > WAIT_SLACK_US)
        if not len(waited):
            return
        best = np.full(len(waited), -np.inf)
        who = np.full(len(waited), -1, np.int64)
        for s in np.unique(self.op_stream).tolist():
            on = np.flatnonzero(self.op_stream == s)
            on = on[np.argsort(self.end[on], kind="stable")]
            e = self.end[on]
            j = np.searchsorted(e, self.start[waited] + 0.5, side="right") - 1
            ok = (j >= 0) & (self.op_stream[waited] != s)
            cand = np.where(ok, e[np.maximum(j, 0)], -np.inf)
            better = cand > best
            best = np.where(better, cand, best)
            who = np.where(better, on[np.maximum(j, 0)], who)
        hit = (who >= 0) & (self.start[waited] - best <= WAIT_MATCH_US)
        self.dep[waited[hit]] = who[hit]
        self.dep_gap[waited[hit]] = self.start[waited[hit]] - best[hit]
        self.lat[waited[hit]] = self.lat_min  # its start is explained by the other stream

    def _compute_stream(self) -> int:
        """The stream that runs most non-NCCL kernel time (-1 when there is none)."""
        tr = self.doc.trace
        kern = (tr.kind[self.op_rows] == Kind.KERNEL) & ~tr.is_nccl[self.op_rows]
        if not kern.any():
            kern = np.ones(len(self.op_rows), bool)
        if not kern.any():
            return -1
        w = np.bincount(self.op_stream[kern], weights=self.dur[kern], minlength=self.n_streams)
        return int(w.argmax())

    def _syncs(self, tr) -> None:
        """Blocking calls of the main process: what each waits for and how it returns."""
        names = tr.names_array
        t0 = self.t0
        if not len(self.op_rows):  # nothing on the GPU: nothing to wait for
            empty = np.zeros(0)
            self.sync_event = np.zeros(0, np.int64)
            self.sync_ts = self.sync_end = self.sync_eps = self.sync_min = empty
            self.sync_stream = np.zeros(0, np.int64)
            self.eps_new = DEFAULT_SYNC_RETURN_US
            return
        rt = np.flatnonzero(np.isin(tr.kind, (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER))
                            & (tr.pid == self.main_pid))
        by_name = np.array([n in SYNC_CALLS and n not in GPU_SIDE_WAITS for n in tr.names])
        is_sync = by_name[tr.name[rt]] if len(rt) else np.zeros(0, bool)
        # copies whose call outlives the copy: the call blocked on it
        op_of_rt = np.full(len(tr), -1, np.int64)
        linked = np.flatnonzero(tr.launch[self.op_rows] >= 0)
        op_of_rt[tr.launch[self.op_rows[linked]][::-1]] = linked[::-1]  # first op per call
        awaited_op = op_of_rt[rt]
        has = awaited_op >= 0
        j = np.where(has, awaited_op, 0)
        rt_end_rel = tr.ts[rt] + tr.dur[rt] - t0
        blocking_copy = (has & (tr.kind[self.op_rows[j]] == Kind.GPU_MEMCPY)
                         & (rt_end_rel >= self.end[j] - 0.5) & (self.end[j] > tr.ts[rt] - t0))
        keep = is_sync | blocking_copy
        rt, awaited_op, is_copy = rt[keep], awaited_op[keep], blocking_copy[keep]
        ts, end = tr.ts[rt] - t0, tr.ts[rt] + tr.dur[rt] - t0
        device_wide = np.array([("Device" in names[tr.name[r]] or "Ctx" in names[tr.name[r]])
                                for r in rt.tolist()], bool)
        # what the call waited for, in the base: its own copy, or the op (launched before it)
        # that ended last before the call returned
        by_key = np.argsort(self.key, kind="stable")
        pref_end = np.maximum.accumulate(self.end[by_key])
        n_before = np.searchsorted(self.key[by_key], ts, side="right")
        g = np.where(n_before > 0, pref_end[np.maximum(n_before - 1, 0)], -np.inf)
        stream = np.full(len(rt), -1, np.int64)
        own = (awaited_op >= 0) & is_copy
        stream[own] = self.op_stream[awaited_op[own]]
        g[own] = self.end[awaited_op[own]]
        # per stream: the last end (among ops launched before the call) not after its return
        by_end = np.argsort(self.end, kind="stable")
        best = np.full(len(rt), -np.inf)
        busy = np.zeros(len(rt), bool)  # some stream was ruled out by work still running
        for s in np.unique(self.op_stream).tolist():
            on = by_end[self.op_stream[by_end] == s]
            e_s, k_s = self.end[on], self.key[on]
            # a stream still running work launched before the call when the call returned is
            # not what the call waited for (it would have waited for that work too): HTA's
            # TorchRec rank returns from a sync 4 us after a compute kernel ends with 47 ms of
            # compute still queued; taken as a compute sync, the replay made it wait for that
            # queue, and every plant before it "caused" 47 ms of idle per step
            by_key = np.argsort(k_s, kind="stable")
            queued_end = np.maximum.accumulate(e_s[by_key])
            n_launched = np.searchsorted(k_s[by_key], ts, side="right")
            pending = np.where(n_launched > 0, queued_end[np.maximum(n_launched - 1, 0)], -np.inf)
            drained = pending <= end + 1.0
            # ops of this stream ended by the call's return, launched before it: the latest
            # such end is at or below the latest end overall, found by walking back a little
            idx = np.searchsorted(e_s, end + 1.0, side="right") - 1
            for _ in range(8):
                bad = (idx >= 0) & (k_s[np.maximum(idx, 0)] > ts)
                if not bad.any():
                    break
                idx = np.where(bad, idx - 1, idx)
            ok = idx >= 0
            cand = np.where(ok, e_s[np.maximum(idx, 0)], -np.inf)
            busy |= np.isfinite(cand) & ~drained
            better = ~own & ~device_wide & drained & (cand > best)
            best = np.where(better, cand, best)
            stream[better] = s
        pick = ~own & ~device_wide & np.isfinite(best)
        # every stream it could have waited for was still busy: it waited for none of them
        stream[~own & ~device_wide & ~pick & busy] = WAITS_FOR_NONE
        g[pick] = best[pick]
        waiting = (g >= ts) & (g <= end + 1.0)
        ret = end - g
        eps = float(np.median(ret[waiting])) if waiting.any() else DEFAULT_SYNC_RETURN_US
        eps = float(np.clip(eps, 0.5, 50.0))
        free = ~waiting
        m_free = float(np.median((end - ts)[free])) if free.any() else 2.0
        self.sync_event = self.doc.row_event[rt]
        self.sync_ts, self.sync_end = ts, end
        self.sync_stream = np.where(device_wide, -1, stream)
        self.sync_eps = np.where(waiting, np.clip(ret, 0.0, None), eps)
        self.sync_min = np.where(waiting, np.minimum(end - ts, m_free), end - ts)
        self.eps_new = eps

    # -- queries -------------------------------------------------------------------------------
    def backlog_at(self, T: np.ndarray) -> np.ndarray:
        """GPU work already queued at host time T (relative us): max queued end - T, >= 0."""
        T = np.asarray(T, dtype=float)
        if not len(self.key):
            return np.zeros_like(T)
        by_key = np.argsort(self.key, kind="stable")
        pref = np.maximum.accumulate(self.end[by_key])
        n = np.searchsorted(self.key[by_key], T, side="left")
        q = np.where(n > 0, pref[np.maximum(n - 1, 0)], -np.inf)
        return np.maximum(q - T, 0.0)


# -- the replay ------------------------------------------------------------------------------
@dataclass
class Result:
    """Where everything went: base op times, the host shift function, new op times (in steps)."""

    op_start: np.ndarray
    op_end: np.ndarray
    start_keys: np.ndarray   # host shift for event starts: value[searchsorted(keys, t, 'right')]
    end_keys: np.ndarray     # ... for event ends: value[searchsorted(keys, t, 'left')]
    values: np.ndarray       # values[0] = 0; values[k + 1] = shift after break k
    blocks: list

    def host_shift_start(self, t: np.ndarray) -> np.ndarray:
        """Shift of host events starting at relative time t."""
        return self.values[np.searchsorted(self.start_keys, t, side="right")]

    def host_shift_end(self, t: np.ndarray) -> np.ndarray:
        """Shift of host events ending at relative time t."""
        return self.values[np.searchsorted(self.end_keys, t, side="left")]


def _stream_ends(tl: Timeline, ops: np.ndarray) -> dict[int, float]:
    """Where each stream's work ends after `ops` (the untouched prefix: as in the base)."""
    last_end: dict[int, float] = {}
    for i in ops.tolist():
        s = int(tl.op_stream[i])
        if tl.end[i] > last_end.get(s, -np.inf):
            last_end[s] = float(tl.end[i])
    return last_end


def _run_block(b: Block, shift: float, last_end: dict[int, float], barrier: dict[int, float],
               tl: Timeline) -> float:
    """Play an inserted block from its time T (moved by `shift`); its end time."""
    t = b.T + shift
    b.t0 = t
    for step in b.steps:
        t = _run_step(step, t, last_end, barrier, tl)
    b.t1 = t
    return t


def _sync_return(tl: Timeline, j: int, shift: float, last_end: dict[int, float]) -> float:
    """When base sync j returns now: no earlier than its own minimum after its (moved) start,
    and not before the stream it waits for (every stream, for a device sync; none for one that
    waited for no stream the trace shows) is done."""
    st = tl.sync_stream[j]
    if st == WAITS_FOR_NONE:
        g = -np.inf
    elif st < 0:
        g = max(last_end.values(), default=-np.inf)
    else:
        g = last_end.get(int(st), -np.inf)
    t_start = tl.sync_ts[j] + shift
    return max(t_start + tl.sync_min[j], g + tl.sync_eps[j])


def propagate(tl: Timeline, blocks: list[Block]) -> Result:
    """Replay the base with `blocks` inserted; fills every step's new times (relative us)."""
    blocks = sorted(blocks, key=lambda b: b.T)
    n = len(tl.order)
    op_start = tl.start.copy()
    op_end = tl.end.copy()
    keys_start: list[float] = []
    keys_end: list[float] = []
    values: list[float] = [0.0]
    if not blocks:
        return Result(op_start, op_end, np.zeros(0), np.zeros(0), np.zeros(1), blocks)
    first_T = blocks[0].T
    order = tl.order
    key = tl.key[order]
    first = int(np.searchsorted(key, first_T, side="left"))
    last_end = _stream_ends(tl, order[:first])
    barrier: dict[int, float] = {}
    shift = 0.0
    # syncs after the first block, in time order
    sy = np.flatnonzero(tl.sync_ts >= first_T)
    sy = sy[np.argsort(tl.sync_ts[sy], kind="stable")]
    sync_ts = tl.sync_ts[sy].tolist() + [np.inf]
    block_T = [b.T for b in blocks] + [np.inf]
    bi = si = 0
    main = tl.by_main
    start_l, dur_l, L_l = tl.start.tolist(), tl.dur.tolist(), tl.L_eff.tolist()
    dep_l, gap_l, lat_l = tl.dep.tolist(), tl.dep_gap.tolist(), tl.lat.tolist()
    sgap_l = tl.stream_gap.tolist()
    done = np.zeros(n, bool)
    done[order[:first]] = True
    done_l = done.tolist()
    stream_l = tl.op_stream.tolist()
    keys_l = key.tolist() + [np.inf]
    order_l = order.tolist()
    k = first
    while True:
        kk = keys_l[k]
        # next thing in time: a block (before ops launched at or after T), a sync (after ops
        # launched at or before its start), or the next op
        if block_T[bi] <= kk and block_T[bi] <= sync_ts[si]:
            if bi == len(blocks):
                break
            b = blocks[bi]
            new_shift = max(shift, _run_block(b, shift, last_end, barrier, tl) - b.T)
            if new_shift > shift:
                keys_start.append(b.T)
                keys_end.append(b.T)
                values.append(new_shift)
                shift = new_shift
            bi += 1
            continue
        if sync_ts[si] < kk:
            j = sy[si]
            need = _sync_return(tl, j, shift, last_end) - tl.sync_end[j]
            # a blocking call that waited in the base absorbs a host delay up to its wait: it
            # returns when the GPU work it waits for is done, as in the base when the GPU is
            # not late (a host delay the queue hid leaves the base's per-step sync less to
            # wait for).  Not one that waited for no stream the trace shows: when it returns
            # is not known, it keeps its length.
            if tl.sync_stream[j] == WAITS_FOR_NONE:
                need = max(need, shift)
            need = max(need, 0.0)
            if need != shift:
                e = float(tl.sync_end[j])
                keys_start.append(e)
                keys_end.append(np.nextafter(e, -np.inf))
                values.append(need)
                shift = need
            si += 1
            continue
        if k >= n:
            break
        i = order_l[k]
        s = stream_l[i]
        b0 = start_l[i]
        Li = L_l[i]
        if main[i]:  # launched by the main process: its launch moved by `shift`
            c = Li + shift + lat_l[i]
            if c > b0:
                b0 = c
        prev = last_end.get(s)
        if prev is not None and prev + sgap_l[i] > b0:
            b0 = prev + sgap_l[i]
        if s in barrier:
            bb = barrier.pop(s)
            if bb > b0:
                b0 = bb
        j = dep_l[i]
        if j >= 0 and done_l[j]:  # it waited for another stream's op: it still does
            c = op_end[j] + gap_l[i]
            if c > b0:
                b0 = c
        done_l[i] = True
        op_start[i] = b0
        e = b0 + dur_l[i]
        op_end[i] = e
        last_end[s] = e
        k += 1
    return Result(op_start, op_end, np.array(keys_start), np.array(keys_end),
                  np.array(values), blocks)


def _run_step(step, t: float, last_end: dict, barrier: dict, tl: Timeline) -> float:
    """Run one block step starting at host time t; returns the host time after it."""
    if isinstance(step, Busy):
        step.t0, step.t1 = t, t + step.dur
        return step.t1
    if isinstance(step, Launch):
        step.t0 = t
        g0 = t + tl.lat_new
        prev = last_end.get(step.stream)
        if prev is not None and prev > g0:
            g0 = prev
        if step.after_stream is not None:
            dep = last_end.get(step.after_stream)
            if dep is not None and dep > g0:
                g0 = dep
        bb = barrier.pop(step.stream, None)
        if bb is not None and bb > g0:
            g0 = bb
        step.gpu_t0, step.gpu_t1 = g0, g0 + step.gpu_dur
        last_end[step.stream] = step.gpu_t1
        step.t1 = t + step.rt_dur
        if step.blocking:
            step.t1 = max(step.t1, step.gpu_t1 + tl.eps_new)
        return step.t1
    if isinstance(step, Sync):
        step.t0 = t
        g = (max(last_end.values(), default=-np.inf) if step.stream is None
             else last_end.get(step.stream, -np.inf))
        step.t1 = max(t + step.min_dur, g + tl.eps_new)
        return step.t1
    if isinstance(step, Barrier):
        v = step.launch.gpu_t1
        barrier[step.stream] = max(barrier.get(step.stream, -np.inf), v)
        return t
    raise TypeError(f"unknown block step {step!r}")


__all__ = ["Barrier", "Block", "Busy", "Launch", "Result", "Sync", "Timeline", "propagate"]
