"""Reading a `Doc`: its events turned into numpy columns once, and the exact clock of traces
whose times a double cannot hold (ns-resolution epoch clocks)."""

from __future__ import annotations

from operator import attrgetter

import msgspec
import numpy as np

from ..errors import TraceFormatError
from ..load.kineto import _int, _Interner
from ..trace import GPU_KINDS, Kind
from .doc_format import (_ARGS, _ARGS_KINDS, _NAN, _ONE_ARGS, _ORIGIN_STEP_US, _PH, _TIMES, _TRAILING_INT,
                         PH_FLOW_END, PH_FLOW_START, PH_FLOW_STEP, PH_INSTANT, PH_OTHER, PH_X, _get, _kind)


class DocColumns:
    """`Doc`'s columns (`ph`, `kind`, `ts`, `dur`, `name`, `thread`, `gpu_stream`, ids,
    `bytes`) built from its parsed events, and its clock origin."""

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
