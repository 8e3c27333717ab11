"""A Kineto trace as an editable list of its own events: parse once, move times, add clones, write.

Every event is decoded into a small struct whose `args` stay raw JSON bytes, so whatever an
edit does not touch is written back with the same keys and values (key order and whitespace
aside: meaning, not bytes).  Times live in numpy columns beside the structs; an output sets
the changed times on the structs, encodes the whole list in one msgspec call, restores them,
and gzips with ISA-L (level 1: about 8x faster than zlib level 1 here, and smaller).  The
analysis view of the same events is a regular `traceap.Trace`, built from these columns with
the loader's own nesting and launch-linking code, so every quantity means what it means to
the rest of traceap.

`Doc` is the facade over three modules: `doc_format` (the event structs and decoders),
`doc_read` (`DocColumns`: events -> columns, the exact clock) and `doc_write` (`DocWriter`:
slot-encoded writing, gzip).  Here: parsing, the derived columns, the `Trace` view, and the
helpers an edit uses (`args_of`, `clone`, `max_ids`).
"""

from __future__ import annotations

import os
from functools import cached_property

import msgspec
import numpy as np

from ..errors import TraceFormatError
from ..load import read_bytes
from ..load.kineto import _innermost_cpu_op, _link_launches, _nest, _rank_info, _steps
from ..trace import GPU_KINDS, Kind, Trace, TraceMeta
from .doc_format import (_ENC, _EVENTS, _TOP, _WIDE_EVENTS, PH_FLOW_END, PH_FLOW_START, PH_FLOW_STEP,
                         PH_INSTANT, PH_X, Event, WideEvent)
from .doc_read import DocColumns
from .doc_write import DocWriter, gz_bytes, write_file, write_gz


class Doc(DocColumns, DocWriter):
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

    @cached_property
    def max_ids(self) -> dict[str, int]:
        """Largest correlation / External id / flow id in use (new ids start above them)."""
        flow_ids = [i for _, i in self.flow_keys if isinstance(i, int)]
        return {"correlation": int(max(self.correlation.max(initial=0), max(flow_ids, default=0))),
                "external_id": int(self.external_id.max(initial=0))}


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


# the phase codes are re-exported: the inject modules read them with `Doc`
__all__ = ["Doc", "Event", "WideEvent", "args_of", "clone", "gz_bytes", "write_file", "write_gz",
           "PH_FLOW_END", "PH_FLOW_START", "PH_FLOW_STEP", "PH_INSTANT", "PH_X"]
