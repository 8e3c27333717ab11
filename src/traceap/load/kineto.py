"""Fast, forgiving reader of Kineto / Chrome-trace JSON (`.json`, `.json.gz`).

The file is read once; msgspec splits the event list into raw slices of the buffer (no Python
objects per field), then decodes it chunk by chunk into small typed structs, the class picked
by the event's "ph" (a tagged union): complete events and instants keep only the fields we
use, flows and metadata are decoded as empty structs and their raw slices kept aside for the
rare trace that needs flows to link launches.  Each chunk becomes slices of numpy columns
through C-level `map`s (strings are factorised into codes as they stream past) and its
structs are dropped before the next chunk, so peak memory stays below twice the file size.
The raw bytes are freed as soon as the last chunk is decoded.  Events with odd field types
only send their own chunk down the per-event path.  Call-stack nesting and launch links are
vectorised numpy, not per-event Python.

Measured in benchmarks/bench_load.py (see benchmarks/README.md).
"""

from __future__ import annotations

import gc
import os
import re
import zlib
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field as dc_field
from itertools import count, islice, repeat
from operator import attrgetter, ne
from pathlib import Path
from typing import ClassVar, Union

import msgspec
import numpy as np
from msgspec import field

from ..errors import EmptyTraceError, TraceFormatError
from ..progress import status
from ..trace import CATEGORY_KIND, LAUNCH_KINDS, Kind, Step, Trace, TraceMeta

_NAN = float("nan")
#: Events decoded (and held as structs) at a time; small enough to keep memory flat.
CHUNK_EVENTS = 1 << 13


#: ph -> small code: timed events (X, instants), flow events (s, f, t), metadata (M).
_PH_X, _PH_INSTANT, _PH_FLOW_START, _PH_FLOW_END, _PH_META, _PH_OTHER = range(6)
#: Every other phase of the Chrome trace format (decoded as empty structs, then ignored).
_OTHER_PHASES = ("B", "E", "C", "b", "n", "e", "P", "N", "O", "D", "V", "v", "R", "c", "(",
                 ")", "S", "T", "p", "F")


class _Args(msgspec.Struct, gc=False, frozen=True):  # frozen: one shared default below
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


_EMPTY_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    """Any event, as the per-event path reads it (chunks with odd field types or phases)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _NAN
    dur: float = 0.0
    id: int | str | None = None
    args: _Args = _EMPTY_ARGS  # "args": null is odd and takes the per-event path


class _Timed(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event: what the columns are made of.  The event's "ph" picks the class."""

    code: ClassVar[int] = _PH_X
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _NAN
    dur: float = 0.0
    args: _Args = _EMPTY_ARGS


class _Instant(_Timed, tag="i"):
    code: ClassVar[int] = _PH_INSTANT


class _GlobalInstant(_Timed, tag="I"):
    code: ClassVar[int] = _PH_INSTANT


class _Untimed(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
    """Metadata, flows and other phases: only counted here, so no fields are decoded."""

    code: ClassVar[int] = _PH_META


class _FlowStart(_Untimed, tag="s"):
    code: ClassVar[int] = _PH_FLOW_START


class _FlowEnd(_Untimed, tag="f"):
    code: ClassVar[int] = _PH_FLOW_END


class _FlowStep(_Untimed, tag="t"):
    code: ClassVar[int] = _PH_FLOW_END


class _Other(_Untimed, tag="?"):
    code: ClassVar[int] = _PH_OTHER


_OTHERS = tuple(msgspec.defstruct(f"_Other_{i}", [], bases=(_Other,), tag=ph)
                for i, ph in enumerate(_OTHER_PHASES))
_ANY_EVENT = Union[(_Timed, _Instant, _GlobalInstant, _Untimed, _FlowStart, _FlowEnd,  # noqa: UP007
                    _FlowStep, *_OTHERS)]
_BY_PH = {"X": _Timed, "i": _Instant, "I": _GlobalInstant, "M": _Untimed, "s": _FlowStart,
          "f": _FlowEnd, "t": _FlowStep}


class _Flow(msgspec.Struct, gc=False):
    """A flow event (`ac2g` launch -> GPU arrow), decoded only when correlation ids fall short."""

    ph: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _NAN
    id: int | str | None = None


class _Head(msgspec.Struct, gc=False):
    """The top-level object; events stay raw slices of the buffer until decoded by chunk."""

    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 - the file's own key
    deviceProperties: list[dict] | None = None  # noqa: N815
    computeProperties: list[dict] | None = None  # noqa: N815
    distributedInfo: dict | None = None  # noqa: N815
    baseTimeNanoseconds: int | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    schemaVersion: object = None  # noqa: N815


class _LooseHead(msgspec.Struct, gc=False):
    """The top-level metadata with any types (checked in Python) when `_Head` does not fit."""

    deviceProperties: object = None  # noqa: N815
    computeProperties: object = None  # noqa: N815
    distributedInfo: object = None  # noqa: N815
    baseTimeNanoseconds: object = None  # noqa: N815
    displayTimeUnit: object = None  # noqa: N815
    schemaVersion: object = None  # noqa: N815


class _EventsOnly(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815


_HEAD_DECODER = msgspec.json.Decoder(_Head, strict=False)
_LOOSE_HEAD_DECODER = msgspec.json.Decoder(_LooseHead, strict=False)
_EVENTS_ONLY_DECODER = msgspec.json.Decoder(_EventsOnly, strict=False)
_RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
_CHUNK_DECODER = msgspec.json.Decoder(list[_ANY_EVENT], strict=False)
_FLOWS_DECODER = msgspec.json.Decoder(list[_Flow], strict=False)


# C-level field getters: every column is one `map` over a chunk of structs.
_code, _cat = attrgetter("code"), attrgetter("cat")
_thread = attrgetter("pid", "tid")
_device_stream = attrgetter("args.device", "args.stream")
_ts, _dur, _name = attrgetter("ts"), attrgetter("dur"), attrgetter("name")
_correlation = attrgetter("args.correlation")
_external_id = attrgetter("args.external_id")
_external_id_old = attrgetter("args.external_id_old")
_bytes = attrgetter("args.bytes")
_in_nelems = attrgetter("args.in_nelems")
_group_size = attrgetter("args.group_size")
_grid, _block = attrgetter("args.grid"), attrgetter("args.block")
#: Args that only memcpys, kernels and collectives carry: read for those rows only.
_rare_args = attrgetter("args.external_id_old", "args.bytes", "args.in_nelems",
                        "args.group_size", "args.grid", "args.block")
_RARE_DEFAULTS = _rare_args(_Timed())  # tuple equality: identical NaN default compares equal

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
            out = d.decompress(raw)
            del raw
            tail = d.flush()
        except zlib.error as exc:
            raise TraceFormatError(f"{p}: corrupt gzip data ({exc})") from None
        if not d.eof:
            raise TraceFormatError(f"{p}: truncated gzip file (the compressed stream ends early)")
        return out + tail if tail else out  # no second copy of the whole trace when possible
    return raw


def load(path: str | os.PathLike) -> Trace:
    """Load one Kineto trace file (`.json` or `.json.gz`) into a columnar `Trace`."""
    path = str(path)
    with _spinner(path), _gc_paused():
        # The bytes travel in a list so that `_read` holds the only reference and can free
        # them as soon as the events are decoded.
        return _build(_read([read_bytes(path)], path), path)


def load_bytes(data: bytes, name: str) -> Trace:
    """A trace's uncompressed JSON already in memory, read as `load` reads a file (`name`
    stands for the path in messages and `meta.path`)."""
    with _gc_paused():
        return _build(_read([data], name), name)


#: Traces above this size (uncompressed, estimated for .gz) show a spinner while they load.
SPINNER_BYTES = 50 * 1024 * 1024


def _spinner(path: str):
    """A terminal spinner for big files (`traceap.progress`: silent in pipes and CI)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if size * (8 if path.endswith(".gz") else 1) <= SPINNER_BYTES:  # Kineto JSON gzips ~8x
        return nullcontext()
    return status(f"loading {os.path.basename(path)} ({size / 1e6:.0f} MB)")


class _Codes:
    """Dense int codes for hashable values in order of first appearance, built by C-level map.

    Each value's first running position is stored in a dict (`setdefault` with a counter);
    positions of known values grow monotonically, so a binary search turns them into dense
    codes 0, 1, 2, ... that never change as later chunks add values.
    """

    def __init__(self):
        self.first: dict = {}
        self._counter = count()
        self._positions = np.empty(0, dtype=np.int64)

    def __call__(self, values, n: int) -> np.ndarray:
        pos = np.fromiter(map(self.first.setdefault, values, self._counter), np.int64, n)
        if len(self.first) > len(self._positions):
            new = np.fromiter(islice(self.first.values(), len(self._positions), None), np.int64)
            self._positions = np.concatenate((self._positions, new))
        return np.searchsorted(self._positions, pos).astype(np.int32)

    def values(self) -> list:
        """The distinct values, code order."""
        return list(self.first)


@dataclass
class _Sparse:
    """A column that is rarely set (memcpy bytes, kernel grid, ...): rows and values only."""

    rows: list = dc_field(default_factory=list)
    values: list = dc_field(default_factory=list)

    def add(self, rows: np.ndarray, values: np.ndarray) -> None:
        if len(rows):
            self.rows.append(rows)
            self.values.append(values)

    def dense(self, n: int, fill, dtype, width: int = 0) -> np.ndarray:
        out = np.full((n, width) if width else n, fill, dtype=dtype)
        if self.rows:
            out[np.concatenate(self.rows)] = np.concatenate(self.values)
        return out


@dataclass
class _Columns:
    """What the streaming reader produces: timed-event columns, string tables, flows, meta."""

    head: _Head
    n_raw: int
    cols: dict
    names: _Codes
    threads: _Codes  # (pid, tid)
    devices: _Codes  # (args device, args stream)
    sparse: dict
    flows: list = dc_field(default_factory=list)  # JSON arrays of the flow events, as bytes
    n_flows: int = 0
    n_metadata: int = 0
    warnings: list = dc_field(default_factory=list)


class _Kinds:
    """Categories -> Kind, extended as new categories stream past."""

    def __init__(self):
        self.codes = _Codes()
        self.kind = np.empty(0, np.int8)

    def __call__(self, timed: list, instant: np.ndarray) -> np.ndarray:
        """Kind of every timed event (instants by their ph, the rest by category)."""
        cat = self.codes(map(_cat, timed), len(timed))
        if len(self.codes.first) > len(self.kind):
            new = list(islice(self.codes.first, len(self.kind), None))
            self.kind = np.concatenate((self.kind, np.fromiter(
                (_kind_of(c) for c in new), np.int8, len(new))))
        kind = self.kind[cat]
        kind[instant] = Kind.INSTANT
        return kind


def _kind_of(cat: str) -> Kind:
    return CATEGORY_KIND.get(cat.lower(), Kind.OTHER) if cat else Kind.OTHER


def _read(holder: list, path: str) -> _Columns:
    """Decode the bytes in `holder` (emptied here) into columns, chunk by chunk."""
    data = holder.pop()
    head = _decode_head(data, path)
    raws = head.traceEvents
    head.traceEvents = None
    if raws is None:
        raise TraceFormatError(f"{path}: no 'traceEvents' list (not a Kineto/Chrome trace)")
    del data  # the raw slices still point into the buffer; it goes with them below
    n_raw = len(raws)
    cols = {"ts": np.empty(n_raw, np.float64), "dur": np.empty(n_raw, np.float64),
            "kind": np.empty(n_raw, np.int8), "name": np.empty(n_raw, np.int32),
            "thread": np.empty(n_raw, np.int32), "device": np.empty(n_raw, np.int32),
            "correlation": np.empty(n_raw, np.int64), "external_id": np.empty(n_raw, np.int64)}
    out = _Columns(head=head, n_raw=n_raw, cols=cols, names=_Codes(), threads=_Codes(),
                   devices=_Codes(),
                   sparse={k: _Sparse() for k in ("bytes", "comm_nelems", "comm_group_size",
                                                  "grid", "block")})
    kinds = _Kinds()
    n_bad = 0
    pos = 0
    for lo in range(0, n_raw, CHUNK_EVENTS):
        part = raws[lo:lo + CHUNK_EVENTS]
        raws[lo:lo + CHUNK_EVENTS] = repeat(None, len(part))  # free slices as we go
        events, bad = _decode_chunk(b"[" + b",".join(part) + b"]", path)
        n_bad += bad
        ph = np.fromiter(map(_code, events), np.int8, len(events))
        out.n_metadata += int(np.count_nonzero(ph == _PH_META))
        flow_rows = np.flatnonzero((ph == _PH_FLOW_START) | (ph == _PH_FLOW_END))
        if len(flow_rows):
            # Kept raw: they are decoded again only if correlation ids leave GPU events unlinked.
            out.n_flows += len(flow_rows)
            out.flows.append(b"[" + b",".join(_pick(part, flow_rows)) + b"]")
        rows = np.flatnonzero(ph <= _PH_INSTANT)
        k = len(rows)
        if k:
            timed = events if k == len(events) else _pick(events, rows)
            del events
            cols["kind"][pos:pos + k] = kinds(timed, ph[rows] == _PH_INSTANT)
            _read_timed(timed, pos, out)
            del timed
            pos += k
        del part
    del raws
    if n_bad:
        out.warnings.append(f"{n_bad} events with malformed fields "
                            f"(their args or the event ignored)")
    for key in cols:
        cols[key] = cols[key][:pos]
    return out


def _pick(items: list, rows: np.ndarray) -> list:
    return list(map(items.__getitem__, rows.tolist()))


def _read_timed(timed: list, pos: int, out: _Columns) -> None:
    """Columns of one chunk of timed events (rows pos...); rarely set args kept sparse."""
    k = len(timed)
    sl = slice(pos, pos + k)
    cols = out.cols
    cols["ts"][sl] = np.fromiter(map(_ts, timed), np.float64, k)
    cols["dur"][sl] = np.fromiter(map(_dur, timed), np.float64, k)
    cols["name"][sl] = out.names(map(_name, timed), k)
    cols["thread"][sl] = out.threads(map(_thread, timed), k)
    cols["device"][sl] = out.devices(map(_device_stream, timed), k)
    cols["correlation"][sl] = np.fromiter(map(_correlation, timed), np.int64, k)
    ext = np.fromiter(map(_external_id, timed), np.int64, k)
    # One pass finds the few rows with any rarely set arg; only those are read further.
    rare = np.flatnonzero(np.fromiter(map(ne, map(_rare_args, timed), repeat(_RARE_DEFAULTS)),
                                      bool, k))
    if len(rare):
        timed = _pick(timed, rare)
        n = len(rare)
        old = np.fromiter(map(_external_id_old, timed), np.int64, n)
        ext[rare] = np.where(ext[rare] >= 0, ext[rare], old)
        nbytes = np.fromiter(map(_bytes, timed), np.float64, n)
        has = ~np.isnan(nbytes)
        out.sparse["bytes"].add(rare[has] + pos, nbytes[has])
        for key, get in (("comm_nelems", _in_nelems), ("comm_group_size", _group_size)):
            vals = np.fromiter(map(get, timed), np.int64, n)
            has = vals != -1
            out.sparse[key].add(rare[has] + pos, vals[has])
        for key, get in (("grid", _grid), ("block", _block)):
            rows, dims = [], []
            for row, v in zip(rare.tolist(), map(get, timed)):
                if isinstance(v, list) and v:
                    rows.append(row)
                    dims.append(([x if isinstance(x, int) else 0 for x in v] + [1, 1, 1])[:3])
            if rows:
                out.sparse[key].add(np.asarray(rows, np.int64) + pos,
                                    np.asarray(dims, np.int32))
    cols["external_id"][sl] = ext


def _decode_head(data: bytes, path: str) -> _Head:
    head = data[:4096].lstrip()
    if not head:
        raise TraceFormatError(f"{path}: empty file")
    if head[:1] not in (b"{", b"["):
        raise TraceFormatError(f"{path}: not JSON (a Kineto trace starts with '{{')")
    try:
        if head[:1] == b"[":
            return _Head(traceEvents=_RAW_LIST_DECODER.decode(data))
        return _HEAD_DECODER.decode(data)
    except msgspec.ValidationError:
        pass  # valid JSON with odd metadata types: check each field in Python below
    except msgspec.DecodeError as exc:
        raise _json_error(exc, path) from None
    loose = _LOOSE_HEAD_DECODER.decode(data)
    try:
        events = _EVENTS_ONLY_DECODER.decode(data).traceEvents
    except msgspec.ValidationError:
        events = None  # "traceEvents" is there but is not a list
    props = {}
    for key in ("deviceProperties", "computeProperties"):
        val = getattr(loose, key)
        props[key] = [v for v in val if isinstance(v, dict)] if isinstance(val, list) else None
    di, base, unit = loose.distributedInfo, loose.baseTimeNanoseconds, loose.displayTimeUnit
    return _Head(traceEvents=events, deviceProperties=props["deviceProperties"],
                 computeProperties=props["computeProperties"],
                 distributedInfo=di if isinstance(di, dict) else None,
                 baseTimeNanoseconds=base if isinstance(base, int) else None,
                 displayTimeUnit=unit if isinstance(unit, str) else None,
                 schemaVersion=loose.schemaVersion)


def _json_error(exc: Exception, path: str) -> TraceFormatError:
    msg = str(exc)
    if "truncated" in msg.lower():
        return TraceFormatError(f"{path}: truncated JSON (the file ends mid-way)")
    return TraceFormatError(f"{path}: not valid JSON ({msg})")


def _decode_chunk(buf: bytes, path: str) -> tuple[list, int]:
    """Typed structs for one chunk of events; odd events one by one (count of bad ones)."""
    try:
        return _CHUNK_DECODER.decode(buf), 0
    except msgspec.ValidationError:
        pass  # valid JSON with odd field types or phases: take the per-event path below
    except msgspec.DecodeError as exc:
        raise _json_error(exc, path) from None
    events: list = []
    bad = 0
    for e in msgspec.json.decode(buf):
        if isinstance(e, dict) and not isinstance(e.get("args", {}), dict):
            e = {k: v for k, v in e.items() if k != "args"}
        try:
            events.append(_typed(msgspec.convert(e, _Event, strict=False)))
            continue
        except (msgspec.ValidationError, TypeError):
            pass
        try:  # keep the event, lose only its odd args
            slim = {k: v for k, v in e.items() if k != "args"}
            events.append(_typed(msgspec.convert(slim, _Event, strict=False)))
            bad += 1
        except (msgspec.ValidationError, TypeError, AttributeError):
            bad += 1
            events.append(_Other())  # keep the raw count honest
    return events, bad


def _typed(e: _Event):
    """The fast path's class for an event decoded one by one."""
    cls = _BY_PH.get(e.ph, _Other)
    if issubclass(cls, _Timed):
        return cls(cat=e.cat, name=e.name, pid=e.pid, tid=e.tid, ts=e.ts, dur=e.dur,
                   args=e.args)
    return cls()


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


def _build(read: _Columns, path: str) -> Trace:
    head = read.head
    meta = TraceMeta(path=path, warnings=read.warnings, n_raw_events=read.n_raw)
    meta.device_properties = head.deviceProperties or head.computeProperties or []
    meta.distributed_info = head.distributedInfo
    meta.base_time_ns = head.baseTimeNanoseconds
    meta.display_time_unit = head.displayTimeUnit
    meta.schema_version = head.schemaVersion
    meta.n_flows = read.n_flows
    meta.n_metadata = read.n_metadata
    cols = read.cols
    n = len(cols["ts"])
    if not n:
        raise EmptyTraceError(f"{path}: the trace has no timed events")

    # String pids/tids get codes in order of first appearance, all pids before all tids.
    intern = _Interner()
    threads = read.threads.values()
    pids = np.fromiter((intern(p) for p, _ in threads), np.int64, len(threads))
    tids = np.fromiter((intern(t) for _, t in threads), np.int64, len(threads))
    thread = cols.pop("thread")
    cols["pid"], cols["tid"] = pids[thread], tids[thread]
    del thread
    pairs = read.devices.values()
    devices = np.fromiter((_int(d) for d, _ in pairs), np.int64, len(pairs))
    streams = np.fromiter((_int(s) for _, s in pairs), np.int64, len(pairs))
    cols["stream"] = streams[cols["device"]]
    cols["device"] = devices[cols["device"]]
    sparse = read.sparse
    cols["bytes"] = sparse["bytes"].dense(n, _NAN, np.float64)
    cols["comm_nelems"] = sparse["comm_nelems"].dense(n, -1, np.int64)
    cols["comm_group_size"] = sparse["comm_group_size"].dense(n, -1, np.int64)
    cols["grid"] = sparse["grid"].dense(n, 0, np.int32, 3)
    cols["block"] = sparse["block"].dense(n, 0, np.int32, 3)
    names = read.names.values()
    flows = read.flows
    del read

    ts, dur = cols["ts"], cols["dur"]
    bad_ts = ~np.isfinite(ts)
    if bad_ts.any():
        meta.warnings.append(f"{int(bad_ts.sum())} events without a timestamp dropped")
    neg = dur < 0
    if neg.any():
        meta.warnings.append(f"{int(neg.sum())} negative durations clamped to 0")
        dur[neg] = 0.0
    dur[~np.isfinite(dur)] = 0.0

    order = np.lexsort((-dur, ts))
    order = order[~bad_ts[order]]
    del ts, dur, bad_ts, neg
    if not len(order):
        raise EmptyTraceError(f"{path}: the trace has no timed events")
    for key in list(cols):  # one column at a time: the unsorted one is freed at once
        cols[key] = cols[key][order]
    del order
    _fix_gpu_ids(cols, intern)

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

    `cols` rows must be sorted by (ts, -dur), as `_build` leaves them.  Vectorised: in (thread, start, -dur) order, the depth of an event is the number of longer
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
    # Rows already run in (ts, -dur) order: a stable sort by thread keeps it within threads.
    order = np.lexsort((tid, pid))
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


def _link_by_flows(cols: dict, flows: list, intern: _Interner, missing: np.ndarray,
                   launch: np.ndarray) -> None:
    """Old traces without correlation ids: follow `ac2g` flows from launch to GPU event.

    Runs only for GPU events the correlation ids left unlinked; one pass over the flows.
    """
    starts, ends = {}, {}
    for blob in flows:
        for f in _decode_flows(blob):
            if f.id is None:
                continue
            key = (intern(f.pid), intern(f.tid), float(f.ts))
            (starts if f.ph == "s" else ends)[f.id] = key
    if not starts or not ends:
        return
    pid, tid, ts = cols["pid"], cols["tid"], cols["ts"]
    launchers = np.flatnonzero(np.isin(cols["kind"], LAUNCH_KINDS))
    by_pos: dict[tuple, int] = {}
    for key, r in zip(zip(pid[launchers].tolist(), tid[launchers].tolist(),
                          ts[launchers].tolist()), launchers.tolist()):
        by_pos.setdefault(key, r)
    end_to_rt = {}
    for fid, key in ends.items():
        s = starts.get(fid)
        if s is not None and s in by_pos:
            end_to_rt[key] = by_pos[s]
    for key, r in zip(zip(pid[missing].tolist(), tid[missing].tolist(), ts[missing].tolist()),
                      missing.tolist()):
        hit = end_to_rt.get(key)
        if hit is not None:
            launch[r] = hit


def _decode_flows(blob: bytes) -> list[_Flow]:
    try:
        return _FLOWS_DECODER.decode(blob)
    except msgspec.ValidationError:  # odd fields elsewhere in the event: one by one
        flows = []
        for e in msgspec.json.decode(blob):
            try:
                flows.append(msgspec.convert(e, _Flow, strict=False))
            except (msgspec.ValidationError, TypeError):
                pass
        return flows


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

