"""Stage 2: a `Trace` cut into N equal time windows (paper sections 5.2-5.3).

A `Windows` object is the one window table every detector reads: window edges, the GPU
events anchored in each window (kernels, memcpys, memsets, by start time: the paper's anchor
events), and vectorised per-window measures (time covered by any set of events, counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import TraceapError
from .trace import Kind, Trace, merged_intervals

#: The paper's N: windows a trace is cut into unless told otherwise (every command, the library).
DEFAULT_WINDOWS = 100
#: Most windows a trace may be cut into.  The model's relation module attends over all pairs of
#: windows: N^2 x heads x 4 bytes per attention map (5000 windows, 4 heads: 0.4 GB, 100000:
#: 160 GB), and the paper's settings are 50-200 windows (a few tens per profiler step).
MAX_WINDOWS = 5000


def check_windows(n_windows: int) -> int:
    """`n_windows` when it is a window count traceap accepts (1 to MAX_WINDOWS), else one
    `TraceapError` line: the one check of `--windows` for every command and library call."""
    if not 1 <= n_windows <= MAX_WINDOWS:
        raise TraceapError(f"--windows must be between 1 and {MAX_WINDOWS}, not {n_windows} (the "
                           f"paper uses 50-200; the model compares every pair of windows)")
    return n_windows


@dataclass(frozen=True)
class WindowConfig:
    """How to cut a trace.  Defaults are the paper's (N = 100 over the whole trace span)."""

    n_windows: int = DEFAULT_WINDOWS
    #: "trace": the span of all events; "gpu": first to last GPU event (falls back to trace).
    span: str = "trace"

    def __post_init__(self):
        if self.n_windows < 1:
            raise ValueError("n_windows must be at least 1")
        if self.span not in ("trace", "gpu"):
            raise ValueError("span must be 'trace' or 'gpu'")


def covered_time(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """F(t) = total length of [starts, ends) lying before t, for each t in `points`.

    Overlap of the intervals with [a, b) is F(b) - F(a).  Overlapping intervals are counted
    once each (merge them first for a union).
    """
    if len(starts) == 0:
        return np.zeros(len(points))
    # Kineto clocks are epoch microseconds (~1.7e15): cumulative sums of raw values lose
    # hundreds of us to rounding, so work relative to the first point (differences unchanged).
    origin = float(points[0]) if len(points) else 0.0
    points = np.asarray(points, dtype=np.float64) - origin
    s = np.sort(starts) - origin
    e = np.sort(ends) - origin
    cs = np.concatenate(([0.0], np.cumsum(s)))
    ce = np.concatenate(([0.0], np.cumsum(e)))
    ns = np.searchsorted(s, points, side="left")
    ne = np.searchsorted(e, points, side="left")
    return (ns * points - cs[ns]) - (ne * points - ce[ne])


class Windows:
    """N equal windows over a trace; all measures are numpy arrays of length N."""

    def __init__(self, trace: Trace, n_windows: int = DEFAULT_WINDOWS, span: str = "trace",
                 start_us: float | None = None, end_us: float | None = None):
        self.trace = trace
        self.config = WindowConfig(n_windows, span)
        lo, hi = trace.span
        if span == "gpu" and trace.has_gpu:
            g = trace.gpu_work_rows
            lo, hi = float(trace.ts[g].min()), float(trace.end[g].max())
        if start_us is not None:
            lo = float(start_us)
        if end_us is not None:
            hi = float(end_us)
        if not hi > lo:
            hi = lo + 1.0
        self.edges = np.linspace(lo, hi, n_windows + 1)
        self.n = n_windows

    # -- geometry ---------------------------------------------------------------------------
    @property
    def start_us(self) -> np.ndarray:
        """Window starts (us, trace clock)."""
        return self.edges[:-1]

    @property
    def end_us(self) -> np.ndarray:
        """Window ends (us, trace clock)."""
        return self.edges[1:]

    @property
    def width_us(self) -> float:
        """Width of every window (us)."""
        return float(self.edges[1] - self.edges[0])

    def index_of(self, ts: np.ndarray) -> np.ndarray:
        """Window index of time points (clipped to [0, N-1])."""
        idx = np.searchsorted(self.edges, ts, side="right") - 1
        return np.clip(idx, 0, self.n - 1)

    def overlapping(self, start_us: float, end_us: float) -> np.ndarray:
        """Indices of windows that overlap [start_us, end_us)."""
        return np.flatnonzero((self.start_us < end_us) & (self.end_us > start_us))

    # -- events per window ------------------------------------------------------------------
    @cached_property
    def anchor_rows(self) -> np.ndarray:
        """GPU work rows (kernels, memcpys, memsets) inside the window span, in time order."""
        rows = self.trace.gpu_work_rows
        ts = self.trace.ts[rows]
        return rows[(ts >= self.edges[0]) & (ts <= self.edges[-1])]

    @cached_property
    def anchor_ptr(self) -> np.ndarray:
        """CSR pointer: anchors of window w are anchor_rows[anchor_ptr[w]:anchor_ptr[w+1]]."""
        return self._ptr(self.anchor_rows)

    def anchors(self, w: int) -> np.ndarray:
        """Rows of the GPU events (the paper's anchors) that start in window w."""
        return self.anchor_rows[self.anchor_ptr[w]:self.anchor_ptr[w + 1]]

    def _ptr(self, rows: np.ndarray) -> np.ndarray:
        idx = self.index_of(self.trace.ts[rows])
        return np.concatenate(([0], np.cumsum(np.bincount(idx, minlength=self.n))))

    def anchor_table(self, w: int) -> dict[str, np.ndarray]:
        """The paper's per-anchor attributes for window w (one array per column, time order):
        row, kind, GPU event name, parent CPU op name ("" when unlinked), launch delay (us,
        NaN when unlinked), duration (us), stream, start relative to the window start (us)."""
        t = self.trace
        rows = self.anchors(w)
        op = t.cpu_op[rows]
        op_name = np.where(op >= 0, t.names_array[t.name[np.maximum(op, 0)]], "")
        return {"row": rows, "kind": t.kind[rows], "name": t.names_array[t.name[rows]],
                "cpu_op": op_name, "launch_delay_us": t.launch_delay[rows],
                "dur_us": t.dur[rows], "stream": t.stream[rows],
                "start_rel_us": t.ts[rows] - self.edges[w]}

    def rows_in(self, w: int, *kinds: Kind) -> np.ndarray:
        """Rows of the given kinds that overlap window w."""
        t = self.trace
        rows = t.rows(*kinds)
        a, b = self.edges[w], self.edges[w + 1]
        return rows[(t.ts[rows] < b) & (t.end[rows] > a)]

    def count(self, rows: np.ndarray) -> np.ndarray:
        """Per window: how many of `rows` start in it."""
        rows = rows[(self.trace.ts[rows] >= self.edges[0]) & (self.trace.ts[rows] <= self.edges[-1])]
        return np.bincount(self.index_of(self.trace.ts[rows]), minlength=self.n).astype(np.float64)

    def total(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Per window: sum of `values` (one per row) over rows starting in it."""
        t = self.trace
        keep = (t.ts[rows] >= self.edges[0]) & (t.ts[rows] <= self.edges[-1])
        return np.bincount(self.index_of(t.ts[rows[keep]]), weights=values[keep],
                           minlength=self.n)

    def time_in(self, rows: np.ndarray) -> np.ndarray:
        """Per window: summed time of `rows` clipped to the window (overlaps counted twice)."""
        t = self.trace
        f = covered_time(t.ts[rows], t.end[rows], self.edges)
        return np.diff(f)

    def union_time(self, rows: np.ndarray) -> np.ndarray:
        """Per window: time covered by the union of `rows` (e.g. GPU busy time)."""
        t = self.trace
        s, e = merged_intervals(t.ts[rows], t.end[rows])
        return np.diff(covered_time(s, e, self.edges))

    # -- common measures (cached; detectors and features share them) ------------------------
    @cached_property
    def gpu_busy_us(self) -> np.ndarray:
        """Per window: time with any kernel, memcpy or memset running."""
        return self.union_time(self.trace.gpu_work_rows)

    @cached_property
    def stats(self) -> dict[str, np.ndarray]:
        """A table of per-window measures (name -> array of length N) for features and reports."""
        t = self.trace
        kernels = t.rows(Kind.KERNEL)
        memcpy = t.rows(Kind.GPU_MEMCPY)
        nccl = kernels[t.is_nccl[kernels]]
        compute = kernels[~t.is_nccl[kernels]]
        runtime = t.rows(Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)
        sync = np.flatnonzero(t.is_sync)
        w = self.width_us
        delay = t.launch_delay[kernels]
        ok = np.isfinite(delay)
        n_k = self.count(kernels)
        return {
            "gpu_busy_frac": self.gpu_busy_us / w,
            "compute_busy_frac": self.union_time(compute) / w,
            "n_kernels": n_k,
            "kernel_time_frac": self.time_in(kernels) / w,
            "mean_kernel_us": self.total(kernels, t.dur[kernels]) / np.maximum(n_k, 1),
            "n_short_kernels": self.count(kernels[t.dur[kernels] < 10.0]),
            "mean_launch_delay_us": self.total(kernels[ok], delay[ok]) /
                                    np.maximum(self.count(kernels[ok]), 1),
            "n_memcpy": self.count(memcpy),
            "memcpy_time_frac": self.time_in(memcpy) / w,
            "memcpy_mb": self.total(memcpy, np.nan_to_num(t.bytes[memcpy])) / 1e6,
            "n_runtime": self.count(runtime),
            "runtime_time_frac": self.time_in(runtime) / w,
            "n_sync": self.count(sync),
            "sync_time_frac": self.time_in(sync) / w,
            "n_nccl": self.count(nccl),
            "nccl_time_frac": self.union_time(nccl) / w,
            "cpu_op_time_frac": self.union_time(t.rows(Kind.CPU_OP)) / w,
        }

