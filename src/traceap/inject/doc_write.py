"""Writing a `Doc`: the trace encoded once with fixed-width slots for every ts and dur, the
slots refilled with the edited times, added events appended, gzip with ISA-L."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import msgspec
import numpy as np
from isal import igzip, isal_zlib

from ..errors import TraceFormatError
from .doc_format import _ENC


class DocWriter:
    """`Doc`'s outputs: `encode`, `encode_gz`, `encode_pieces` and the number formatting
    that keeps unchanged times written as they were read."""

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
