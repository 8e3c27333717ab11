"""The events that prove a finding: the rows each rule lists under its evidence in the report.

A rule's `proof_events(trace, runs, limit)` (default on `AntiPattern`: the longest GPU events)
picks the events of its mechanism inside `runs`, the merged (start, end) of a finding's windows,
and returns a caption (what the rows are) and rows with ``t_ms`` (from the trace start),
``dur_us``, ``kind``, ``name``, ``where`` (stream or thread) and ``detail``.  The helpers here
are shared by the rules; the report only draws the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..measures.signals import outer_cpu_ops
from ..trace import Kind, Trace, merged_intervals
from ..units import fmt_us

#: (caption, rows): what `AntiPattern.proof_events` returns.
Proof = tuple[str, list[dict]]


def merge_spans(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint (start, end) runs covering the given spans."""
    s, e = merged_intervals(np.array([float(a) for a, _ in spans]),
                            np.array([float(b) for _, b in spans]))
    return list(zip(s.tolist(), e.tolist()))


def in_runs(trace: Trace, runs: list[tuple[float, float]]) -> np.ndarray:
    """Per row of the trace: the event overlaps one of `runs` (sorted and disjoint)."""
    # An event overlaps a run iff the last run starting before the event ends is still open
    # when the event starts.
    r_start = np.array([a for a, _ in runs])
    r_end = np.array([b for _, b in runs])
    j = np.searchsorted(r_start, trace.end, side="left") - 1
    return (j >= 0) & (r_end[np.maximum(j, 0)] > trace.ts)


def longest_first(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """`rows` by duration, longest first (stable: ties keep trace order)."""
    return rows[np.argsort(-trace.dur[rows], kind="stable")]


def named_rows(trace: Trace, in_range: np.ndarray, wanted) -> np.ndarray:
    """Rows in range whose name satisfies `wanted(name)`, longest first."""
    names = np.array([wanted(n) for n in trace.names], dtype=bool)
    rows = (np.flatnonzero(in_range & names[trace.name]) if len(trace.names)
            else np.zeros(0, int))
    return longest_first(trace, rows)


def event_rows(trace: Trace, rows: np.ndarray, limit: int, detail: str | None = None,
               hidden: dict[int, float] | None = None) -> list[dict]:
    """The first `limit` of `rows` as report rows; `detail` adds the copy size ("bytes") or
    the collective's element count ("nelems"); `hidden` the share of a row compute hides."""
    t = trace
    t0 = t.span[0]
    names = t.names_array
    hidden = hidden or {}
    out = []
    for r in rows[:limit]:
        r = int(r)
        gpu_side = t.stream[r] >= 0
        extra = ""
        if detail == "bytes" and np.isfinite(t.bytes[r]):
            extra = f"{t.bytes[r] / 1e6:.2f} MB"
        elif detail == "nelems" and t.comm_nelems[r] >= 0:
            extra = f"{int(t.comm_nelems[r]):,} elements"
        if r in hidden:
            extra = (extra + "; " if extra else "") + f"{hidden[r] * 100:.0f}% hidden by compute"
        if gpu_side and np.isfinite(t.launch_delay[r]):
            extra = ((extra + "; " if extra else "")
                     + f"launched {fmt_us(t.launch_delay[r])} earlier")
        out.append({"t_ms": (t.ts[r] - t0) / 1e3, "dur_us": float(t.dur[r]),
                    "kind": Kind(int(t.kind[r])).name.lower(), "name": str(names[t.name[r]]),
                    "where": f"stream {t.stream[r]}" if gpu_side else f"thread {t.tid[r]}",
                    "detail": extra})
    return out


def longest_gpu_events(trace: Trace, runs: list[tuple[float, float]], limit: int) -> Proof:
    """The default proof: the longest GPU events (kernels, copies, memsets) in the runs."""
    gpu = trace.gpu_work_rows
    rows = longest_first(trace, gpu[in_runs(trace, runs)[gpu]])
    return "Longest GPU events in this range", event_rows(trace, rows, limit)


def gaps_and_ops(trace: Trace, runs: list[tuple[float, float]], limit: int) -> list[dict]:
    """The longest GPU idle gaps inside the runs (at most `limit // 2`), each with the two CPU
    ops that ran longest meanwhile."""
    t = trace
    starts, ends = [], []
    for a, b in runs:  # GPU idle gaps inside each run of windows
        gpu = t.gpu_work_rows
        gpu = gpu[(t.ts[gpu] < b) & (t.end[gpu] > a)]
        s, e = merged_intervals(np.clip(t.ts[gpu], a, b), np.clip(t.end[gpu], a, b))
        starts.append(np.concatenate(([a], e)))
        ends.append(np.concatenate((s, [b])))
    starts, ends = np.concatenate(starts), np.concatenate(ends)
    gap = ends - starts
    t0 = t.span[0]
    out = []
    outer = outer_cpu_ops(t)
    for i in np.argsort(-gap, kind="stable")[:max(limit // 2, 1)]:
        if gap[i] <= 0:
            break
        g0, g1 = starts[i], ends[i]
        ops = outer[(t.ts[outer] < g1) & (t.end[outer] > g0)]
        busy = np.minimum(t.end[ops], g1) - np.maximum(t.ts[ops], g0)
        top = ops[np.argsort(-busy, kind="stable")[:2]]
        out.append({"t_ms": (g0 - t0) / 1e3, "dur_us": float(gap[i]), "kind": "GPU idle",
                    "name": "no kernel, copy or memset running", "where": "GPU",
                    "detail": "CPU meanwhile: " + (", ".join(t.name_of(int(r)) for r in top)
                                                   or "nothing traced")})
    return out
