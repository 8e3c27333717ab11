"""Fast, forgiving reader of Kineto / Chrome-trace JSON (`.json`, `.json.gz`).

msgspec decodes straight into small typed structs (only the fields we use, unknown fields
skipped in C), the structs become numpy columns, and the per-event structs are dropped.
Call-stack nesting and launch links are computed with vectorised numpy, not per-event Python.
"""

from __future__ import annotations

import gc
import math
import os
import re
import zlib
from contextlib import contextmanager, nullcontext
from pathlib import Path

import msgspec
import numpy as np
from msgspec import field

from ..errors import EmptyTraceError, TraceFormatError
from ..progress import status
from ..trace import CATEGORY_KIND, LAUNCH_KINDS, Kind, Step, Trace, TraceMeta

_NAN = float("nan")


class _Args(msgspec.Struct, gc=False):
    external_id: int = field(default=-1, name="External id")
    external_id_old: int = field(default=-1, name="external id")
    correlation: int = -1
    device: int | str = -1
    stream: int | str = -1  # AMD runtime calls write "0x0"
    bytes: float = _NAN
    grid: list | str | None = None  # inductor cpu_ops write "grid(100,)"
    block: list | str | None = None
    in_nelems: int = field(default=-1, name="In msg nelems")
    group_size: int = field(default=-1, name="Group size")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _NAN
    dur: float = 0.0
    id: int | str | None = None
    args: _Args | None = None


class _File(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None  # noqa: N815 - the file's own key
    deviceProperties: list[dict] | None = None  # noqa: N815
    computeProperties: list[dict] | None = None  # noqa: N815
    distributedInfo: dict | None = None  # noqa: N815
    baseTimeNanoseconds: int | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    schemaVersion: object = None  # noqa: N815


_FILE_DECODER = msgspec.json.Decoder(_File, strict=False)
_LIST_DECODER = msgspec.json.Decoder(list[_Event], strict=False)
_EMPTY_ARGS = _Args()
_NO_DIMS = (0, 0, 0)

#: Thread kinds that nest into call stacks on their CPU thread.
_NESTING_KINDS = (Kind.CPU_OP, Kind.PYTHON_FUNCTION, Kind.USER_ANNOTATION, Kind.CUDA_RUNTIME,
                  Kind.CUDA_DRIVER, Kind.INSTANT)
_GPU_LINKED = (Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET)
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_RE = re.compile(r"(?:rank|worker)[_\-#]?(\d+)", re.IGNORECASE)


@contextmanager
def _gc_paused():
    # Millions of small allocations trigger the cyclic GC again and again; none are cycles.
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_bytes(path: str | os.PathLike) -> bytes:
    """The uncompressed bytes of a trace file (gzip detected by its magic number)."""
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"{p}: no such file")
    if p.is_dir():
        raise TraceFormatError(f"{p}: is a folder, not a trace file (use load_job for a job)")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            d = zlib.decompressobj(wbits=47)
            out = d.decompress(raw) + d.flush()
        except zlib.error as exc:
            raise TraceFormatError(f"{p}: corrupt gzip data ({exc})") from None
        if not d.eof:
            raise TraceFormatError(f"{p}: truncated gzip file (the compressed stream ends early)")
        return out
    return raw


def _decode(data: bytes, path: str) -> tuple[_File, list[str]]:
    warnings: list[str] = []
    head = data[:4096].lstrip()
    if not head:
        raise TraceFormatError(f"{path}: empty file")
    if head[:1] not in (b"{", b"["):
        raise TraceFormatError(f"{path}: not JSON (a Kineto trace starts with '{{')")
    try:
        if head[:1] == b"[":
            return _File(traceEvents=_LIST_DECODER.decode(data)), warnings
        return _FILE_DECODER.decode(data), warnings
    except msgspec.ValidationError:
        pass  # valid JSON with odd field types: take the slow, per-event path below
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "truncated" in msg.lower():
            raise TraceFormatError(f"{path}: truncated JSON (the file ends mid-way)") from None
        raise TraceFormatError(f"{path}: not valid JSON ({msg})") from None
    return _decode_lenient(data, path, warnings), warnings


def _decode_lenient(data: bytes, path: str, warnings: list[str]) -> _File:
    obj = msgspec.json.decode(data)
    if isinstance(obj, list):
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{path}: JSON is not a trace object")
    raw_events = obj.get("traceEvents")
    events: list[_Event] = []
    bad = 0
    if isinstance(raw_events, list):
        for e in raw_events:
            if isinstance(e, dict) and not isinstance(e.get("args", {}), dict):
                e = {k: v for k, v in e.items() if k != "args"}
            try:
                events.append(msgspec.convert(e, _Event, strict=False))
                continue
            except (msgspec.ValidationError, TypeError):
                pass
            try:  # keep the event, lose only its odd args
                slim = {k: v for k, v in e.items() if k != "args"}
                events.append(msgspec.convert(slim, _Event, strict=False))
                bad += 1
            except (msgspec.ValidationError, TypeError, AttributeError):
                bad += 1
                events.append(_Event(ph="?"))  # keep the raw count honest
    if bad:
        warnings.append(f"{bad} events with malformed fields (their args or the event ignored)")
    meta = {}
    for key in ("deviceProperties", "computeProperties"):
        val = obj.get(key)
        meta[key] = [v for v in val if isinstance(v, dict)] if isinstance(val, list) else None
    di = obj.get("distributedInfo")
    base = obj.get("baseTimeNanoseconds")
    return _File(traceEvents=events if isinstance(raw_events, list) else None,
                 deviceProperties=meta["deviceProperties"],
                 computeProperties=meta["computeProperties"],
                 distributedInfo=di if isinstance(di, dict) else None,
                 baseTimeNanoseconds=base if isinstance(base, int) else None,
                 displayTimeUnit=obj.get("displayTimeUnit") if isinstance(
                     obj.get("displayTimeUnit"), str) else None,
                 schemaVersion=obj.get("schemaVersion"))


class _Interner:
    """Maps string pids/tids to stable negative integers (numeric strings to their value)."""

    def __init__(self):
        self.codes: dict[str, int] = {}

    def __call__(self, v) -> int:
        if type(v) is int:
            return v
        code = self.codes.get(v)
        if code is None:
            try:
                code = int(v)
            except (TypeError, ValueError):
                code = -(len(self.codes) + 1)
            self.codes[v] = code
        return code


def _kind_lookup():
    cache: dict[tuple[str, str], int] = {}

    def kind_of(ph: str, cat: str) -> int:
        key = (ph, cat)
        k = cache.get(key)
        if k is None:
            if ph in ("i", "I"):
                k = Kind.INSTANT
            else:
                k = CATEGORY_KIND.get(cat.lower(), Kind.OTHER) if cat else Kind.OTHER
            cache[key] = int(k)
        return k

    return kind_of


def load(path: str | os.PathLike) -> Trace:
    """Load one Kineto trace file (`.json` or `.json.gz`) into a columnar `Trace`."""
    path = str(path)
    with _spinner(path):
        data = read_bytes(path)
        with _gc_paused():
            parsed, warnings = _decode(data, path)
            del data
            return _build(parsed, path, warnings)


#: Traces above this size (uncompressed, estimated for .gz) show a spinner while they load.
SPINNER_BYTES = 50 * 1024 * 1024


def _spinner(path: str):
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if size * (8 if path.endswith(".gz") else 1) <= SPINNER_BYTES:  # Kineto JSON gzips ~8x
        return nullcontext()
    return status(f"loading {os.path.basename(path)} ({size / 1e6:.0f} MB)")


def _build(parsed: _File, path: str, warnings: list[str]) -> Trace:
    events = parsed.traceEvents
    if events is None:
        raise TraceFormatError(f"{path}: no 'traceEvents' list (not a Kineto/Chrome trace)")
    meta = TraceMeta(path=path, warnings=warnings, n_raw_events=len(events))
    meta.device_properties = parsed.deviceProperties or parsed.computeProperties or []
    meta.distributed_info = parsed.distributedInfo
    meta.base_time_ns = parsed.baseTimeNanoseconds
    meta.display_time_unit = parsed.displayTimeUnit
    meta.schema_version = parsed.schemaVersion

    timed = [e for e in events if e.ph in ("X", "i", "I")]
    flows = [e for e in events if e.ph in ("s", "f", "t")]
    meta.n_flows = len(flows)
    meta.n_metadata = sum(1 for e in events if e.ph == "M")
    del events
    if not timed:
        raise EmptyTraceError(f"{path}: the trace has no timed events")

    n = len(timed)
    kind_of = _kind_lookup()
    table: dict[str, int] = {}
    intern = _Interner()
    args = [e.args or _EMPTY_ARGS for e in timed]
    ts = np.fromiter((e.ts for e in timed), dtype=np.float64, count=n)
    dur = np.fromiter((e.dur for e in timed), dtype=np.float64, count=n)
    kind = np.fromiter((kind_of(e.ph, e.cat) for e in timed), dtype=np.int8, count=n)
    name = np.fromiter((table.setdefault(e.name, len(table)) for e in timed), dtype=np.int32,
                       count=n)
    pid = np.fromiter((intern(e.pid) for e in timed), dtype=np.int64, count=n)
    tid = np.fromiter((intern(e.tid) for e in timed), dtype=np.int64, count=n)
    del timed
    device = np.fromiter((_int(a.device) for a in args), dtype=np.int64, count=n)
    stream = np.fromiter((_int(a.stream) for a in args), dtype=np.int64, count=n)
    correlation = np.fromiter((a.correlation for a in args), dtype=np.int64, count=n)
    ext = np.fromiter((a.external_id if a.external_id >= 0 else a.external_id_old for a in args),
                      dtype=np.int64, count=n)
    nbytes = np.fromiter((a.bytes for a in args), dtype=np.float64, count=n)
    nelems = np.fromiter((a.in_nelems for a in args), dtype=np.int64, count=n)
    group = np.fromiter((a.group_size for a in args), dtype=np.int64, count=n)
    grid = _dims([a.grid for a in args])
    block = _dims([a.block for a in args])
    del args

    bad_ts = ~np.isfinite(ts)
    if bad_ts.any():
        meta.warnings.append(f"{int(bad_ts.sum())} events without a timestamp dropped")
    neg = dur < 0
    if neg.any():
        meta.warnings.append(f"{int(neg.sum())} negative durations clamped to 0")
        dur = np.where(neg, 0.0, dur)
    dur = np.where(np.isfinite(dur), dur, 0.0)

    keep = ~bad_ts
    order = np.lexsort((-dur, ts))
    order = order[keep[order]]
    cols = {"ts": ts, "dur": dur, "kind": kind, "name": name, "pid": pid, "tid": tid,
            "device": device, "stream": stream, "correlation": correlation, "external_id": ext,
            "bytes": nbytes, "grid": grid, "block": block, "comm_nelems": nelems,
            "comm_group_size": group}
    cols = {k: v[order] for k, v in cols.items()}
    if not len(order):
        raise EmptyTraceError(f"{path}: the trace has no timed events")
    _fix_gpu_ids(cols, intern)
    names = [""] * len(table)
    for s, i in table.items():
        names[i] = s

    parent, depth = _nest(cols)
    launch = _link_launches(cols, flows, intern, meta)
    cpu_op = _innermost_cpu_op(cols["kind"], parent, launch)
    cols.update(parent=parent, depth=depth, launch=launch, cpu_op=cpu_op)

    steps = _steps(cols, names)
    _rank_info(meta, path)
    trace = Trace(names, cols, meta, steps)
    if not trace.has_gpu:
        meta.warnings.append("no GPU kernels, memcpys or memsets: a CPU-only trace; "
                             "GPU analyses are skipped")
    return trace


def _int(v) -> int:
    if type(v) is int:
        return v
    try:
        return int(v, 0)  # "0x0", "7"
    except (TypeError, ValueError):
        return -1


def _dims(values: list) -> np.ndarray:
    out = np.zeros((len(values), 3), dtype=np.int32)
    idx = [i for i, v in enumerate(values) if isinstance(v, list) and v]
    if idx:
        rows = []
        for i in idx:
            v = [x if isinstance(x, int) else 0 for x in values[i]]
            rows.append((v + [1, 1, 1])[:3])
        out[idx] = rows
    return out


def _fix_gpu_ids(cols: dict, intern: _Interner) -> None:
    """GPU events: device from pid where args lack it; stream from tid ("stream 7") likewise."""
    kind = cols["kind"]
    gpu = np.isin(kind, (Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET, Kind.GPU_USER_ANNOTATION))
    no_dev = gpu & (cols["device"] < 0)
    cols["device"] = np.where(no_dev, np.maximum(cols["pid"], 0), cols["device"])
    no_stream = gpu & (cols["stream"] < 0)
    if no_stream.any():
        # Old traces name GPU threads "stream 7": recover the number from the interned string.
        by_code = {}
        for s, code in intern.codes.items():
            m = re.search(r"(\d+)\s*$", s) if isinstance(s, str) else None
            if m:
                by_code[code] = int(m.group(1))
        tids = cols["tid"][no_stream]
        cols["stream"][no_stream] = [by_code.get(int(t), int(t)) for t in tids]
    cols["device"] = np.where(gpu, cols["device"], -1).astype(np.int16)
    cols["stream"] = np.where(gpu, cols["stream"], -1)


def _nest(cols: dict) -> tuple[np.ndarray, np.ndarray]:
    """Parent row and depth of every CPU-side event, by interval nesting per thread.

    Vectorised: in (thread, start, -dur) order, the depth of an event is the number of longer
    events opened before it on its thread minus those already closed at its start; its parent
    is the latest earlier event one level up.
    """
    n = len(cols["ts"])
    parent = np.full(n, -1, dtype=np.int32)
    depth = np.zeros(n, dtype=np.int16)
    rows = np.flatnonzero(np.isin(cols["kind"], _NESTING_KINDS))
    if not len(rows):
        return parent, depth
    ts, dur = cols["ts"][rows], cols["dur"][rows]
    pid, tid = cols["pid"][rows], cols["tid"][rows]
    order = np.lexsort((-dur, ts, tid, pid))
    rows, ts, dur, pid, tid = rows[order], ts[order], dur[order], pid[order], tid[order]
    end = ts + dur
    m = len(rows)
    newgrp = np.empty(m, dtype=bool)
    newgrp[0] = True
    newgrp[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    grp = np.cumsum(newgrp) - 1
    grp_start = np.flatnonzero(newgrp)[grp]

    opens = (dur > 0).astype(np.int64)
    csum = np.concatenate(([0], np.cumsum(opens)))
    opened_before = csum[np.arange(m)] - csum[grp_start]

    t0 = float(ts.min())
    width = float(end.max() - t0) + 1.0
    end_key = np.sort(grp[dur > 0] * width + (end[dur > 0] - t0))
    start_key = grp * width + (ts - t0)
    closed = (np.searchsorted(end_key, start_key, side="right")
              - np.searchsorted(end_key, grp * width, side="left"))
    d = np.maximum(opened_before - closed, 0)

    pos = np.arange(m)
    par_pos = np.full(m, -1, dtype=np.int64)
    for level in range(1, int(d.max()) + 1 if m else 1):
        kids = np.flatnonzero(d == level)
        if not len(kids):
            continue
        ups = pos[d == level - 1]
        j = np.searchsorted(ups, kids) - 1
        ok = j >= 0
        cand = ups[np.where(ok, j, 0)]
        ok &= (grp[cand] == grp[kids]) & (end[cand] >= ts[kids])
        par_pos[kids[ok]] = cand[ok]
    has = par_pos >= 0
    parent[rows[has]] = rows[par_pos[has]]
    depth[rows] = np.minimum(d, np.iinfo(np.int16).max)
    return parent, depth


def _link_launches(cols: dict, flows: list, intern: _Interner, meta: TraceMeta) -> np.ndarray:
    """For each kernel/memcpy/memset, the runtime (or driver) call that launched it."""
    kind, corr = cols["kind"], cols["correlation"]
    n = len(kind)
    launch = np.full(n, -1, dtype=np.int32)
    gpu = np.flatnonzero(np.isin(kind, _GPU_LINKED))
    if not len(gpu):
        return launch
    rt = np.flatnonzero(np.isin(kind, LAUNCH_KINDS) & (corr >= 0))
    if len(rt):
        # Runtime calls win over driver calls that share a correlation id.
        rt = rt[np.lexsort((kind[rt], corr[rt]))]
        keys = corr[rt]
        g = gpu[corr[gpu] >= 0]
        j = np.searchsorted(keys, corr[g])
        ok = j < len(keys)
        ok[ok] = keys[j[ok]] == corr[g[ok]]
        launch[g[ok]] = rt[j[ok]]
    missing = gpu[launch[gpu] < 0]
    if len(missing) and flows:
        _link_by_flows(cols, flows, intern, missing, launch)
    unlinked = int((launch[gpu] < 0).sum())
    if unlinked and unlinked > 0.05 * len(gpu):
        meta.warnings.append(f"{unlinked} of {len(gpu)} GPU events have no launching runtime "
                             f"call in the trace (launch delays unknown for those)")
    return launch


def _link_by_flows(cols, flows, intern, missing, launch) -> None:
    starts, ends = {}, {}
    for f in flows:
        if f.id is None:
            continue
        key = (intern(f.pid), intern(f.tid), float(f.ts))
        (starts if f.ph == "s" else ends)[f.id] = key
    if not starts or not ends:
        return
    by_pos: dict[tuple, int] = {}
    launchers = np.flatnonzero(np.isin(cols["kind"], LAUNCH_KINDS))
    for r in launchers:
        by_pos.setdefault((int(cols["pid"][r]), int(cols["tid"][r]), float(cols["ts"][r])), r)
    end_to_rt = {}
    for fid, key in ends.items():
        s = starts.get(fid)
        if s is not None and s in by_pos:
            end_to_rt[key] = by_pos[s]
    for r in missing:
        key = (int(cols["pid"][r]), int(cols["tid"][r]), float(cols["ts"][r]))
        hit = end_to_rt.get(key)
        if hit is not None:
            launch[r] = hit


def _innermost_cpu_op(kind: np.ndarray, parent: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """For runtime calls, the innermost enclosing cpu_op; GPU events inherit their launcher's."""
    n = len(kind)
    out = np.full(n, -1, dtype=np.int32)
    rt = np.flatnonzero(np.isin(kind, LAUNCH_KINDS))
    cur = parent[rt]
    todo = np.arange(len(rt))
    while len(todo):
        c = cur[todo]
        live = c >= 0
        todo, c = todo[live], c[live]
        hit = kind[c] == Kind.CPU_OP
        out[rt[todo[hit]]] = c[hit]
        todo = todo[~hit]
        cur[todo] = parent[cur[todo]]
    g = launch >= 0
    out[g] = out[launch[g]]
    return out


def _steps(cols: dict, names: list[str]) -> list[Step]:
    codes = {i: int(m.group(1)) for i, s in enumerate(names) if (m := _STEP_RE.match(s))}
    if not codes:
        return []
    rows = np.flatnonzero(np.isin(cols["name"], list(codes)) &
                          np.isin(cols["kind"], (Kind.USER_ANNOTATION, Kind.CPU_OP, Kind.OTHER)))
    steps = [Step(codes[int(cols["name"][r])], float(cols["ts"][r]),
                  float(cols["ts"][r] + cols["dur"][r])) for r in rows]
    steps.sort(key=lambda s: s.start_us)
    return steps


def _rank_info(meta: TraceMeta, path: str) -> None:
    di = meta.distributed_info or {}
    rank, ws = di.get("rank"), di.get("world_size")
    meta.rank = rank if isinstance(rank, int) else None
    meta.world_size = ws if isinstance(ws, int) else None
    backend = di.get("backend")
    meta.backend = backend if isinstance(backend, str) else None
    if meta.rank is None:
        m = _RANK_RE.search(Path(path).name)
        if m:
            meta.rank = int(m.group(1))


def finite_or_none(x: float) -> float | None:
    """JSON-safe float (NaN/inf become None)."""
    return None if x is None or not math.isfinite(x) else float(x)
