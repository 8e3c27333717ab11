"""The Kineto event structs a `Doc` decodes a trace into, their decoders, and the phase codes.

`Event` keeps the keys Kineto writes and its `args` as raw JSON, so an edit writes back
whatever it did not touch; `_Args` decodes only the args that feed `Doc`'s columns.
"""

from __future__ import annotations

import re
from operator import attrgetter

import msgspec

from ..trace import CATEGORY_KIND, Kind

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
