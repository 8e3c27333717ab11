"""One output: plan a pattern into a base, replay the physics, move the base's events, emit the
new ones, label where the GPU waited, validate, encode.

`inject_one(base, pattern, rng)` returns an `Output` (the JSON bytes, the anomalies) or
raises `Unusable` / `Invalid` with a one-line reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from isal import isal_zlib

from ..patterns._registry import NotApplicable, piece_of
from ..trace import Kind, merged_intervals
from ..windows import covered_time
from .dialect import Factory
from .edit import PH_FLOW_END, PH_FLOW_START, PH_FLOW_STEP, PH_INSTANT, PH_X
from .mechanisms import Base, Plan, Unusable
from .mechanisms.base import idle_intervals
from .physics import Result, propagate
from .validate import Columns, Tree, anomalies_outside, compare, describe, offenders, span_of

#: GPU idle shorter than this inside a labelled window is launch latency, not waiting (us).
MIN_GAP_US = 2.0
#: How far past a block's end its GPU idle may reach: the relaunch latency and first op (us).
#: A label stops there when the GPU idles on mostly by the base's own doing (CAUSED_SHARE).
RESUME_PAD_US = 50.0
#: Plans are re-placed at most this many times after dropping instances that did not show.
MAX_REPLANS = 3
#: A host-side plant (a stall, a copy, a slowed stretch) shows only where at least this share
#: of the GPU idle it would be labelled with is idle it caused (gaps that grew against the
#: base): the plant added at least half again the idle the base had there (a slowed stretch of
#: a launch-bound model that idles anyway, 1.8 ms of idle where the base had 1.0 ms, counts).  Planted into a stretch where the GPU idles anyway (a capture trace's long set-up,
#: a server waiting for requests), a stall adds a little to a long wait: labelling the whole
#: wait would call the base's own idle an anomaly that no detector can tell from the base.
CAUSED_SHARE = 1 / 3
#: A plant is not written when more than this share of the GPU idle inside its labels is, in
#: the edited trace, one-off start-up by the idle account (`traceap.idle`: allocator growth,
#: graph capture, module loading, a first step far longer than the rest): analysed, it reads as
#: warm-up, which is not a steady-state anti-pattern (the detectors issue), so labelling it as
#: the pattern would teach and grade the opposite.  Capture traces and two-step runs are all
#: warm-up.
WARMUP_SHARE = 0.5


class Invalid(Exception):
    """The edited trace breaks a structural rule its base kept; it is not written."""


@dataclass
class Output:
    """One injected trace, ready to write (`gz`: the gzip bytes `traceap inject` writes)."""

    pattern: str
    gz: bytes
    anomalies: list            # [(start_us, end_us)] absolute, this pattern
    world_size: int | None = None
    n_instances: int = 0
    result: Result | None = None
    t0: float = 0.0

    @property
    def data(self) -> bytes:
        """The trace's JSON."""
        return isal_zlib.decompress(self.gz, 47)

    def shift_start(self, t: float) -> float:
        """Where a base time that starts something (absolute us) lies in this output."""
        return float(t + self.result.host_shift_start(np.array([t - self.t0]))[0])

    def shift_end(self, t: float) -> float:
        """Where a base time that ends something lies in this output."""
        return float(t + self.result.host_shift_end(np.array([t - self.t0]))[0])


def flow_binding(base: Base) -> np.ndarray:
    """For every flow event, the X event on its thread it sits on (-1 when none)."""
    doc = base.doc
    cached = getattr(doc, "_flow_bound", None)
    if cached is not None:
        return cached
    n = len(doc.events)
    bound = np.full(n, -1, np.int64)
    flows = np.flatnonzero(((doc.ph == PH_FLOW_START) | (doc.ph == PH_FLOW_END) |
                            (doc.ph == PH_FLOW_STEP)) & np.isfinite(doc.ts))
    x = np.flatnonzero((doc.ph == PH_X) & np.isfinite(doc.ts))
    key = doc.thread_key
    for t in np.unique(key[flows]).tolist():
        f = flows[key[flows] == t]
        xr = x[key[x] == t]
        if not len(xr):
            continue
        o = np.lexsort((-np.nan_to_num(doc.dur[xr]), doc.ts[xr]))
        xr = xr[o]
        xs = doc.ts[xr]
        j = np.searchsorted(xs, doc.ts[f], side="left")
        exact = (j < len(xs))
        exact[exact] = xs[j[exact]] == doc.ts[f][exact]
        # a flow sits on the event starting at its time (the outermost one), else on the
        # latest event started before it
        j2 = np.searchsorted(xs, doc.ts[f], side="right") - 1
        pick = np.where(exact, j, j2)
        ok = pick >= 0
        bound[f[ok]] = xr[pick[ok]]
    doc._flow_bound = bound
    return bound


def new_times(base: Base, res: Result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New absolute (ts, end) and dur of every base event, rounded as the trace writes times.

    Everything is computed relative to the trace start and rounded there (integer us in
    2021 traces, ns otherwise), then the start is added back: an absolute epoch time in us
    (~1.7e15) has no room left for rounding in a double.  Unmoved values are kept as read.
    """
    doc, tl = base.doc, base.tl
    t0 = tl.t0
    rel_ts, rel_end = doc.ts - t0, doc.end - t0
    new_ts, new_end = rel_ts.copy(), rel_end.copy()
    timed = ((doc.ph == PH_X) | (doc.ph == PH_INSTANT)) & np.isfinite(doc.ts)
    h = np.flatnonzero(timed & ~doc.is_gpu)
    # shifts at the trace's resolution, added to times at that resolution: two events that
    # end at the same written time still end together (float sums ts + dur may not)
    s0 = _round(doc, res.host_shift_start(rel_ts[h]))
    s1 = _round(doc, res.host_shift_end(rel_end[h]))
    new_ts[h] = _round(doc, rel_ts[h]) + s0
    new_end[h] = _round(doc, rel_end[h]) + s1
    # GPU work: where the replay put it (its duration kept)
    ops = tl.op_event
    new_ts[ops] = _round(doc, res.op_start)
    new_end[ops] = new_ts[ops] + _round(doc, doc.dur[ops])
    # GPU annotations follow the ops of their stream
    ann = np.flatnonzero(timed & doc.is_gpu & ~doc.is_gpu_work)
    if len(ann):
        delta = _round(doc, res.op_start) - _round(doc, tl.start)
        for s in np.unique(doc.gpu_stream[ann]).tolist():
            a = ann[doc.gpu_stream[ann] == s]
            on = np.flatnonzero(tl.op_stream == s)
            if not len(on):
                continue
            o = on[np.argsort(tl.start[on])]
            i0 = np.minimum(np.searchsorted(tl.start[o], rel_ts[a], side="left"), len(o) - 1)
            i1 = np.maximum(np.searchsorted(tl.end[o], rel_end[a], side="right") - 1, 0)
            d0 = delta[o][i0]
            d1 = np.maximum(delta[o][i1], d0)
            new_ts[a] = _round(doc, rel_ts[a]) + d0
            new_end[a] = _round(doc, rel_end[a]) + d1
    # flows move with the event they sit on
    bound = flow_binding(base)
    fl = np.flatnonzero(bound >= 0)
    b = bound[fl]
    new_ts[fl] = _round(doc, rel_ts[fl]) + (new_ts[b] - _round(doc, rel_ts[b]))
    loose = np.flatnonzero(((doc.ph == PH_FLOW_START) | (doc.ph == PH_FLOW_END)) & (bound < 0)
                           & np.isfinite(doc.ts))
    new_ts[loose] = _round(doc, rel_ts[loose]) + _round(doc, res.host_shift_start(rel_ts[loose]))
    new_end = np.maximum(new_end, new_ts)
    # back to absolute; values that did not move stay exactly as read
    moved = new_ts != _round(doc, rel_ts)
    out_ts = np.where(moved, absolute(doc, new_ts, t0), doc.ts)
    moved_end = (new_end != _round(doc, rel_end)) | moved
    out_end = np.where(moved_end, absolute(doc, new_end, t0), doc.end)
    # durations from relative times (an absolute difference loses ns at 1e12 us); events that
    # only moved keep theirs exactly
    stretched = np.abs((new_end - new_ts) - (_round(doc, rel_end) - _round(doc, rel_ts))) > 1e-6
    dur = np.where(stretched, _round(doc, new_end - new_ts), doc.dur)
    dur[ops] = doc.dur[ops]
    return out_ts, np.maximum(out_end, out_ts), dur


def _round(doc, x: np.ndarray) -> np.ndarray:
    return np.rint(x) if doc.ts_is_int else np.round(x, 3)


def absolute(doc, rel: np.ndarray, t0: float) -> np.ndarray:
    """Relative rounded times -> absolute ones as the trace writes them."""
    if doc.ts_is_int:
        return np.rint(rel) + t0  # integers below 2**53: exact
    return np.round(rel + t0, 3)


def realize(base: Base, plan: Plan) -> tuple:
    """Place a plan: propagate, drop instances that do not show, emit. Returns everything."""
    for _ in range(MAX_REPLANS + 1):
        res = propagate(base.tl, plan.blocks)
        new_ts, new_end, new_dur = new_times(base, res)
        f = Factory(base.doc, base.dialect, base.tl.t0)
        for inst in plan.instances:
            inst.spans = inst.emit(f)
        wrap_events(base, f, plan, new_ts, new_end)
        kernels = _kernel_spans(base, new_ts, new_end, f)
        growth = _growth(base, new_ts, new_end)
        shown = [inst for inst in plan.instances if _label(base, inst, kernels, growth)]
        if len(shown) == len(plan.instances):
            _add_caused_idle(base, plan.instances, new_ts, new_end)
            return res, new_ts, new_end, new_dur, f
        if not shown:
            raise Unusable("the planted work does not make the GPU wait anywhere (the GPU "
                           "backlog hides it)")
        plan.instances = shown
        for inst in shown:  # placed again: forget resolved times
            for b in inst.blocks:
                b.t0 = b.t1 = np.nan
    raise Unusable("the planted instances kept hiding behind each other")


#: A gap between base kernels that grew by more than this (us) is waiting the plant caused
#: (the replay reproduces an untouched stretch to ~2 us: rounding and launch jitter).
MIN_GROWTH_US = 20.0


#: Caused gaps of one plant join into one label while at least this share of the joined stretch
#: is caused waiting: the kernels between them ran for less time than the GPU waited, so the
#: stretch reads as waiting (a label at most twice the idle it marks), not as busy windows.
CAUSED_RUN_SHARE = 0.5


def _base_gaps(base: Base) -> tuple[np.ndarray, np.ndarray]:
    """Base kernels of the compute device, and the idle gap each one ends in the base (0 if
    it starts while other work runs).  Computed once per base."""
    cached = getattr(base, "_gaps", None)
    if cached is None:
        doc = base.doc
        k = np.flatnonzero((doc.kind == Kind.KERNEL) & (doc.ph == PH_X)
                           & (doc.device == base.compute[0]))
        cached = (k, _gap_before(doc.ts[k], doc.end[k], base.tl.t0))
        base._gaps = cached
    return cached


def _gap_before(s: np.ndarray, e: np.ndarray, origin: float) -> np.ndarray:
    """Per interval: the idle time just before it, if it starts a busy stretch (else 0); the
    first one's from `origin` (the trace's start: a stall before the first kernel grows it)."""
    o = np.argsort(s, kind="stable")
    reach = np.maximum.accumulate(e[o])
    gap = np.zeros(len(s))
    gap[o[1:]] = np.maximum(s[o[1:]] - reach[:-1], 0.0)
    if len(s):
        gap[o[0]] = max(float(s[o[0]]) - origin, 0.0)
    return gap


def _growth(base: Base, new_ts, new_end) -> tuple[np.ndarray, np.ndarray]:
    """(relative start of each base kernel in the output, how much the idle gap it ends grew
    against the base; 0 below MIN_GROWTH_US), sorted by start."""
    k, base_gap = _base_gaps(base)
    at = new_ts[k] - base.tl.t0
    grown = _gap_before(new_ts[k], new_end[k], base.tl.t0) - base_gap
    grown = np.where(grown > MIN_GROWTH_US, grown, 0.0)
    o = np.argsort(at, kind="stable")
    return at[o], grown[o]


def _caused(growth: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> float:
    """Idle the plant caused in [lo, hi]: the growth of the gaps that end there."""
    at, grown = growth
    i, j = np.searchsorted(at, lo, side="left"), np.searchsorted(at, hi + 1e-6, side="right")
    return float(grown[i:j].sum())


def _add_caused_idle(base: Base, instances: list, new_ts, new_end) -> None:
    """Label the idle a plant caused away from where it was planted.

    A stall the backlog hid still delays the host, so the next step's work starts later
    and the GPU waits there; that wait is the plant's too.  It is found as the growth of the
    idle gap before each base kernel, compared with the base, and given to the instance
    planted last before it, the earliest first, up to the idle that instance added net
    (`_net_caps`): no label claims more idle than its fix gives back.
    """
    k, base_gap = _base_gaps(base)
    instances = [inst for inst in instances if inst.causes_wait]
    if not len(k) or not instances:
        return
    t0 = base.tl.t0
    out_gap = _gap_before(new_ts[k], new_end[k], t0)
    grown = np.flatnonzero(out_gap - base_gap > MIN_GROWTH_US)
    if not len(grown):
        return
    starts = sorted(((min(b.t0 for b in inst.blocks), inst) for inst in instances),
                    key=lambda x: x[0])
    firsts = np.array([s for s, _ in starts])
    at = new_ts[k] - t0
    left = {id(inst): inst.max_caused_us for inst in instances}
    _net_caps(left, starts, at, out_gap, out_gap - base_gap)
    # a gap an instance's label already reaches into is that instance's wait
    labelled = _in_labels(at, out_gap, [iv for inst in instances for iv in inst.intervals])
    caused: dict[int, list] = {id(inst): [] for inst in instances}
    # in time order: an instance's budget goes to the waits right after it
    for i in grown[np.argsort(at[grown], kind="stable")].tolist():
        if labelled[i]:
            continue
        b = at[i]
        a = b - (out_gap[i] - base_gap[i])
        j = int(np.searchsorted(firsts, a + 1e-6, side="right")) - 1
        if j < 0:
            continue
        inst = starts[j][1]
        cap = left[id(inst)]
        if cap <= 0:
            continue
        b = min(b, a + cap)  # the start of the wait: the delay the fix removes comes first
        left[id(inst)] = cap - (b - a)
        caused[id(inst)].append((float(a), float(b)))
    for inst in instances:
        inst.intervals.extend(_merge_caused(caused[id(inst)]))


def _in_labels(at: np.ndarray, gap: np.ndarray, intervals: list) -> np.ndarray:
    """Per idle gap (ending at `at`, `gap` long): whether one of `intervals` reaches into it."""
    hit = np.zeros(len(at), dtype=bool)
    for x, y in intervals:
        hit |= (x < at + 1e-6) & (at - gap < y)
    return hit


def _net_caps(left: dict, starts: list, at: np.ndarray, gap: np.ndarray,
              change: np.ndarray) -> None:
    """Set each instance's budget of caused wait to the idle it added later, net: the change of
    the gaps before the base kernels from its start to the next instance's (grown ones less
    shrunk ones), less the growth of those its own label reaches into; never above its own cap
    (`Instance.max_caused_us`).  A plant whose host delay only moves the base's own later gaps
    (a `loss.item()` that drains the device with or without grad_accum's round: the relaunch
    after it comes as late either way; a DataParallel scatter on a rank whose GPU idles most of
    each step), or lands where the base's GPU idled anyway, adds no idle there, and the gaps
    that grew are offset by gaps that shrank: its fix gives back nothing of them."""
    for j, (first, inst) in enumerate(starts):
        end = starts[j + 1][0] if j + 1 < len(starts) else np.inf
        here = (at >= first) & (at < end)
        own = here & _in_labels(at, gap, inst.intervals)
        net = max(float(change[here].sum()) - float(np.clip(change[own], 0.0, None).sum()), 0.0)
        cap = left[id(inst)]
        left[id(inst)] = net if cap is None else min(cap, net)


def _merge_caused(gaps: list) -> list:
    """Caused gaps (in time order) joined into one label while the plant caused at least
    CAUSED_RUN_SHARE of it: a host delay that reaches the GPU at every launch-bound kernel of the
    next stretch makes one 20-150 us gap per kernel with the kernels' runs between them
    (hundreds per trace on HTA's TorchRec and DLRM ranks), one stretch the fix removes."""
    out: list = []
    idle = 0.0
    for a, b in gaps:
        if out and (idle + (b - a)) >= CAUSED_RUN_SHARE * (b - out[-1][0]):
            out[-1] = (out[-1][0], max(out[-1][1], b))
            idle += b - a
        else:
            out.append((a, b))
            idle = b - a
    return out


def wrap_events(base: Base, f: Factory, plan: Plan, new_ts, new_end) -> None:
    """cpu_op ranges over runs of base rows (`Instance.wrap`), at the rows' new times."""
    thread = base.main_key
    for inst in plan.instances:
        for a, b, name in inst.wrap or ():
            ea, eb = base.doc.row_event[a], base.doc.row_event[b]
            f.host(Kind.CPU_OP, name, new_ts[ea] - base.tl.t0, new_end[eb] - base.tl.t0, thread)


def _union(intervals: list) -> list:
    """Overlapping or touching intervals merged (input sorted by start)."""
    out: list = []
    for a, b in intervals:
        if out and a <= out[-1][1] + 1e-6:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _kernel_spans(base: Base, new_ts, new_end, f: Factory) -> tuple[np.ndarray, np.ndarray]:
    """Relative (start, end) of every kernel of the output on the compute device, sorted by
    start."""
    doc, tl = base.doc, base.tl
    dev = base.compute[0]
    k = np.flatnonzero((doc.kind == Kind.KERNEL) & (doc.ph == PH_X) & (doc.device == dev))
    s = [new_ts[k] - tl.t0]
    e = [new_end[k] - tl.t0]
    for ev, row in zip(f.events, f.rows):
        if row[0] == Kind.KERNEL and row[3] is not None and row[3][0] == dev:
            a = float(ev.ts) - tl.t0
            s.append(np.array([a]))
            e.append(np.array([a + float(ev.dur)]))
    s, e = np.concatenate(s), np.concatenate(e)
    o = np.argsort(s, kind="stable")
    return s[o], e[o]


def _label(base: Base, inst, kernels, growth) -> bool:
    """Fill `inst.intervals` (relative us); False when the GPU did not wait where planted, or
    (host-side plants) when most of the idle there was the base's own (CAUSED_SHARE)."""
    ks, ke = kernels
    if inst.label == "work":
        # GPU work that is the anomaly itself, not a wait (slowed kernels, added transposes,
        # per-parameter kernels): exactly the spans `emit` returned, no base idle around them
        inst.intervals = [(float(a), float(b)) for a, b in inst.spans if b > a]
        return bool(inst.intervals)
    if inst.label == "span":
        # the collective's span, and the compute idle it causes around it: the gap it starts
        # at the end of (waiting to start behind earlier communication) and the gaps after it
        # (launches its host calls delayed).  Not the gaps before that: the compute queued ahead
        # of it on the stream ran as in the base (a deep queue puts tens of ms between the host
        # call and the collective's kernel, and a label reaching back to the call graded those
        # busy windows as the anomaly).
        out = []
        lo_b = min(b.t0 for b in inst.blocks)
        for a, b in inst.spans:
            if b <= a:
                continue
            gs, ge = idle_intervals(ks, ke, lo_b, max(b, max(x.t1 for x in inst.blocks)) + RESUME_PAD_US)
            keep = ((ge - gs) >= MIN_GAP_US) & (ge >= a - 1e-6)
            lo = min([a] + gs[keep].tolist())
            hi = max([b] + _gap_ends(ge[keep], ks).tolist())
            out.append((float(lo), float(hi)))
        inst.intervals = out
        return bool(out)
    if inst.label == "stretch":
        lo = min(b.t0 for b in inst.blocks)
        hi = max(b.t1 for b in inst.blocks) + RESUME_PAD_US
        gs, ge = idle_intervals(ks, ke, lo, hi)
        keep = (ge - gs) >= MIN_GAP_US
        gs, ge = gs[keep], ge[keep]
        if not len(gs) or (ge - gs).sum() < inst.min_idle_us:
            return False
        a, b = _caused_label(growth, _first_caused(growth, gs, ge, ks),
                             float(_gap_ends(ge[-1:], ks)[0]), hi, ks, ke)
        if b is None:
            return False
        inst.intervals = [(a, b)]
        return True
    out = []
    for blk in inst.blocks:
        hi = blk.t1 + RESUME_PAD_US
        gs, ge = idle_intervals(ks, ke, blk.t0, hi)
        keep = (ge - gs) >= MIN_GAP_US
        gs, ge = gs[keep], ge[keep]
        if not len(gs) or (ge - gs).sum() < inst.min_idle_us:
            return False
        a, b = _caused_label(growth, _first_caused(growth, gs, ge, ks),
                             float(_gap_ends(ge[-1:], ks)[0]), hi, ks, ke)
        if b is None:
            return False
        out.append((a, b))
    inst.intervals = out
    return True


def _first_caused(growth, gs: np.ndarray, ge: np.ndarray, ks: np.ndarray) -> float:
    """Where a host-side plant's label starts: the first of its idle gaps that grew against the
    base (the GPU ran out of queued work), not a base gap of a few us while the queue drained
    (behind a deep queue a blocking sync or a stall starts idling the GPU only once the work
    queued ahead of it has run: before, the label began at the first base gap after the host
    call and took the busy drain with it).  The first gap when none grew."""
    at, grown = growth
    end = _next_starts(ge, ks)  # the kernel that ends each gap
    i = np.searchsorted(at, end - 1e-6, side="left")
    ok = i < len(at)
    hit = np.zeros(len(ge), dtype=bool)
    hit[ok] = (np.abs(at[i[ok]] - end[ok]) <= 1e-6) & (grown[i[ok]] > 0)
    j = np.flatnonzero(hit)
    return float(gs[j[0]] if len(j) else gs[0])


def _caused_label(growth, a: float, end: float, hi: float, ks: np.ndarray,
                  ke: np.ndarray) -> tuple[float, float | None]:
    """The label of a host-side plant whose GPU idle starts at `a` and lasts until `end`
    (where the GPU resumes): all of it when the plant caused most of that idle (a stall in a
    busy stretch: the relaunch after it is its wait too), else only up to `hi` (the plant's
    own end and the relaunch pad: the rest of a long gap was the base's); (a, None) when even
    that was mostly the base's own idle."""
    if _mostly_caused(growth, a, end, end, ks, ke):
        return a, end
    b = float(min(end, hi))
    return (a, b) if _mostly_caused(growth, a, b, end, ks, ke) else (a, None)


def _mostly_caused(growth, a: float, b: float, end: float, ks: np.ndarray,
                   ke: np.ndarray) -> bool:
    """Whether the plant caused at least CAUSED_SHARE of the GPU idle in its label [a, b]:
    the growth of the gaps that end in [a, end] (`end`: where the GPU resumes)."""
    gs, ge = idle_intervals(ks, ke, a, b)
    idle = float((ge - gs)[(ge - gs) >= MIN_GAP_US].sum())
    return idle <= 0 or _caused(growth, a, end) >= CAUSED_SHARE * idle


def _next_starts(t: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Per time: the first kernel start at or after it (inf when none); `ks` sorted."""
    i = np.searchsorted(ks, np.asarray(t, dtype=float) - 1e-6, side="left")
    return np.where(i < len(ks), ks[np.minimum(i, len(ks) - 1)], np.inf)


def _gap_ends(t: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Per time: the end of the idle gap that contains it, the next kernel start (itself when
    no kernel starts later); `ks` sorted."""
    t = np.asarray(t, dtype=float)
    n = _next_starts(t, ks)
    return np.where(np.isfinite(n), n, t)


def output_columns(base: Base, new_ts, new_dur, f: Factory) -> Columns:
    """The validator's columns of an output (base events at their new times, then the new)."""
    doc = base.doc
    n_new = len(f.events)
    codes = getattr(base, "_codes", None)
    if codes is None:
        codes = ({k: i for i, k in enumerate(doc.thread_keys)},
                 {k: i for i, k in enumerate(doc.gpu_stream_keys)},
                 {k: i for i, k in enumerate(doc.flow_keys)})
        base._codes = codes
    keys, stream_codes, flow_codes = (dict(c) for c in codes)
    intern = doc._intern
    ph = np.empty(n_new, np.int8)
    kind = np.empty(n_new, np.int8)
    ts = np.empty(n_new)
    dur = np.empty(n_new)
    thread = np.empty(n_new, np.int64)
    stream = np.full(n_new, -1, np.int64)
    corr = np.full(n_new, -1, np.int64)
    flow = np.full(n_new, -1, np.int64)
    work = {int(Kind.KERNEL), int(Kind.GPU_MEMCPY), int(Kind.GPU_MEMSET)}
    linked = work | {int(Kind.CUDA_RUNTIME)}
    for j, (ev, (k, p, tkey, skey, c, fkey)) in enumerate(zip(f.events, f.rows)):
        ph[j], kind[j] = p, k
        ts[j] = float(ev.ts)
        dur[j] = float(ev.dur) if ev.dur is not None else np.nan
        ik = (intern(tkey[0]), intern(tkey[1]))
        thread[j] = keys.setdefault(ik, len(keys))
        if skey is not None and k in work:
            stream[j] = stream_codes.setdefault(tuple(skey), len(stream_codes))
        if k in linked:
            corr[j] = c
        if fkey is not None:
            flow[j] = flow_codes.setdefault(fkey, len(flow_codes))
    base_stream = np.where(doc.is_gpu_work, doc.gpu_stream, -1)
    return Columns(
        ph=np.concatenate((doc.ph, ph)), kind=np.concatenate((doc.kind, kind)),
        ts=np.concatenate((new_ts, ts)),
        dur=np.concatenate((np.where(doc.has_dur, new_dur, np.nan), dur)),
        thread=np.concatenate((doc.thread_key.astype(np.int64), thread)),
        stream=np.concatenate((base_stream.astype(np.int64), stream)),
        correlation=np.concatenate((doc.correlation, corr)),
        flow=np.concatenate((doc.flow_id, flow)))


def base_offenders(base: Base) -> tuple[dict, Tree]:
    """What the base itself breaks, and its call tree (computed once per base)."""
    cached = getattr(base, "_offenders", None)
    if cached is None:
        cols = Columns.of(base.doc)
        cached = (offenders(cols), Tree(cols))
        base._offenders = cached
    return cached


def inject_one(base: Base, pattern: str, rng: np.random.Generator,
               extra_anomalies: list | None = None) -> Output:
    """Plant one pattern into a base; raises `Unusable` or `Invalid` with a reason."""
    how = piece_of("inject", pattern)
    if isinstance(how, NotApplicable):
        raise Unusable(f"{pattern} is not planted by traceap inject: {how.reason}")
    plan = how(base, rng)
    res, new_ts, new_end, new_dur, f = realize(base, plan)
    t0 = base.tl.t0
    anomalies = _union(sorted((a + t0, b + t0) for inst in plan.instances for a, b in inst.intervals))
    cols = output_columns(base, new_ts, new_dur, f)
    lo, hi = span_of(cols)
    # an idle gap that runs to the end of the trace ends where the trace ends
    anomalies = [(max(a, lo), min(b, hi)) for a, b in anomalies if min(b, hi) > max(a, lo)]
    found, tree = base_offenders(base)
    problems = describe(compare(offenders(cols, tree), found))
    problems += anomalies_outside([{"start_us": a, "end_us": b} for a, b in anomalies],
                                  span_of(cols))
    if problems:
        raise Invalid("; ".join(problems))
    gz = base.doc.encode_gz(new_ts, new_dur, f.events, plan.top_changes)
    ws = (plan.top_changes.get("distributedInfo") or {}).get("world_size")
    at = base.doc.absolute_us  # labels leave in the file's clock
    return Output(pattern, gz, [(at(a), at(b)) for a, b in anomalies], world_size=ws,
                  n_instances=len(plan.instances), result=res, t0=at(t0))


def warmup_share_in(trace, intervals: list[tuple[float, float]]) -> float:
    """Share of the GPU idle inside `intervals` (trace clock, us) that the idle account of
    `trace` gives to warm-up (0 when there is no idle there)."""
    from ..idle import measure
    if not intervals:
        return 0.0
    s, e = merged_intervals(np.array([a for a, _ in intervals], np.float64),
                            np.array([b for _, b in intervals], np.float64))
    acc = measure(trace)
    # the account's segments are disjoint: all of them covered in the labels is the idle there
    f = covered_time(acc.seg_start, acc.seg_end, np.concatenate((s, e)))
    idle = float(np.sum(f[len(s):] - f[:len(s)]))
    return acc.time_in("warmup", s, e) / idle if idle > 0 else 0.0


__all__ = ["Invalid", "Output", "WARMUP_SHARE", "inject_one", "new_times", "output_columns",
           "realize", "warmup_share_in"]
