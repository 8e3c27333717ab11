"""A Kineto trace as an editable list of its own events: parse once, move times, add clones, write.

Every event is decoded into a small struct whose `args` stay raw JSON bytes, so whatever an
edit does not touch is written back with the same keys and values (key order and whitespace
aside: meaning, not bytes).  Times live in numpy columns beside the structs; an output sets
the changed times on the structs, encodes the whole list in one msgspec call, restores them,
and gzips with ISA-L (level 1: about 8x faster than zlib level 1 here, and smaller).  The
analysis view of the same events is a regular `traceap.Trace`, built from these columns with
the loader's own nesting and launch-linking code, so every quantity means what it means to
the rest of traceap.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from operator import attrgetter
from pathlib import Path

import msgspec
import numpy as np
from isal import igzip, isal_zlib

from ..errors import TraceFormatError
from ..load import read_bytes
from ..load.kineto import (_int, _Interner, _link_launches, _nest, _innermost_cpu_op,
                           _rank_info, _steps)
from ..trace import CATEGORY_KIND, GPU_KINDS, Kind, Trace, TraceMeta

_NAN = float("nan")
_TRAILING_INT = re.compile(r"(\d+)\s*$")  # old traces name GPU threads "stream 7"


class Event(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, gc=False):
    """One trace event with the keys Kineto writes; `args` stays raw JSON.

    Few fields keep encoding fast (each is checked against its default when written);
    a trace with other Chrome-trace keys is read as `WideEvent`s instead.
    """

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    id: int | str | None = None
    bp: str | None = None
    s: str | None = None
    args: msgspec.Raw = msgspec.Raw()  # empty = no args key (msgspec omits the default)


class WideEvent(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, gc=False):
    """An event with every top-level key of the Chrome trace format."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    tts: int | float | None = None
    tdur: int | float | None = None
    id: int | str | None = None
    id2: object = None
    bp: str | None = None
    s: str | None = None
    cname: str | None = None
    scope: str | None = None
    sf: object = None
    stack: object = None
    bind_id: object = None
    flow_in: bool | None = None
    flow_out: bool | None = None
    args: msgspec.Raw = msgspec.Raw()


class _Args(msgspec.Struct, gc=False):
    """The args every column needs (the rest stay raw)."""

    correlation: int = -1
    external_id: int = msgspec.field(default=-1, name="External id")
    external_id_old: int = msgspec.field(default=-1, name="external id")
    device: int | str = -1
    stream: int | str = -1
    bytes: float = _NAN
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    group_size: int = msgspec.field(default=-1, name="Group size")


_EVENTS = msgspec.json.Decoder(list[Event])
_WIDE_EVENTS = msgspec.json.Decoder(list[WideEvent])
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARGS = msgspec.json.Decoder(list[_Args | None], strict=False)
_ONE_ARGS = msgspec.json.Decoder(_Args | None, strict=False)
_ENC = msgspec.json.Encoder()


class _Time(msgspec.Struct):
    """An event's ts as written (its text), for traces whose times a double cannot hold."""

    ts: msgspec.Raw = msgspec.Raw()


_TIMES = msgspec.json.Decoder(list[_Time])

#: Whole microseconds the clock origin of an exact-time trace is a multiple of (`Doc.origin_us`).
_ORIGIN_STEP_US = 10 ** 9

#: Kinds whose args feed columns (the rest keep their args raw and undecoded).
_ARGS_KINDS = (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER, Kind.KERNEL, Kind.GPU_MEMCPY,
               Kind.GPU_MEMSET, Kind.GPU_USER_ANNOTATION)

#: Phase codes of the `ph` column.
PH_X, PH_INSTANT, PH_FLOW_START, PH_FLOW_STEP, PH_FLOW_END, PH_META, PH_OTHER = range(7)
_PH = {"X": PH_X, "i": PH_INSTANT, "I": PH_INSTANT, "s": PH_FLOW_START, "t": PH_FLOW_STEP,
       "f": PH_FLOW_END, "M": PH_META}

_get = {k: attrgetter(k) for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")}


def _kind(cat) -> int:
    return int(CATEGORY_KIND.get(cat.lower(), Kind.OTHER)) if isinstance(cat, str) else int(Kind.OTHER)


class Doc:
    """One parsed trace: its events (structs), top-level keys (raw) and columns in file order.

    Columns (numpy, one entry per event in `events`): `ph` (PH_* code), `kind` (`Kind`, for
    X and instant events), `ts`, `dur` (float64 us, NaN where absent; `ts` counts from
    `origin_us`, 0 but for ns-resolution epoch clocks: `_exact_clock`), `name` (code into
    `names`), `thread` (code of (pid, tid)), `gpu_stream` (code of (device, stream) for GPU
    events, -1 elsewhere), `correlation`, `external_id`, `flow_id` (code of (cat, id) for
    flow events), `bytes`.
    """

    def __init__(self, path: str | os.PathLike, data: bytes | None = None):
        self.path = str(path)
        data = read_bytes(path) if data is None else data
        head = data[:64].lstrip()
        try:
            if head[:1] == b"[":
                self.top: dict[str, msgspec.Raw] | None = None
                raw_events = data
            else:
                self.top = _TOP.decode(data)
                raw_events = self.top.get("traceEvents")
                if raw_events is None:
                    raise TraceFormatError(f"{path}: no 'traceEvents' list (not a Kineto trace)")
            try:
                self.events: list = _EVENTS.decode(raw_events)
            except msgspec.ValidationError:
                self.events = _WIDE_EVENTS.decode(raw_events)
        except msgspec.ValidationError as exc:
            raise TraceFormatError(f"{path}: an event has a field of an unexpected type or an "
                                   f"unknown key, so it cannot be edited faithfully ({exc})") from None
        except msgspec.DecodeError as exc:
            raise TraceFormatError(f"{path}: not valid JSON ({exc})") from None
        self._columns()
        self._exact_clock(raw_events)

    # -- columns -------------------------------------------------------------------------------
    def _columns(self) -> None:
        ev = self.events
        n = len(ev)
        self.n_base = n
        self.ph = _codes_of(map(_get["ph"], ev), n, _PH_LIST, PH_OTHER)
        cat_codes, cat_values = _dense(map(_get["cat"], ev), n)
        kind_by_cat = np.array([_kind(c) for c in cat_values], np.int8)
        self.kind = kind_by_cat[cat_codes] if n else np.zeros(0, np.int8)
        self.kind[self.ph == PH_INSTANT] = Kind.INSTANT
        self.cat_names = [c if isinstance(c, str) else "" for c in cat_values]
        self.cat = cat_codes
        ts_raw = list(map(_get["ts"], ev))
        # Old traces write integer us; keep writing integers there.
        self.ts_is_int = set(map(type, ts_raw)) <= {int, type(None)}
        self.ts = np.array(ts_raw, dtype=np.float64) if n else np.zeros(0)
        del ts_raw
        self.dur = np.array(list(map(_get["dur"], ev)), dtype=np.float64) if n else np.zeros(0)
        self.has_dur = ~np.isnan(self.dur)
        self.name, names = _dense(map(_get["name"], ev), n)
        self.names = [x if isinstance(x, str) else "" for x in names]
        pids, tids = list(map(_get["pid"], ev)), list(map(_get["tid"], ev))
        self.thread, self.threads = _dense(zip(pids, tids), n)
        del pids, tids
        intern = _Interner()
        self._intern = intern
        self.thread_pid = np.array([intern(p) if p is not None else 0 for p, _ in self.threads],
                                   np.int64)
        self.thread_tid = np.array([intern(t) if t is not None else 0 for _, t in self.threads],
                                   np.int64)
        # "24572" and 24572 are one thread to the loader: one key per interned (pid, tid)
        pairs = list(zip(self.thread_pid.tolist(), self.thread_tid.tolist()))
        key_of_thread, self.thread_keys = _dense(pairs, len(pairs))
        self.thread_key = key_of_thread[self.thread] if n else np.zeros(0, np.int32)
        self._args_columns()
        self._flow_columns()

    def _exact_clock(self, raw_events) -> None:
        """Read the times again as text where a double cannot hold them, and count from an origin.

        A trace with ns-resolution epoch times (16 integer digits of us and 3 decimals, as
        HTA's `ns_resolution_trace`) has 19 significant digits, a double 16: read as floats,
        its times snap to a 0.25 us grid, and kernels back to back on a stream overlap once
        moved.  Such a trace's `ts` column counts from `origin_us` (a whole number of us, a
        multiple of 1e9, subtracted exactly from the text), where a double keeps every ns;
        writing adds it back exactly (`encode`).  Other traces keep origin 0, their times as read.
        """
        self.origin_us = 0
        ts = self.ts[np.isfinite(self.ts)]
        if self.ts_is_int or not len(ts) or np.spacing(np.abs(ts).max()) < 0.001:
            return  # integer us, or ns fit in a double
        texts = [bytes(t.ts) for t in _TIMES.decode(raw_events)]
        ns = np.zeros(len(texts), np.int64)
        for i, t in enumerate(texts):
            if not t:
                continue
            whole, _, frac = t.partition(b".")
            if not whole.isdigit() or len(frac) > 3 or (frac and not frac.isdigit()):
                return  # exponents, negative or sub-ns times: keep the float clock
            ns[i] = int(whole) * 1000 + int(frac.ljust(3, b"0") or b"0")
        has = np.isfinite(self.ts)
        origin = int(ns[has].min() // (1000 * _ORIGIN_STEP_US)) * _ORIGIN_STEP_US
        self.origin_us = origin
        self.ts = np.where(has, (ns - origin * 1000) / 1000.0, np.nan)
        self.__dict__.pop("trace", None)  # built from the float clock: build it again

    def absolute_us(self, t):
        """A time of this Doc's clock in the file's clock (what `traceap.load` reads)."""
        return t + self.origin_us

    def _args_columns(self) -> None:
        n = len(self.events)
        self.correlation = np.full(n, -1, np.int64)
        self.external_id = np.full(n, -1, np.int64)
        self.device = np.full(n, -1, np.int64)
        self.stream = np.full(n, -1, np.int64)
        self.bytes = np.full(n, _NAN)
        self.comm_nelems = np.full(n, -1, np.int64)
        self.comm_group_size = np.full(n, -1, np.int64)
        # args matter for runtime calls and GPU events (correlation, device, stream, bytes)
        # and for collectives' cpu ops (message size); the rest stay raw, undecoded
        comm = np.array([nm.startswith(("record_param_comms", "nccl:", "c10d::")) for nm in self.names],
                        bool)
        wanted = np.isin(self.kind, _ARGS_KINDS) | (comm[self.name] if len(self.names) else False)
        rows = np.flatnonzero(((self.ph == PH_X) | (self.ph == PH_INSTANT)) & wanted)
        lens = np.fromiter(map(len, map(_get["args"], self.events)), np.int64, n)
        rows = rows[lens[rows] > 1]  # "{}" and absent args carry nothing
        raws = [self.events[i].args for i in rows.tolist()]
        if not len(rows):
            self._gpu_ids()
            return
        try:
            parsed = _ARGS.decode(b"[" + b",".join(raws) + b"]")
        except msgspec.ValidationError:  # odd arg types somewhere: one by one, odd ones ignored
            parsed = []
            for r in raws:
                try:
                    parsed.append(_ONE_ARGS.decode(r))
                except msgspec.ValidationError:
                    parsed.append(None)
        except msgspec.DecodeError as exc:
            raise TraceFormatError(f"{self.path}: bad event args ({exc})") from None
        ok = [j for j, a in enumerate(parsed) if a is not None]
        rows = rows[ok]
        parsed = [parsed[j] for j in ok]
        m = len(parsed)
        col = {k: list(map(attrgetter(k), parsed)) for k in (
            "correlation", "external_id", "external_id_old", "device", "stream", "bytes",
            "in_nelems", "group_size")}
        self.correlation[rows] = np.fromiter(col["correlation"], np.int64, m)
        ext = np.fromiter(col["external_id"], np.int64, m)
        ext_old = np.fromiter(col["external_id_old"], np.int64, m)
        self.external_id[rows] = np.where(ext >= 0, ext, ext_old)
        self.device[rows] = _ints(col["device"], m)
        self.stream[rows] = _ints(col["stream"], m)
        self.bytes[rows] = np.fromiter(col["bytes"], np.float64, m)
        self.comm_nelems[rows] = np.fromiter(col["in_nelems"], np.int64, m)
        self.comm_group_size[rows] = np.fromiter(col["group_size"], np.int64, m)
        self._gpu_ids()

    def _gpu_ids(self) -> None:
        """GPU events: device from pid and stream from tid ("stream 7") where args lack them."""
        gpu = np.isin(self.kind, GPU_KINDS) & (self.ph == PH_X)
        pid = self.thread_pid[self.thread]
        tid = self.thread_tid[self.thread]
        dev = np.where(self.device >= 0, self.device, np.maximum(pid, 0))
        by_code = {}
        for s, code in self._intern.codes.items():
            m = _TRAILING_INT.search(s) if isinstance(s, str) else None
            if m:
                by_code[code] = int(m.group(1))
        stream = self.stream.copy()
        missing = gpu & (stream < 0)
        if missing.any():
            stream[missing] = [by_code.get(int(t), int(t)) for t in tid[missing]]
        self.device = np.where(gpu, dev, -1)
        self.stream = np.where(gpu, stream, -1)
        keys = np.where(gpu, self.device * (1 << 40) + (self.stream & ((1 << 40) - 1)), -1)
        uniq, inv = np.unique(keys, return_inverse=True)
        code = inv.astype(np.int32) - (1 if len(uniq) and uniq[0] == -1 else 0)
        self.gpu_stream = np.where(gpu, code, -1).astype(np.int32)
        self.gpu_stream_keys = [(int(k >> 40), int(k & ((1 << 40) - 1))) for k in uniq if k >= 0]

    def _flow_columns(self) -> None:
        n = len(self.events)
        is_flow = (self.ph == PH_FLOW_START) | (self.ph == PH_FLOW_END) | (self.ph == PH_FLOW_STEP)
        self.flow_id = np.full(n, -1, np.int64)
        rows = np.flatnonzero(is_flow)
        flows = [self.events[i] for i in rows.tolist()]
        codes, keys = _dense(zip(map(_get["cat"], flows), map(_get["id"], flows)), len(flows))
        self.flow_id[rows] = codes
        self.flow_keys = keys

    # -- derived --------------------------------------------------------------------------------
    @cached_property
    def end(self) -> np.ndarray:
        """ts + dur (ts where dur is absent)."""
        return self.ts + np.nan_to_num(self.dur)

    @cached_property
    def is_gpu(self) -> np.ndarray:
        """Per event: a GPU-side X event (kernel, memcpy, memset, GPU annotation)."""
        return np.isin(self.kind, GPU_KINDS) & (self.ph == PH_X)

    @cached_property
    def is_gpu_work(self) -> np.ndarray:
        """Per event: kernel, memcpy or memset."""
        return np.isin(self.kind, (Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET)) & (self.ph == PH_X)

    @cached_property
    def trace(self) -> Trace:
        """The analysis view (`traceap.Trace`); `row_event[row]` is the event of each row."""
        timed = np.flatnonzero(((self.ph == PH_X) | (self.ph == PH_INSTANT)) & np.isfinite(self.ts))
        dur = np.nan_to_num(self.dur[timed])
        dur = np.where(dur < 0, 0.0, dur)
        order = timed[np.lexsort((-dur, self.ts[timed]))]
        self.row_event = order
        d = np.nan_to_num(self.dur[order])
        cols = {
            "ts": self.ts[order].copy(), "dur": np.where(d < 0, 0.0, d),
            "kind": self.kind[order].copy(), "name": self.name[order].copy(),
            "pid": self.thread_pid[self.thread[order]], "tid": self.thread_tid[self.thread[order]],
            "device": self.device[order].astype(np.int16), "stream": self.stream[order].copy(),
            "correlation": self.correlation[order].copy(),
            "external_id": self.external_id[order].copy(),
            "bytes": self.bytes[order].copy(), "comm_nelems": self.comm_nelems[order].copy(),
            "comm_group_size": self.comm_group_size[order].copy(),
            "grid": np.zeros((len(order), 3), np.int32), "block": np.zeros((len(order), 3), np.int32),
        }
        meta = TraceMeta(path=self.path, n_raw_events=len(self.events))
        top = self.top or {}
        for key, attr in (("deviceProperties", "device_properties"),
                          ("computeProperties", "device_properties")):
            if key in top and not getattr(meta, attr):
                try:
                    val = msgspec.json.decode(top[key])
                except msgspec.DecodeError:
                    val = None
                if isinstance(val, list):
                    setattr(meta, attr, [v for v in val if isinstance(v, dict)])
        if "distributedInfo" in top:
            di = msgspec.json.decode(top["distributedInfo"])
            meta.distributed_info = di if isinstance(di, dict) else None
        parent, depth = _nest(cols)
        flows = []
        fl = np.flatnonzero(self.flow_id >= 0)
        if len(fl):
            flows = [_ENC.encode([self.events[i] for i in fl.tolist()])]
        launch = _link_launches(cols, flows, self._intern, meta)
        cols.update(parent=parent, depth=depth, launch=launch,
                    cpu_op=_innermost_cpu_op(cols["kind"], parent, launch))
        steps = _steps(cols, self.names)
        _rank_info(meta, self.path)
        return Trace(self.names, cols, meta, steps)

    # -- writing ------------------------------------------------------------------------------
    @cached_property
    def _template(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The trace encoded once with fixed-width slots where every ts and dur goes.

        Each ts / dur is written as `_SLOT` bytes of a marker that JSON text never holds
        (a raw control byte); an output copies this buffer and writes its numbers into the
        slots, padded with spaces (whitespace after a number is valid JSON).  Returns the
        buffer, the slot offsets of the events with a ts and with a dur (file order), and the
        offset of the marker where added events go.
        """
        _ = self.trace  # built from the structs' own times before they are replaced
        ts_mark = msgspec.Raw(b"\x01" * _SLOT)
        dur_mark = msgspec.Raw(b"\x02" * _SLOT)
        has_ts = np.isfinite(self.ts)
        for e, h, d in zip(self.events, has_ts.tolist(), self.has_dur.tolist()):
            e.ts = ts_mark if h else None
            e.dur = dur_mark if d else None
        tail = msgspec.Raw(b"\x03")
        events = self.events + [tail]
        if self.top is None:
            data = _ENC.encode(events)
        else:
            top = dict(self.top)
            top["traceEvents"] = events
            data = _ENC.encode(top)
        buf = np.frombuffer(data, np.uint8).copy()
        ts_at = _slot_starts(buf, 1)
        dur_at = _slot_starts(buf, 2)
        at = np.array([data.rfind(b"\x03")])
        if len(ts_at) != int(has_ts.sum()) or len(dur_at) != int(self.has_dur.sum()) or at[0] < 0:
            raise TraceFormatError(f"{self.path}: cannot lay out the trace for editing")
        self._held = {}
        return buf, ts_at, dur_at, int(at[0])

    @cached_property
    def _slot_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Byte offsets of every cell of every ts / dur slot of the template."""
        _, ts_at, dur_at, _ = self._template
        return ((ts_at[:, None] + np.arange(_SLOT)).ravel(),
                (dur_at[:, None] + np.arange(_SLOT)).ravel())

    def encode(self, ts: np.ndarray, dur: np.ndarray, added: list,
               top_changes: dict[str, object] | None = None) -> bytes:
        """The JSON of this trace with base events at `ts`/`dur` and `added` appended."""
        return b"".join(self.encode_pieces(ts, dur, added, top_changes))

    def encode_gz(self, ts: np.ndarray, dur: np.ndarray, added: list,
                  top_changes: dict[str, object] | None = None) -> bytes:
        """`encode`, gzipped as `write_gz` does, without joining the pieces first."""
        c = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
        parts = [c.compress(p) for p in self.encode_pieces(ts, dur, added, top_changes)]
        return b"".join(parts) + c.flush()

    def encode_pieces(self, ts: np.ndarray, dur: np.ndarray, added: list,
                      top_changes: dict[str, object] | None = None) -> list:
        """The JSON as a few byte pieces; they view a buffer the next call rewrites.

        Values that did not move are written as read; moved ones at the trace's resolution.
        """
        buf, ts_at, dur_at, at = self._template
        out = buf  # the template is reused: only slots whose value changes are rewritten
        if out[at] != 3:  # the previous output blanked the marker: put it back
            out[at] = 3
            if at and out[at - 1] == 32:
                out[at - 1] = 44
        has_ts = np.isfinite(self.ts)
        t, t0 = ts[has_ts], self.ts[has_ts]
        t = np.where(t == t0, t0, self._rounded(t))
        d, d0 = dur[self.has_dur], self.dur[self.has_dur]
        d = np.where(d == d0, d0, np.maximum(self._rounded(d), 0.0))
        self._refill(out, ts_at, t, "ts")
        self._refill(out, dur_at, d, "dur")
        extra = _ENC.encode(self._in_file_clock(added))[1:-1] if added else b""
        if not extra:  # the marker and the comma before it become blanks
            out[at] = 32
            if at and out[at - 1] == 44:
                out[at - 1] = 32
        mv = memoryview(out)
        pieces = [mv[:at], extra, mv[at + 1:]] if extra else [mv]
        if top_changes and self.top is not None:
            keys = b"".join(b"," + _ENC.encode(k) + b":" + _ENC.encode(v)
                            for k, v in top_changes.items() if k not in self.top)
            pieces[-1] = pieces[-1][:-1]  # the document's closing brace
            pieces += [keys, b"}"]
        return pieces

    def _in_file_clock(self, added: list) -> list:
        """Added events with their ts in the file's clock, written exactly (`origin_us`)."""
        if not self.origin_us:
            return added
        out = []
        for e in added:
            if isinstance(e.ts, (int, float)):
                e = msgspec.structs.replace(e, ts=msgspec.Raw(_exact_text(e.ts, self.origin_us)))
            out.append(e)
        return out

    def _refill(self, out: np.ndarray, at: np.ndarray, values: np.ndarray, key: str) -> None:
        """Write the slots whose value differs from what the buffer holds now."""
        held = self._held.get(key)
        change = None if held is None else np.flatnonzero(values != held)
        if change is not None and not len(change):
            return
        origin = self.origin_us if key == "ts" else 0
        if change is None or len(change) > len(at) // 2:  # most move: write every slot
            _fill(out, at, values, self._fixed_point, self._slot_index[0 if key == "ts" else 1],
                  origin)
        else:
            sel = at[change]
            _fill(out, sel, values[change], self._fixed_point,
                  (sel[:, None] + np.arange(_SLOT)).ravel(), origin)
        self._held[key] = values.copy()

    @cached_property
    def _fixed_point(self) -> int | None:
        """Decimals every time of this trace has (0 or 3), or None (then numbers are printed
        by msgspec, value by value): fixed-point times are printed with numpy arithmetic."""
        vals = np.concatenate((self.ts[np.isfinite(self.ts)], self.dur[self.has_dur]))
        if not len(vals) or vals.min() < 0 or vals.max() >= 1e16:
            return None
        if self.ts_is_int:
            return 0 if np.all(vals == np.floor(vals)) else None
        ip = np.floor(vals)
        milli = (vals - ip) * 1000.0
        return 3 if np.all(np.abs(milli - np.rint(milli)) < 1e-3) else None

    def _rounded(self, x: np.ndarray) -> np.ndarray:
        return np.rint(x) if self.ts_is_int else np.round(x, 3)

    def _typed(self, x: np.ndarray) -> list:
        return x.astype(np.int64).tolist() if self.ts_is_int else x.tolist()

    def numbers(self, values: np.ndarray, dur: bool = False) -> list:
        """Times as this trace writes them: integer us in old traces, else ns-rounded floats."""
        if self.ts_is_int:
            return np.rint(values).astype(np.int64).tolist()
        out = np.round(values, 3)
        if dur:
            out = np.maximum(out, 0.0)
        return out.tolist()

    @cached_property
    def max_ids(self) -> dict[str, int]:
        """Largest correlation / External id / flow id in use (new ids start above them)."""
        flow_ids = [i for _, i in self.flow_keys if isinstance(i, int)]
        return {"correlation": int(max(self.correlation.max(initial=0), max(flow_ids, default=0))),
                "external_id": int(self.external_id.max(initial=0))}


_PH_LIST = _PH


def _codes_of(values, n: int, table: dict, other: int) -> np.ndarray:
    """Small-int codes of values through `table` (`other` for anything else)."""
    return np.fromiter(map(table.get, values, [other] * n), np.int8, n)


def _dense(values, n: int) -> tuple[np.ndarray, list]:
    """Dense int32 codes of hashable values in order of first appearance, and the values."""
    first: dict = {}
    pos = np.fromiter(map(first.setdefault, values, range(n)), np.int64, n)
    firsts = np.fromiter(first.values(), np.int64, len(first))
    return np.searchsorted(firsts, pos).astype(np.int32), list(first)


def _ints(values, m: int) -> np.ndarray:
    """Ints of device / stream args that may be written "0x0" or "7" (each distinct value once)."""
    codes, uniq = _dense(values, m)
    return np.array([_int(v) for v in uniq], np.int64)[codes] if m else np.zeros(0, np.int64)


#: Width of a ts / dur slot: the longest number text a double takes in JSON is 24 bytes.
_SLOT = 24


def _slot_starts(buf: np.ndarray, marker: int) -> np.ndarray:
    """Offsets of the runs of `marker` bytes (one per slot).

    Every run of _SLOT bytes holds exactly one offset that is a multiple of _SLOT: sample
    those, then step back to the run's start (slots never touch: text separates them).
    """
    hit = np.flatnonzero(buf[::_SLOT] == marker) * _SLOT
    if not len(hit):
        return hit
    lead = np.zeros(len(hit), np.int64)
    alive = np.ones(len(hit), bool)
    for j in range(1, _SLOT):
        alive &= buf[np.maximum(hit - j, 0)] == marker
        alive &= hit - j >= 0
        lead += alive
    return hit - lead


def _fill(buf: np.ndarray, at: np.ndarray, values: np.ndarray, decimals: int | None,
          index: np.ndarray, origin: int = 0) -> None:
    """Write numbers (plus a whole-us `origin`, added exactly) into their slots."""
    if not len(at):
        return
    if origin:
        if decimals != 3 or values.min() < 0 or values.max() + origin >= 1e16:
            raise TraceFormatError("an exact-clock time has more than 3 decimals or 16 digits")
        cells = _cells_fixed(values, decimals, origin)
    elif decimals is None or values.min() < 0 or values.max() >= 1e16:
        cells = _cells_json(values, decimals)
    else:
        cells = _cells_fixed(values, decimals)
    buf[index] = cells.ravel()


_POW10_DESC = 10 ** np.arange(15, -1, -1, dtype=np.int64)  # 1e15 .. 1: values < 2**52


def _exact_text(t: float, origin: int) -> bytes:
    """`t` (us, 3 decimals) + a whole-us origin as fixed-point text, without a double's sum."""
    ns = int(round(float(t) * 1000.0)) + origin * 1000
    return b"%d.%03d" % divmod(ns, 1000)


def _cells_fixed(values: np.ndarray, decimals: int, origin: int = 0) -> np.ndarray:
    """Fixed-point texts (integers, or 3 decimals), right-aligned in (n, _SLOT) bytes;
    `origin` (whole us) is added to the integer part, exactly.

    Blanks before a number are JSON whitespace like those after it; right-aligning lets
    every digit be computed by broadcasting, without a loop over positions.
    """
    ip = np.floor(values).astype(np.int64)
    n = len(values)
    out = np.full((n, _SLOT), 32, np.uint8)
    if decimals:
        frac = np.rint((values - ip) * 1000.0).astype(np.int64)
        carry = frac >= 1000
        ip[carry] += 1
        frac[carry] -= 1000
        out[:, -4] = 46  # "."
        out[:, -3] = 48 + frac // 100
        out[:, -2] = 48 + (frac // 10) % 10
        out[:, -1] = 48 + frac % 10
    ip += origin
    # 16 integer digits as four 4-digit groups, each looked up in a table of "0000".."9999"
    end = _SLOT - (4 if decimals else 0)
    block = out[:, end - 16:end]
    x = ip
    for g in range(3, -1, -1):
        block[:, 4 * g:4 * g + 4] = _DIGITS4[x % 10_000]
        x = x // 10_000
    # blank the leading zeros (keep one "0" for zero)
    shown = ip[:, None] >= _POW10_DESC[None, :]
    shown[:, -1] = True
    out[:, end - 16:end] = np.where(shown, block, np.uint8(32))
    return out


_DIGITS4 = np.frombuffer(b"".join(b"%04d" % i for i in range(10_000)), np.uint8).reshape(10_000, 4)


def _cells_json(values: np.ndarray, decimals: int | None) -> np.ndarray:
    """Texts as msgspec writes each value (any float), as an (n, _SLOT) byte array."""
    vals = values.astype(np.int64).tolist() if decimals == 0 else values.tolist()
    txt = _ENC.encode(vals)[1:-1].split(b",")
    # S25 first: a text longer than the slot would be cut silently by S24
    cells = np.array(txt, dtype=f"S{_SLOT + 1}")
    if cells.dtype.itemsize > _SLOT and (cells.view(np.uint8).reshape(len(txt), -1)[:, _SLOT] != 0).any():
        raise TraceFormatError("a time does not fit its slot")
    cells = cells.astype(f"S{_SLOT}").view(np.uint8).reshape(len(txt), _SLOT).copy()
    cells[cells == 0] = 32  # space
    return cells


def write_gz(path: str | os.PathLike, data: bytes) -> None:
    """Write gzip bytes (ISA-L level 1, mtime 0: same input, same bytes), atomically."""
    write_file(path, gz_bytes(data))


def write_file(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes atomically (a reader never sees half a trace)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, p)


def gz_bytes(data: bytes) -> bytes:
    """The gzip of `data` as `write_gz` writes it."""
    return igzip.compress(data, 1, mtime=0)


def args_of(event: Event) -> dict:
    """An event's args as a dict (copy; empty when absent)."""
    if not len(event.args):
        return {}
    val = msgspec.json.decode(event.args)
    return dict(val) if isinstance(val, dict) else {}


def clone(template: Event, **changes) -> Event:
    """A copy of `template` with top-level fields changed; `args=` takes a dict."""
    args = changes.pop("args", None)
    out = msgspec.structs.replace(template, **changes)
    if args is not None:
        out.args = msgspec.Raw(_ENC.encode(args))
    return out


__all__ = ["Doc", "Event", "WideEvent", "args_of", "clone", "gz_bytes", "write_file", "write_gz"]
