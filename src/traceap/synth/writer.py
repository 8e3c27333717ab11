"""Kineto JSON writer: the file layout torch.profiler writes, serialised with orjson, gzipped."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import orjson

from .simulator import RunResult


def _metadata(res: RunResult, pid: int, main_tid: int, bw_tid: int, device: int,
              streams: list[int], t0: float) -> list[dict]:
    """process_name / thread_name records as Kineto writes them."""
    ts = round(t0, 3)
    out = [
        {"name": "process_name", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"name": "process_labels", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "process_sort_index", "ph": "M", "ts": ts, "pid": pid, "tid": 0,
         "args": {"sort_index": pid}},
        {"name": "process_name", "ph": "M", "ts": ts, "pid": device, "tid": 0, "args": {"name": "python"}},
        {"name": "process_labels", "ph": "M", "ts": ts, "pid": device, "tid": 0,
         "args": {"labels": f"GPU {device}"}},
        {"name": "process_sort_index", "ph": "M", "ts": ts, "pid": device, "tid": 0,
         "args": {"sort_index": 16777216 + device}},
        {"name": "thread_name", "ph": "M", "ts": ts, "pid": pid, "tid": main_tid,
         "args": {"name": f"thread {main_tid} (python)"}},
        {"name": "thread_sort_index", "ph": "M", "ts": ts, "pid": pid, "tid": main_tid,
         "args": {"sort_index": main_tid}},
        {"name": "thread_name", "ph": "M", "ts": ts, "pid": pid, "tid": bw_tid,
         "args": {"name": f"thread {bw_tid} (pt_autograd_{device})"}},
        {"name": "thread_sort_index", "ph": "M", "ts": ts, "pid": pid, "tid": bw_tid,
         "args": {"sort_index": bw_tid}},
    ]
    for s in streams:
        out.append({"name": "thread_name", "ph": "M", "ts": ts, "pid": device, "tid": s,
                    "args": {"name": f"stream {s} "}})
        out.append({"name": "thread_sort_index", "ph": "M", "ts": ts, "pid": device, "tid": s,
                    "args": {"sort_index": s}})
    return out


def trace_document(res: RunResult, base_time_ns: int) -> dict:
    """The whole JSON document of one rank's trace."""
    t0, t1 = res.span
    pid, main_tid, bw_tid, device = res.pid, res.main_tid, res.bw_tid, res.device
    streams = res.streams
    doc: dict = {"schemaVersion": 1, "deviceProperties": res.device_properties}
    if res.distributed_info is not None:
        doc["distributedInfo"] = res.distributed_info
    doc.update({"cuda_runtime_version": 12040, "cuda_driver_version": 12040,
                "cupti_version": 22, "record_shapes": 0, "with_stack": 0, "profile_memory": 0,
                "trace_id": f"{base_time_ns:032X}"[-32:]})
    events = _metadata(res, pid, main_tid, bw_tid, device, streams, t0)
    events.extend(res.events)
    events.append({"ph": "X", "cat": "Trace", "ts": round(t0, 3), "dur": round(t1 - t0, 3),
                   "pid": "Spans", "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)",
                   "args": {"Op count": 0}})
    events.append({"name": "process_sort_index", "ph": "M", "ts": round(t0, 3), "pid": "Spans",
                   "tid": 0, "args": {"sort_index": 536870912}})
    events.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                   "ts": round(t1 + 5.0, 3)})
    doc["traceEvents"] = events
    doc["traceName"] = f"/tmp/traces/rank{device}.pt.trace.json"
    doc["displayTimeUnit"] = "ms"
    doc["baseTimeNanoseconds"] = base_time_ns
    return doc


def serialize(doc: dict) -> bytes:
    """JSON laid out as Kineto lays it out: `"key": value` header lines, one event per line.

    The layout matters beyond looks: tools grep the raw text (HTA finds a trace's rank with
    the regex `"rank":\\s+(\\d+)`, which compact JSON would defeat).
    """
    parts = [b"{"]
    items = [(k, v) for k, v in doc.items() if k != "traceEvents"]
    head = [k for k, _ in items if k in ("schemaVersion", "deviceProperties", "distributedInfo")]
    for k in head:
        parts.append(f'  "{k}": {json.dumps(doc[k])},'.encode())
    for k, v in items:
        if k not in head and k not in ("traceName", "displayTimeUnit", "baseTimeNanoseconds"):
            parts.append(f'  "{k}": {json.dumps(v)},'.encode())
    parts.append(b'  "traceEvents": [')
    parts.append(b",\n".join(orjson.dumps(e) for e in doc["traceEvents"]))
    parts.append(b"  ],")
    tail = [k for k in ("traceName", "displayTimeUnit", "baseTimeNanoseconds") if k in doc]
    for i, k in enumerate(tail):
        parts.append(f'  "{k}": {json.dumps(doc[k])}{"," if i < len(tail) - 1 else ""}'.encode())
    parts.append(b"}")
    return b"\n".join(parts)


def write_trace(path: str | os.PathLike, doc: dict, level: int = 6) -> int:
    """Write a document as gzipped JSON; returns the bytes written."""
    data = gzip.compress(serialize(doc), compresslevel=level, mtime=0)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, p)
    return len(data)
