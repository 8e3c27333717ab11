"""The in-memory trace: typed columns, one row per event, names as codes into a string table.

Everything downstream (windows, detectors, reports) reads a `Trace`; nothing keeps per-event
Python objects.  Rows are sorted by (ts, -dur).  Link columns hold row indices (-1 = none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property

import numpy as np


class Kind(IntEnum):
    """What an event is.  Old (2021) and AMD category names map onto the same kinds."""

    CPU_OP = 0
    PYTHON_FUNCTION = 1
    USER_ANNOTATION = 2
    CUDA_RUNTIME = 3
    CUDA_DRIVER = 4
    KERNEL = 5
    GPU_MEMCPY = 6
    GPU_MEMSET = 7
    GPU_USER_ANNOTATION = 8
    INSTANT = 9
    OTHER = 10


KIND_NAMES = {k: k.name.lower() for k in Kind}

#: Kineto categories (every spelling seen 2021-2026, NVIDIA and AMD) -> Kind.
CATEGORY_KIND = {
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "python_function": Kind.PYTHON_FUNCTION,
    "python": Kind.PYTHON_FUNCTION,
    "user_annotation": Kind.USER_ANNOTATION,
    "gpu_user_annotation": Kind.GPU_USER_ANNOTATION,
    "cuda_runtime": Kind.CUDA_RUNTIME,
    "runtime": Kind.CUDA_RUNTIME,
    "hip_runtime": Kind.CUDA_RUNTIME,
    "cuda_driver": Kind.CUDA_DRIVER,
    "driver": Kind.CUDA_DRIVER,
    "hip_driver": Kind.CUDA_DRIVER,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.GPU_MEMCPY,
    "memcpy": Kind.GPU_MEMCPY,
    "gpu_memset": Kind.GPU_MEMSET,
    "memset": Kind.GPU_MEMSET,
    "cpu_instant_event": Kind.INSTANT,
}

GPU_KINDS = (Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET, Kind.GPU_USER_ANNOTATION)
#: GPU work that occupies the device (annotations do not).
GPU_WORK_KINDS = (Kind.KERNEL, Kind.GPU_MEMCPY, Kind.GPU_MEMSET)
LAUNCH_KINDS = (Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)


class CopyKind(IntEnum):
    """Direction of a memcpy, parsed from its name (``Memcpy HtoD (Pageable -> Device)``)."""

    NONE = 0
    HTOD = 1
    DTOH = 2
    DTOD = 3
    HTOH = 4
    PTOP = 5
    OTHER = 6


class MemKind(IntEnum):
    """Host/device memory kind of a memcpy end point."""

    UNKNOWN = 0
    PAGEABLE = 1
    PINNED = 2
    DEVICE = 3
    MANAGED = 4
    HOST = 5  # ROCm writes "Host" without saying pageable or pinned
    ARRAY = 6


_COPY_RE = re.compile(r"Memcpy\s+(\w+)(?:\s*\((\w+)\s*->\s*(\w+)\))?", re.IGNORECASE)
_COPY_DIR = {"htod": CopyKind.HTOD, "dtoh": CopyKind.DTOH, "dtod": CopyKind.DTOD,
             "htoh": CopyKind.HTOH, "ptop": CopyKind.PTOP}
_MEM = {"pageable": MemKind.PAGEABLE, "pinned": MemKind.PINNED, "device": MemKind.DEVICE,
        "managed": MemKind.MANAGED, "host": MemKind.HOST, "array": MemKind.ARRAY}

_NCCL_RE = re.compile(r"^(?:void\s+)?(?:nccl|rccl|ncclDevKernel|ncclKernel)", re.IGNORECASE)
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

#: Runtime calls that block the host until the device (or a stream/event) catches up.
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaStreamWaitEvent", "cudaMemcpyDtoH", "hipDeviceSynchronize", "hipStreamSynchronize",
    "hipEventSynchronize", "hipMemcpy", "hipStreamWaitEvent", "cuCtxSynchronize",
    "cuStreamSynchronize", "cuEventSynchronize",
})


def parse_copy_name(name: str) -> tuple[CopyKind, MemKind, MemKind]:
    """Direction and memory kinds of a memcpy event name; NONE for anything else."""
    m = _COPY_RE.search(name)
    if not m:
        return CopyKind.NONE, MemKind.UNKNOWN, MemKind.UNKNOWN
    direction = _COPY_DIR.get(m.group(1).lower(), CopyKind.OTHER)
    src = _MEM.get((m.group(2) or "").lower(), MemKind.UNKNOWN)
    dst = _MEM.get((m.group(3) or "").lower(), MemKind.UNKNOWN)
    return direction, src, dst


def is_nccl_name(name: str) -> bool:
    """True for NCCL/RCCL collective kernels, old (`ncclKernel_*`) and new (`ncclDevKernel_*`)."""
    return bool(_NCCL_RE.match(name))


@dataclass
class Step:
    """A ``ProfilerStep#N`` span."""

    number: int
    start_us: float
    end_us: float


@dataclass
class TraceMeta:
    """What the trace says about itself, beside its events."""

    path: str = ""
    device_properties: list[dict] = field(default_factory=list)
    distributed_info: dict | None = None
    base_time_ns: int | None = None
    display_time_unit: str | None = None
    schema_version: object = None
    rank: int | None = None
    #: True when `rank` is only the file's position in a folder (the trace said none).
    rank_assigned: bool = False
    world_size: int | None = None
    backend: str | None = None
    warnings: list[str] = field(default_factory=list)
    n_flows: int = 0
    n_metadata: int = 0
    #: Raw count of `traceEvents` entries in the file (before any event was dropped).
    n_raw_events: int = 0


class Trace:
    """A loaded trace as columns.  Build one with `traceap.load`."""

    #: Column names (all numpy arrays of equal length, rows sorted by ts).
    COLUMNS = (
        "ts", "dur", "kind", "name", "pid", "tid", "device", "stream", "correlation",
        "external_id", "bytes", "grid", "block", "comm_nelems", "comm_group_size",
        "parent", "depth", "launch", "cpu_op",
    )

    def __init__(self, names: list[str], columns: dict[str, np.ndarray], meta: TraceMeta,
                 steps: list[Step] | None = None):
        self.names = names
        for col in self.COLUMNS:
            setattr(self, col, columns[col])
        self.meta = meta
        self.steps = steps or []

    # ts: float64 us; dur: float64 us; kind: int8 Kind; name: int32 code into `names`;
    # pid/tid: int64 (string ids are interned to negative codes); device: int16 (-1 on CPU);
    # stream: int64 (-1 on CPU); correlation / external_id: int64 (-1 = none);
    # bytes: float64 (memcpy/memset, NaN otherwise); grid / block: int32 (n, 3);
    # comm_nelems / comm_group_size: int64 (NCCL / record_param_comms, -1 = none);
    # parent: int32 enclosing CPU-side event on the same thread; depth: int16 call depth;
    # launch: int32, for GPU events the runtime call that launched them;
    # cpu_op: int32, for GPU events and runtime calls the innermost enclosing cpu_op.

    def __len__(self) -> int:
        return len(self.ts)

    def __repr__(self) -> str:
        return f"Trace({self.meta.path!r}, {len(self)} events, {len(self.names)} names)"

    # -- derived columns, computed once per unique name -------------------------------------
    @cached_property
    def names_array(self) -> np.ndarray:
        """The string table as a numpy object array (index it with `self.name`)."""
        return np.array(self.names, dtype=object)

    @cached_property
    def _nccl_by_name(self) -> np.ndarray:
        return np.fromiter((is_nccl_name(n) for n in self.names), dtype=bool, count=len(self.names))

    @cached_property
    def is_nccl(self) -> np.ndarray:
        """Per row: an NCCL/RCCL kernel."""
        if not len(self.names):
            return np.zeros(len(self), dtype=bool)
        return (self.kind == Kind.KERNEL) & self._nccl_by_name[self.name]

    @cached_property
    def _copy_by_name(self) -> np.ndarray:
        out = np.zeros((max(len(self.names), 1), 3), dtype=np.int8)
        for i, n in enumerate(self.names):
            if "emcpy" in n:
                out[i] = parse_copy_name(n)
        return out

    @cached_property
    def copy_kind(self) -> np.ndarray:
        """Per row: `CopyKind` of a memcpy (NONE elsewhere)."""
        out = self._copy_by_name[self.name, 0] if len(self) else np.zeros(0, np.int8)
        return np.where(self.kind == Kind.GPU_MEMCPY, out, CopyKind.NONE).astype(np.int8)

    @cached_property
    def copy_src(self) -> np.ndarray:
        """Per row: `MemKind` of a memcpy's source."""
        out = self._copy_by_name[self.name, 1] if len(self) else np.zeros(0, np.int8)
        return np.where(self.kind == Kind.GPU_MEMCPY, out, MemKind.UNKNOWN).astype(np.int8)

    @cached_property
    def copy_dst(self) -> np.ndarray:
        """Per row: `MemKind` of a memcpy's destination."""
        out = self._copy_by_name[self.name, 2] if len(self) else np.zeros(0, np.int8)
        return np.where(self.kind == Kind.GPU_MEMCPY, out, MemKind.UNKNOWN).astype(np.int8)

    @cached_property
    def is_sync(self) -> np.ndarray:
        """Per row: a runtime call that blocks the host (device/stream/event sync, cudaMemcpy)."""
        by_name = np.fromiter((n in SYNC_CALLS for n in self.names), dtype=bool,
                              count=len(self.names))
        if not len(self.names):
            return np.zeros(len(self), dtype=bool)
        return np.isin(self.kind, LAUNCH_KINDS) & by_name[self.name]

    @cached_property
    def end(self) -> np.ndarray:
        """Per row: ts + dur."""
        return self.ts + self.dur

    @cached_property
    def launch_delay(self) -> np.ndarray:
        """Per row: GPU start - start of the runtime call that launched it (NaN where unlinked)."""
        out = np.full(len(self), np.nan)
        ok = self.launch >= 0
        out[ok] = self.ts[ok] - self.ts[self.launch[ok]]
        return out

    def rows(self, *kinds: Kind) -> np.ndarray:
        """Row indices of the given kinds, in time order."""
        return np.flatnonzero(np.isin(self.kind, kinds))

    def name_of(self, row: int) -> str:
        """The name of one row."""
        return self.names[self.name[row]]

    def code_of(self, name: str) -> int:
        """The code of a name in the string table, or -1."""
        return self._name_codes.get(name, -1)

    @cached_property
    def _name_codes(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    # -- spans ------------------------------------------------------------------------------
    @property
    def span(self) -> tuple[float, float]:
        """(first start, last end) over all timed events, in us."""
        if not len(self):
            return (0.0, 0.0)
        return float(self.ts.min()), float(self.end.max())

    @cached_property
    def gpu_work_rows(self) -> np.ndarray:
        """Rows of kernels, memcpys and memsets."""
        return self.rows(*GPU_WORK_KINDS)

    @property
    def has_gpu(self) -> bool:
        """True when the trace holds any GPU work."""
        return len(self.gpu_work_rows) > 0

    @property
    def gpu_streams(self) -> list[int]:
        """GPU streams that carry work."""
        rows = self.gpu_work_rows
        return sorted(int(s) for s in np.unique(self.stream[rows]) if s >= 0)

    @property
    def gpu_name(self) -> str | None:
        """The GPU model from deviceProperties (first device with a name)."""
        for props in self.meta.device_properties:
            name = props.get("name")
            if name:
                return str(name)
        return None

    @property
    def platform(self) -> str | None:
        """Alias of `gpu_name`, the hardware platform the paper conditions on."""
        return self.gpu_name


def busy_union(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of intervals [starts, ends)."""
    s, e = merged_intervals(starts, ends)
    return float(np.sum(e - s))


def merged_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (starts, ends)."""
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    group = np.cumsum(new) - 1
    g_end = np.zeros(group[-1] + 1)
    np.maximum.at(g_end, group, e)
    return s[new], g_end
