"""Ground truth from the recording itself: markers around injected code become anomaly intervals.

While recording, the code that causes an anti-pattern runs inside
`record_function("traceap.anomaly::<pattern>")`.  The profiler writes each marker as a
`user_annotation` event (and, on a GPU, a `gpu_user_annotation` twin) in the same trace and the
same clock as every other event, so its interval is exactly where the injected code ran.
`finalize` turns the markers into anomaly intervals, extends each to the end of the GPU work
launched inside it (a pageable copy or an NCCL kernel finishes after its launch returns), then
deletes the markers and writes the trace gzipped: no detector ever sees them.
"""

from __future__ import annotations

import gzip
import os
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import orjson
from torch.profiler import record_function

from ..manifest import Anomaly
from ..patterns._registry import is_pattern
from ..errors import TraceFormatError

PREFIX = "traceap.anomaly::"
_MARKER_CATS = {"user_annotation", "gpu_user_annotation"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime", "hip_driver"}
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def marker(pattern: str, on: bool = True):
    """A profiler range marking injected code of `pattern`; a no-op context when `on` is false."""
    if not on:
        return nullcontext()
    if not is_pattern(pattern):
        raise ValueError(f"unknown pattern id {pattern!r}")
    return record_function(PREFIX + pattern)


def is_marker(event: dict) -> bool:
    """True for a marker event (CPU or GPU side)."""
    name = event.get("name")
    return (isinstance(name, str) and name.startswith(PREFIX)
            and event.get("cat") in _MARKER_CATS)


def extract(trace: dict) -> list[Anomaly]:
    """Anomaly intervals from the markers of a Kineto trace object; removes the markers in place."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise TraceFormatError("profiler output has no traceEvents list")
    cpu_marks, kept = [], []
    for e in events:
        if is_marker(e):
            if e.get("cat") == "user_annotation" and e.get("ph") == "X":
                cpu_marks.append(e)
        else:
            kept.append(e)
    trace["traceEvents"] = kept
    if not cpu_marks:
        return []
    launch_end = _launch_end_by_runtime(kept)
    found: list[Anomaly] = []
    for m in cpu_marks:
        start = float(m["ts"])
        end = start + float(m.get("dur", 0.0))
        end = max(end, launch_end(m.get("tid"), start, end))
        found.append(Anomaly(start_us=start, end_us=end, pattern=m["name"][len(PREFIX):]))
    return merge(found)


def _launch_end_by_runtime(events: list[dict]):
    """A function (tid, start, end) -> latest end of GPU work launched on `tid` in [start, end]."""
    gpu_end: dict[int, float] = {}
    for e in events:
        if e.get("cat") in _GPU_CATS and e.get("ph") == "X":
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                end = float(e["ts"]) + float(e.get("dur", 0.0))
                gpu_end[corr] = max(end, gpu_end.get(corr, end))
    tids, ts, ends = [], [], []
    if gpu_end:
        for e in events:
            if e.get("cat") in _RUNTIME_CATS and e.get("ph") == "X":
                corr = (e.get("args") or {}).get("correlation")
                if corr in gpu_end:
                    tids.append(str(e.get("tid")))
                    ts.append(float(e["ts"]))
                    ends.append(gpu_end[corr])
    tid_arr, ts_arr, end_arr = np.array(tids), np.array(ts), np.array(ends)

    def launch_end(tid, start: float, end: float) -> float:
        if not len(ts_arr):
            return end
        inside = (tid_arr == str(tid)) & (ts_arr >= start) & (ts_arr <= end)
        return float(end_arr[inside].max()) if inside.any() else end

    return launch_end


def merge(anomalies: list[Anomaly]) -> list[Anomaly]:
    """Overlapping or touching intervals of the same pattern merged, sorted by start."""
    out: list[Anomaly] = []
    for a in sorted(anomalies, key=lambda a: (a.pattern, a.start_us)):
        last = out[-1] if out else None
        if last is not None and last.pattern == a.pattern and a.start_us <= last.end_us:
            last.end_us = max(last.end_us, a.end_us)
        else:
            out.append(Anomaly(start_us=a.start_us, end_us=a.end_us, pattern=a.pattern))
    return sorted(out, key=lambda a: a.start_us)


def finalize(raw: str | os.PathLike, out: str | os.PathLike,
             name: str | os.PathLike | None = None) -> list[Anomaly]:
    """Read the profiler's file, take out the markers as anomalies, write `out` gzipped (its
    `traceName` the file it will be: `name`, else `out`)."""
    data = Path(raw).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        trace = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"{raw}: profiler output is not JSON ({exc})") from None
    anomalies = extract(trace)
    out = Path(out)
    if "traceName" in trace:  # the profiler's temporary file is gone; name the real one
        trace["traceName"] = str(name if name is not None else out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with gzip.open(tmp, "wb", compresslevel=6) as f:
        f.write(orjson.dumps(trace))
    tmp.replace(out)
    return anomalies


__all__ = ["PREFIX", "extract", "finalize", "is_marker", "marker", "merge"]
