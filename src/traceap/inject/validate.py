"""Structural checks of a Kineto trace: what an injected trace must satisfy before it is written.

Each check returns the events that break it.  Real traces have quirks of their own (an op
without its runtime call, a python frame that outlives its parent), so an output is judged
against its base: it fails only where it breaks a rule at events the base did not break it
at.  `validate(path)` on any trace lists what that trace breaks.

Checks: every X event has a numeric ts and a dur >= 0; CPU ranges nest per thread; GPU ops
on one stream never overlap; every GPU op links to exactly one runtime call; no duplicate
correlation ids (runtime calls) or flow events; flow points sit on an event of their thread;
labelled anomalies lie inside the trace span.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..load.kineto import _nest
from ..trace import Kind
from .edit import PH_FLOW_END, PH_FLOW_START, PH_FLOW_STEP, PH_INSTANT, PH_X, Doc

#: Kinds whose ranges must nest on their thread (as the loader nests them).
_NESTING = (Kind.CPU_OP, Kind.PYTHON_FUNCTION, Kind.USER_ANNOTATION, Kind.CUDA_RUNTIME,
            Kind.CUDA_DRIVER)
_WORK = (Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET)


@dataclass
class Columns:
    """What the checks read, one entry per event (file order; new events after the base's)."""

    ph: np.ndarray
    kind: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    thread: np.ndarray        # int code of (pid, tid), as the loader interns them
    stream: np.ndarray        # int code of (device, stream) for GPU work, -1 elsewhere
    correlation: np.ndarray
    flow: np.ndarray          # int code of (cat, id) for flow events, -1 elsewhere

    @classmethod
    def of(cls, doc: Doc) -> "Columns":
        """The columns of a parsed trace as it is."""
        stream = np.where(doc.is_gpu_work, doc.gpu_stream, -1)
        return cls(doc.ph, doc.kind, doc.ts, doc.dur, doc.thread_key.astype(np.int64),
                   stream.astype(np.int64), doc.correlation, doc.flow_id)


CHECKS = ("x_numeric", "nesting", "stream_overlap", "launch_link", "duplicate_correlation",
          "duplicate_flow", "flow_on_event")


def offenders(c: Columns, tree: "Tree | None" = None) -> dict[str, set]:
    """Per check, the events (indices) that break it.

    With the `Tree` of the base an edited trace was made from (its events first, at the same
    indices), nesting is checked in O(n) against the base's call tree, and only the new
    events go through the nesting pass.
    """
    if tree is None:
        nesting = _nesting(c)
    else:
        nesting = tree.nesting(c)
        if nesting - tree.base_bad:
            # the fast check is strict (a sibling may legitimately end up inside another, a
            # zero-length one at a shifted boundary): let the full pass decide
            nesting = _nesting(c)
    return {"x_numeric": _x_numeric(c), "nesting": nesting,
            "stream_overlap": _stream_overlap(c), "launch_link": _launch_link(c),
            "duplicate_correlation": _dup_corr(c), "duplicate_flow": _dup_flow(c),
            "flow_on_event": _flow_on_event(c)}


def _x_numeric(c: Columns) -> set:
    x = c.ph == PH_X
    bad = x & (~np.isfinite(c.ts) | ~np.isfinite(c.dur) | (c.dur < 0))
    return set(np.flatnonzero(bad).tolist())


def _nesting(c: Columns) -> set:
    return _nesting_rows(c)


def _nesting_rows(c: Columns, rows: np.ndarray | None = None) -> set:
    rows, parent, bad = _parents(c, rows)
    return set(rows[bad].tolist())


def _parents(c: Columns, rows: np.ndarray | None = None):
    """Nesting rows (sorted as the loader sorts), each one's parent position, and crossings."""
    if rows is None:
        rows = np.flatnonzero((c.ph == PH_X) & np.isin(c.kind, _NESTING) & np.isfinite(c.ts)
                              & np.isfinite(c.dur))
    if not len(rows):
        return rows, np.zeros(0, np.int64), np.zeros(0, bool)
    tol = _tol(c.ts[rows])
    # a range that ends where the next one starts may read back an ulp later: shrink every
    # range by the tolerance so touching ranges do not count as nested
    ts, dur = c.ts[rows], np.maximum(c.dur[rows] - tol, 0.0)
    order = np.lexsort((-dur, ts))
    rows = rows[order]
    cols = {"ts": ts[order], "dur": dur[order],
            "kind": c.kind[rows], "pid": c.thread[rows], "tid": np.zeros(len(rows), np.int64)}
    parent, _ = _nest(cols)
    has = parent >= 0
    end = cols["ts"] + cols["dur"]
    # a range that outlives the range it starts in crosses it
    bad = has.copy()
    bad[has] = end[has] > end[parent[has]] + tol
    return rows, parent, bad


class Tree:
    """The call tree of a base trace: what its edited copies must still nest as."""

    def __init__(self, base: Columns):
        rows, parent, bad = _parents(base)
        self.n = len(base.ts)
        self.base_bad = set(rows[bad].tolist())
        ok = ~bad
        has = (parent >= 0) & ok
        has[has] &= ok[parent[has]]
        self.child = rows[has]
        self.parent = rows[parent[has]]
        # consecutive siblings (same parent, or both roots of one thread), in start order
        par_ev = np.where(parent >= 0, rows[np.maximum(parent, 0)], -1 - base.thread[rows])
        order = np.lexsort((base.ts[rows], par_ev))
        r, pe = rows[order], par_ev[order]
        same = pe[1:] == pe[:-1]
        good = ok[order]
        pair = same & good[1:] & good[:-1]
        self.first, self.second = r[:-1][pair], r[1:][pair]
        # relations the base itself breaks (its quirks, where the nesting pass gets confused)
        # are the base's offenders, not rules for its copies
        tol = _tol(base.ts)
        end = base.ts + np.maximum(base.dur, 0.0)
        keep = ~((base.ts[self.child] < base.ts[self.parent] - tol)
                 | (end[self.child] > end[self.parent] + tol))
        self.child, self.parent = self.child[keep], self.parent[keep]
        keep = end[self.first] <= base.ts[self.second] + tol
        self.first, self.second = self.first[keep], self.second[keep]
        # what the base already overhangs within the tolerance (a writer that rounds each
        # event on its own leaves siblings overlapping by a ns): a copy may keep that, since
        # moving both events re-rounds it, but not make it worse
        self.child_slack = np.maximum.reduce([
            base.ts[self.parent] - base.ts[self.child], end[self.child] - end[self.parent],
            np.zeros(len(self.child))])
        self.sibling_slack = np.maximum(end[self.first] - base.ts[self.second], 0.0)

    def nesting(self, c: Columns) -> set:
        """Nesting offenders of an edited copy (base events first, new ones after)."""
        tol = _tol(c.ts[: self.n])
        end = c.ts + np.maximum(c.dur, 0.0)
        out = set()
        slack = tol + self.child_slack
        bad = ((c.ts[self.child] < c.ts[self.parent] - slack)
               | (end[self.child] > end[self.parent] + slack))
        out |= set(self.child[bad].tolist())
        bad = end[self.first] > c.ts[self.second] + tol + self.sibling_slack
        out |= set(self.second[bad].tolist())
        new = np.flatnonzero((c.ph[self.n:] == PH_X) & np.isin(c.kind[self.n:], _NESTING)) + self.n
        if not len(new):
            return out
        # the new events, with every base event of their threads that overlaps one of them
        rows = [new]
        base_rows = np.flatnonzero((c.ph[: self.n] == PH_X) & np.isin(c.kind[: self.n], _NESTING)
                                   & np.isfinite(c.ts[: self.n]))
        for t in np.unique(c.thread[new]).tolist():
            mine = new[c.thread[new] == t]
            ms, me = _merge(c.ts[mine], end[mine])
            b = base_rows[c.thread[base_rows] == t]
            j = np.searchsorted(ms, end[b], side="left") - 1
            hit = (j >= 0) & (me[np.maximum(j, 0)] > c.ts[b])
            rows.append(b[hit])
        sub = np.concatenate(rows)
        out |= _nesting_rows(c, sub[np.lexsort((-c.dur[sub], c.ts[sub]))])
        return out


def _merge(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    o = np.argsort(s, kind="stable")
    s, e = s[o], np.maximum.accumulate(e[o])
    new = np.r_[True, s[1:] > e[:-1]]
    idx = np.flatnonzero(new)
    return s[idx], np.r_[e[idx[1:] - 1], e[-1]] if len(idx) else e[:0]


def _tol(x: np.ndarray) -> float:
    """Float slack: 1.5 ns, or a few ulps where absolute times leave no room for ns.

    Two times a writer rounded to the ns on their own may be a ns apart where they were equal,
    and a trace clock in us since the epoch (~1.7e12 with ns decimals) keeps ~0.5 ns per ulp,
    so `ts + dur` read back may land a few ulps past the end that was written.
    """
    finite = x[np.isfinite(x)]
    mag = float(np.abs(finite).max()) if len(finite) else 0.0
    return max(1.5e-3, 4 * float(np.spacing(mag)))


def _stream_overlap(c: Columns) -> set:
    rows = np.flatnonzero((c.ph == PH_X) & np.isin(c.kind, _WORK) & (c.stream >= 0))
    if len(rows) < 2:
        return set()
    order = np.lexsort((c.ts[rows], c.stream[rows]))
    rows = rows[order]
    s, ts, end = c.stream[rows], c.ts[rows], c.ts[rows] + c.dur[rows]
    same = s[1:] == s[:-1]
    # the latest end so far on each stream
    prev_end = _segmented_cummax(end, np.r_[True, ~same])
    over = same & (ts[1:] < prev_end[:-1] - _tol(end))
    return set(rows[1:][over].tolist())


def _segmented_cummax(x: np.ndarray, new_seg: np.ndarray) -> np.ndarray:
    """Running max of x restarting where `new_seg` is True."""
    out = x.copy()
    starts = np.flatnonzero(new_seg)
    bounds = np.r_[starts, len(x)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[a:b] = np.maximum.accumulate(x[a:b])
    return out


def _launch_link(c: Columns) -> set:
    gpu = np.flatnonzero((c.ph == PH_X) & np.isin(c.kind, _WORK) & (c.correlation >= 0))
    rt = np.flatnonzero((c.ph == PH_X) & (c.kind == Kind.CUDA_RUNTIME) & (c.correlation >= 0))
    if not len(gpu):
        return set()
    keys = np.sort(c.correlation[rt])
    lo = np.searchsorted(keys, c.correlation[gpu], side="left")
    hi = np.searchsorted(keys, c.correlation[gpu], side="right")
    return set(gpu[(hi - lo) != 1].tolist())


def _dup_corr(c: Columns) -> set:
    out: set = set()
    for kinds in ((Kind.CUDA_RUNTIME,), _WORK):
        rows = np.flatnonzero((c.ph == PH_X) & np.isin(c.kind, kinds) & (c.correlation >= 0))
        v = c.correlation[rows]
        uniq, inv, cnt = np.unique(v, return_inverse=True, return_counts=True)
        out |= set(rows[cnt[inv] > 1].tolist())
    return out


def _dup_flow(c: Columns) -> set:
    rows = np.flatnonzero(c.flow >= 0)
    if not len(rows):
        return set()
    key = c.flow[rows] * 8 + c.ph[rows]
    uniq, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    bad = (cnt[inv] > 1) & (c.ph[rows] != PH_FLOW_STEP)
    return set(rows[bad].tolist())


def _flow_on_event(c: Columns) -> set:
    flows = np.flatnonzero(((c.ph == PH_FLOW_START) | (c.ph == PH_FLOW_END)) & np.isfinite(c.ts))
    if not len(flows):
        return set()
    x = np.flatnonzero(((c.ph == PH_X) | (c.ph == PH_INSTANT)) & np.isfinite(c.ts))
    bad = [flows[~np.isin(c.thread[flows], c.thread[x])]]
    for t in np.unique(c.thread[flows]).tolist():
        f = flows[c.thread[flows] == t]
        xs_rows = x[c.thread[x] == t]
        if not len(xs_rows):
            continue
        order = np.argsort(c.ts[xs_rows], kind="stable")
        xs = c.ts[xs_rows][order]
        reach = np.maximum.accumulate(xs + np.nan_to_num(c.dur[xs_rows][order]))
        j = np.searchsorted(xs, c.ts[f] + 5e-4, side="right") - 1
        ok = j >= 0
        ok[ok] = reach[j[ok]] >= c.ts[f][ok] - 5e-4
        bad.append(f[~ok])
    return set(np.concatenate(bad).tolist())


def anomalies_outside(anomalies: list, span: tuple[float, float]) -> list[str]:
    """Anomalies that do not lie inside the trace span."""
    lo, hi = span
    out = []
    for a in anomalies:
        s, e = (a.start_us, a.end_us) if hasattr(a, "start_us") else (a["start_us"], a["end_us"])
        if not (lo - 1e-3 <= s <= e <= hi + 1e-3):
            out.append(f"anomaly [{s:.3f}, {e:.3f}] lies outside the trace span [{lo:.3f}, {hi:.3f}]")
    return out


def span_of(c: Columns) -> tuple[float, float]:
    """(first start, last end) over timed events."""
    t = (c.ph == PH_X) | (c.ph == PH_INSTANT)
    ts = c.ts[t & np.isfinite(c.ts)]
    end = ts + np.nan_to_num(c.dur[t & np.isfinite(c.ts)])
    return (float(ts.min()), float(end.max())) if len(ts) else (0.0, 0.0)


def describe(found: dict[str, set], limit: int = 3) -> list[str]:
    """One line per broken check."""
    out = []
    for check in CHECKS:
        bad = found.get(check) or set()
        if bad:
            some = ", ".join(str(i) for i in sorted(bad)[:limit])
            out.append(f"{check}: {len(bad)} event(s) (e.g. events {some})")
    return out


def compare(output: dict[str, set], base: dict[str, set]) -> dict[str, set]:
    """What the output breaks beyond what its base already broke (same event indices)."""
    return {k: output[k] - base.get(k, set()) for k in output}


def validate(trace_or_path, anomalies: list | None = None) -> list[str]:
    """Problems of a trace (a path, a parsed `Doc` or `Columns`): one line per broken check."""
    if isinstance(trace_or_path, (str, os.PathLike)):
        cols = Columns.of(Doc(trace_or_path))
    elif isinstance(trace_or_path, Doc):
        cols = Columns.of(trace_or_path)
    else:
        cols = trace_or_path
    lines = describe(offenders(cols))
    if anomalies:
        lines += anomalies_outside(anomalies, span_of(cols))
    return lines


__all__ = ["CHECKS", "Columns", "Tree", "anomalies_outside", "compare", "describe", "offenders",
           "span_of", "validate"]
