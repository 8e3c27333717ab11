"""The original trace plus a "traceap findings" track, to open in Perfetto or chrome://tracing.

Every original event is kept as it was; the new track is its own process (``process_name``
"traceap findings", shown first) with one thread per pattern, holding an X slice over each run
of flagged windows of a finding (named by the pattern; evidence, fix, scores and time lost in
its args), and a "window score" counter over the whole trace.
"""

from __future__ import annotations

import gzip
import os
from contextlib import nullcontext
from pathlib import Path

import msgspec
import numpy as np
import orjson

from ..errors import TraceFormatError
from ..load import read_bytes
from ..progress import status
from .html import pattern_title

TRACK_NAME = "traceap findings"
CATEGORY = "traceap"
#: Files above this size get a spinner while they are rewritten.
BIG_FILE_BYTES = 50 * 1024 * 1024


def write_annotated(analysis, trace, out_path: str | os.PathLike) -> Path:
    """Write the trace at ``analysis.trace_path`` with a findings track added to `out_path`.

    `out_path` ending in ``.gz`` is gzip-compressed, anything else is plain JSON.  `trace` is
    the loaded `Trace` (only its path is used when the analysis has none).  For a job's
    analysis (with ``ranks``), `out_path` is a folder that gets one annotated trace per rank.  The original bytes
    of every top-level value and every event are copied as they are: the track is spliced in
    at the end of ``traceEvents``, so nothing is re-encoded and big traces stay fast.
    """
    ranks = getattr(analysis, "ranks", None)
    if isinstance(ranks, list):
        return _write_job(ranks, trace, Path(out_path))
    source = getattr(analysis, "trace_path", None) or getattr(getattr(trace, "meta", None),
                                                              "path", None)
    if not source:
        raise TraceFormatError("the analysis does not say which trace file it came from")
    out = Path(out_path)
    with status(f"annotating {Path(source).name}") if _is_big(source) else nullcontext():
        data = read_bytes(source)
        pids = _used_pids(data, source)
        track = orjson.dumps(findings_events(analysis, _free_pid(pids)))
        parts = _splice(data, track[1:-1], source)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as raw_file:
            sink = (gzip.GzipFile(fileobj=raw_file, mode="wb", compresslevel=5, mtime=0)
                    if out.name.endswith(".gz") else nullcontext(raw_file))
            with sink as fh:
                for part in parts:
                    fh.write(part)
    return out


def _write_job(ranks: list, job, folder: Path) -> Path:
    """A job: `folder` gets one annotated trace per rank, named after the rank's file."""
    if folder.exists() and not folder.is_dir():
        raise TraceFormatError(f"{folder}: for a job, --annotate takes a folder")
    folder.mkdir(parents=True, exist_ok=True)
    traces = list(getattr(job, "traces", job or []))
    for i, a in enumerate(ranks):
        name = Path(a.trace_path).name
        stem, dot, ext = name.partition(".json")
        write_annotated(a, traces[i] if i < len(traces) else None,
                        folder / f"{stem}.traceap{dot}{ext}")
    return folder


class _Pid(msgspec.Struct):
    pid: object = None


class _PidDoc(msgspec.Struct):
    traceEvents: list[_Pid] | None = None  # noqa: N815 - the file's own key


def _used_pids(data: bytes, source) -> set:
    """Every pid an event uses (a light pass that also checks the whole file is valid JSON)."""
    try:
        if data[:4096].lstrip()[:1] == b"[":
            events = msgspec.json.decode(data, type=list[_Pid])
        else:
            events = msgspec.json.decode(data, type=_PidDoc).traceEvents or []
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TraceFormatError(f"{source}: cannot rewrite this trace: {exc}") from None
    return {e.pid for e in events}


def _splice(data: bytes, track: bytes, source) -> list:
    """The output as pieces: the original values (zero-copy views) with `track` appended to
    the event list.  `track` is the comma-separated events, without brackets."""
    try:
        if data[:4096].lstrip()[:1] == b"[":
            return _append(msgspec.json.decode(data, type=msgspec.Raw), track)
        doc = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TraceFormatError(f"{source}: not a JSON trace object ({exc})") from None
    doc.setdefault("traceEvents", msgspec.Raw(b"[]"))
    parts: list = [b"{"]
    for i, (key, value) in enumerate(doc.items()):
        parts += [b"," if i else b"", orjson.dumps(key), b":"]
        parts += _append(value, track) if key == "traceEvents" else [memoryview(value)]
    parts.append(b"}")
    return parts


def _append(events: msgspec.Raw, track: bytes) -> list:
    view = memoryview(events)
    if bytes(view[:1]) == b"n":  # "traceEvents": null
        return [b"[", track, b"]"]
    if bytes(view[:1]) != b"[":
        raise TraceFormatError("traceEvents is not a list")
    body = bytes(view[1:65]).strip()
    empty = body[:1] == b"]"  # "[]" or "[ ]" (whitespace only inside)
    return [view[:-1], b"" if empty else b",", track, b"]"]


def findings_events(analysis, pid: int) -> list[dict]:
    """The events of the findings track: metadata, a score counter, one slice per finding run."""
    windows = list(analysis.windows)
    findings = list(analysis.findings)
    events: list[dict] = [
        _meta("process_name", pid, 0, name=TRACK_NAME),
        _meta("process_sort_index", pid, 0, sort_index=-1),
        _meta("process_labels", pid, 0, labels=f"detector {getattr(analysis, 'detector', '?')}"),
    ]
    for w in windows:
        events.append({"ph": "C", "name": "window score", "pid": pid, "tid": 0,
                       "ts": float(w.start_us), "args": {"score": round(float(w.score), 4)}})
    if windows:
        events.append({"ph": "C", "name": "window score", "pid": pid, "tid": 0,
                       "ts": float(windows[-1].end_us), "args": {"score": 0.0}})

    by_index = {int(w.index): w for w in windows}
    rows: dict[str, list[list[tuple[float, float]]]] = {}  # row name -> lanes of (start, end)
    tids: dict[tuple[str, int], int] = {}
    slices = []
    covered: set[int] = set()
    for k, f in enumerate(findings):
        idx = sorted(int(i) for i in f.windows)
        covered.update(idx)
        for run in _runs(idx):
            ws = [by_index[i] for i in run if i in by_index]
            start = float(ws[0].start_us) if ws else float(f.start_us)
            end = float(ws[-1].end_us) if ws else float(f.end_us)
            scores = [float(w.score) for w in ws]
            conf = [float(w.confidence) for w in ws if w.confidence is not None]
            args = {"pattern": f.pattern, "severity": str(getattr(f, "severity", "") or ""),
                    "evidence": str(f.evidence), "fix": str(f.fix),
                    "time_lost_us": round(float(getattr(f, "time_lost_us", 0.0) or 0.0), 1),
                    "time_lost_per_step_us": _round(getattr(f, "time_lost_per_step_us", None)),
                    "gain_pct": _round(getattr(f, "gain_pct", None), 3),
                    "windows": _ranges(run), "finding": k,
                    "score_max": round(max(scores), 4) if scores else None,
                    "score_mean": round(float(np.mean(scores)), 4) if scores else None,
                    "confidence": round(float(np.mean(conf)), 3) if conf else None}
            if getattr(f, "rank", None) is not None:
                args["rank_in_report"] = f.rank
            expl = getattr(f, "explanation", "") or ""
            if expl:
                args["explanation"] = str(expl)
            # The finding's own title (it says which form of the pattern the evidence shows).
            name = getattr(f, "title", None) or pattern_title(f.pattern)
            slices.append((name, start, end, name, args))
    # Flagged windows no finding claims still show, on their own row.
    loose = [w for w in windows if w.flagged and int(w.index) not in covered]
    for run in _runs([int(w.index) for w in loose]):
        ws = [by_index[i] for i in run]
        pats = sorted({w.pattern for w in ws if w.pattern})
        scores = [float(w.score) for w in ws]
        slices.append(("flagged, no finding", float(ws[0].start_us), float(ws[-1].end_us),
                       pattern_title(pats[0]) if len(pats) == 1 else "anomaly",
                       {"patterns": pats, "windows": _ranges(run),
                        "score_max": round(max(scores), 4),
                        "score_mean": round(float(np.mean(scores)), 4)}))

    for row, start, end, name, args in sorted(slices, key=lambda s: (s[0], s[1])):
        lanes = rows.setdefault(row, [])
        # Slices on one thread must nest: an overlapping one goes to the next lane of its row.
        lane = next((i for i, lane in enumerate(lanes) if lane[-1][1] <= start), None)
        if lane is None:
            lanes.append([])
            lane = len(lanes) - 1
        lanes[lane].append((start, end))
        key = (row, lane)
        if key not in tids:
            tids[key] = len(tids) + 1
            label = row if lane == 0 else f"{row} ({lane + 1})"
            events.append(_meta("thread_name", pid, tids[key], name=label))
            events.append(_meta("thread_sort_index", pid, tids[key], sort_index=tids[key]))
        events.append({"ph": "X", "cat": CATEGORY, "name": name, "pid": pid, "tid": tids[key],
                       "ts": start, "dur": max(end - start, 0.0), "args": args})
    return events


def _round(x, digits: int = 1):
    return None if x is None else round(float(x), digits)


def _meta(kind: str, pid: int, tid: int, **args) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _free_pid(used: set) -> int:
    """An integer pid no event uses (string pids do not count: they cannot collide)."""
    ints = [p for p in used if isinstance(p, int) and not isinstance(p, bool)]
    return max(ints, default=0) + 1


def _runs(idx: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _ranges(idx: list[int]) -> str:
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in _runs(idx))


def _is_big(path) -> bool:
    try:
        return Path(path).stat().st_size > BIG_FILE_BYTES
    except OSError:
        return False

