"""Windows -> arrays the model reads (paper 5.2-5.3 inputs), one `TraceFeatures` per trace.

Per anchor event (kernels, memcpys, memsets starting in the window, in time order):
  kernel name id, parent CPU op name id (`trace.cpu_op`; 0 = none), launch delay and duration
  log-quantised by eq. 3 into `time_vocab` levels (level `time_vocab` = unknown, e.g. a kernel
  with no linked launch), relative start within the window in [0, 1] (eq. 6, normalised by the
  window width), and the stream index (rank of the stream among the trace's GPU streams).
Per window: a few scale-free measures from `Windows.stats` (the optional summary added to CLS).
Per trace: the hardware platform name from deviceProperties.

Long windows are capped at `max_events` anchors (deterministic: same trace, same scores).
`event_sampling="diverse"` (default) keeps variety: the first occurrence of every distinct
event name in the window, then second occurrences, and so on, each round in time order, so a
lone pageable memcpy among 500 GEMMs is kept; the kept events are fed in time order.
`"strided"` takes the events at ranks floor(j * n / max_events) instead (keeps the rhythm).
Either way the true event count and busy fractions reach the model through the summary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..idle import MECHANISMS, per_window
from ..patterns import REGISTRY, BusyInefficient
from ..trace import Kind, Trace, merged_intervals
from ..windows import Windows
from .config import ModelConfig

#: Per-window measures (from `Windows.stats`, plus the longest GPU-idle stretch) kept raw in
#: the features; `summary` turns them into the model's per-window input.
SUMMARY_FRACTIONS = ("gpu_busy_frac", "compute_busy_frac", "kernel_time_frac", "memcpy_time_frac",
                     "runtime_time_frac", "sync_time_frac", "nccl_time_frac", "cpu_op_time_frac")
SUMMARY_RATES = ("n_kernels", "n_short_kernels", "n_memcpy", "n_runtime", "n_sync", "n_nccl")
SUMMARY_LOGS = ("mean_kernel_us", "mean_launch_delay_us", "memcpy_mb")
#: Beyond v1 (config `summary_extra`): the longest stretch inside the window with no GPU work,
#: as a fraction of the window (a stall shows as one long gap; many short ones do not).
SUMMARY_EXTRA = ("max_idle_frac",)
#: Beyond v3 (config `summary_idle`): the window's GPU-idle time by mechanism of `idle.py`'s
#: account (warm-up, exposed communication, compile gaps, data loading, pageable copies, host
#: copies and syncs, input copies, unrecorded host, Python host, launch-bound, not explained),
#: as fractions of the window.  Measured from timing and event kinds, so they mean the same on
#: every GPU, batch size and model; they go to the model absolute *and*, with
#: `summary_relative`, against the trace's median window (a trace stalled throughout by its
#: loader has no outlying window, only a high absolute share).
#: The mechanisms of the account the bundled checkpoint was trained with; one added since feeds
#: the one it declares (`idle.Mechanism.model_as`, the mechanism its time went to before), so a
#: new mechanism changes neither the input width nor the meaning of an input.
MODEL_MECHANISMS = ("warmup", "nccl_on_compute_stream", "small_nccl", "nccl", "compile_gaps",
                    "data_loading", "pageable_copies", "host_copies_syncs", "input_copies",
                    "unrecorded_host", "python_host", "launch_bound", "not_explained")
SUMMARY_IDLE = tuple(f"idle_{m}" for m in MODEL_MECHANISMS)
#: Each mechanism of today's account outside MODEL_MECHANISMS -> the input its time feeds there
#: (the one it declares, `model_as`; not explained when it declares none).
DECLARED = {m.id: m.model_as or "not_explained" for m in MECHANISMS
            if m.id not in MODEL_MECHANISMS}
#: Config `summary_split`: the mechanisms added with the sixteen patterns, each its own input
#: instead of the time of the one it declares (`model_as`: allocator churn and recompiles read
#: as warm-up there, which a model learns to pass over), and the GPU time the busy-time
#: patterns spend inefficiently (`AntiPattern.window_lost` of each `BusyInefficient` pattern:
#: FP32 matrix math, layout transposes, per-parameter optimizer kernels), shares of the window.
#: Both read from the account and the registry (no module outside a pattern's own names it),
#: in their order; a checkpoint records the ones it was built with (`ModelConfig.split_inputs`)
#: and reads those, so a mechanism or busy-time pattern added later widens SUMMARY_SPLIT, not
#: an existing checkpoint's inputs.
SPLIT_MECHANISMS = tuple(m.id for m in MECHANISMS if m.model_as)
BUSY_PATTERNS = tuple(p.id for p in REGISTRY.values() if isinstance(p.account, BusyInefficient))
SUMMARY_SPLIT = (tuple(f"idle_{m}" for m in SPLIT_MECHANISMS)
                 + tuple(f"busy_{p}" for p in BUSY_PATTERNS))
STAT_KEYS = (SUMMARY_FRACTIONS + SUMMARY_RATES + SUMMARY_LOGS + SUMMARY_EXTRA + SUMMARY_IDLE
             + SUMMARY_SPLIT)
#: Width of the v1 summary: the measures above (without the extras) and log window width.
SUMMARY_DIM = len(SUMMARY_FRACTIONS) + len(SUMMARY_RATES) + len(SUMMARY_LOGS) + 1
#: Per-trace reference values for the relative time inputs (medians over the whole trace).
REF_KEYS = ("launch_delay_us", "gap_us")
#: Ratios to a trace's own typical value are quantised over [1/RATIO_SPAN, RATIO_SPAN]: three
#: decades either way covers a 1 us gap against a 1 ms median and a stall 1000x the median.
RATIO_SPAN = 1e3

UNKNOWN_PLATFORM = "unknown"
#: Host-side events kept per window in the features (config `host_events` uses up to this many).
HOST_CAP = 16
#: Kinds of host events: CPU ops, user annotations (DataLoader iteration, compiled regions,
#: ProfilerStep) and runtime/driver calls (launches, copies, syncs).  Python frames are left
#: out (thousands per step, named by file and line).
HOST_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.CUDA_RUNTIME, Kind.CUDA_DRIVER)


def quantize_time(t_us: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Paper eq. 3: T' = floor((log T - log Tmin) / (log Tmax - log Tmin) * (N - 1)), clipped.

    NaN (unknown) maps to level N, one past the last regular level.
    """
    t = np.asarray(t_us, np.float64)
    lo, hi = np.log(cfg.t_min_us), np.log(cfg.t_max_us)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.floor((np.log(np.maximum(t, cfg.t_min_us)) - lo) / (hi - lo) * (cfg.time_vocab - 1))
    q = np.clip(np.nan_to_num(q, nan=0.0), 0, cfg.time_vocab - 1)
    return np.where(np.isfinite(t), q, cfg.time_vocab).astype(np.int16)


def quantize_ratio(ratio: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """A time relative to the trace's own typical one (x / reference), log-quantised into
    `time_vocab` levels over [1/RATIO_SPAN, RATIO_SPAN] (level floor((N-1)/2) = typical; 0 = zero
    or far below).  A ratio of 1 lies in the middle of its level (+-11%), so float rounding of
    the typical value never flips it.  NaN (unknown) maps to level N, as in `quantize_time`."""
    r = np.asarray(ratio, np.float64)
    span = np.log(RATIO_SPAN)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.floor((np.log(np.clip(r, 1.0 / RATIO_SPAN, RATIO_SPAN)) + span) / (2 * span)
                     * (cfg.time_vocab - 1))
    q = np.clip(np.nan_to_num(q, nan=0.0), 0, cfg.time_vocab - 1)
    return np.where(np.isfinite(r), q, cfg.time_vocab).astype(np.int16)


def longest_idle(trace: Trace, edges: np.ndarray) -> np.ndarray:
    """Per window (edges [N+1]): the longest stretch with no GPU work inside it (us)."""
    n = len(edges) - 1
    rows = trace.gpu_work_rows
    s, e = merged_intervals(trace.ts[rows], trace.end[rows])
    # idle stretches: before the first busy interval, between them, after the last
    gs = np.concatenate(([edges[0]], e))
    ge = np.concatenate((s, [edges[-1]]))
    ok = ge > gs
    gs, ge = gs[ok], ge[ok]
    out = np.zeros(n)
    if not len(gs):
        return out
    _, win, overlap = _spread(edges, gs, ge)
    np.maximum.at(out, win, np.maximum(overlap, 0.0))
    return out


def _spread(edges: np.ndarray, starts: np.ndarray, ends: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (interval, window) pair the intervals overlap, vectorised: (interval index,
    window index, time of the interval inside the window), windows given by edges [N+1]."""
    n = len(edges) - 1
    first = np.clip(np.searchsorted(edges, starts, side="right") - 1, 0, n - 1)
    last = np.clip(np.searchsorted(edges, ends, side="left") - 1, 0, n - 1)
    span = np.maximum(last - first + 1, 1)
    idx = np.repeat(np.arange(len(starts)), span)
    win = np.repeat(first, span) + (np.arange(len(idx)) - np.repeat(np.cumsum(span) - span, span))
    inside = np.minimum(ends[idx], edges[win + 1]) - np.maximum(starts[idx], edges[win])
    return idx, win, inside


def raw_stats(windows: Windows) -> np.ndarray:
    """[N, len(STAT_KEYS)] float32: the per-window measures, unscaled."""
    s = windows.stats
    cols = [np.nan_to_num(np.asarray(s[k], np.float64)) for k in STAT_KEYS if k in s]
    width = max(windows.width_us, 1e-9)
    cols.append(longest_idle(windows.trace, windows.edges) / width)
    idle = per_window(windows)
    cols += [v / width for v in model_idle(windows, idle).values()]
    cols += [idle[m] / width for m in SPLIT_MECHANISMS]
    cols += [REGISTRY[p].window_lost(windows) / width for p in BUSY_PATTERNS]
    return np.stack(cols, axis=1).astype(np.float32)


def model_idle(windows: Windows, idle: dict[str, np.ndarray] | None = None
               ) -> dict[str, np.ndarray]:
    """Per window, the idle time of each of MODEL_MECHANISMS, a newer mechanism's time in the
    one it declares (`model_as`; not explained when it declares none).  `idle`: the account's
    `per_window` when the caller has it."""
    idle = per_window(windows) if idle is None else idle
    out = {m: idle[m].copy() for m in MODEL_MECHANISMS}
    for mech, into in DECLARED.items():
        out[into] += idle[mech]
    return out


def summary(stats: np.ndarray, width_us: float, cfg: ModelConfig) -> np.ndarray:
    """The per-window summary input [N, summary_dim(cfg)] from raw stats: time fractions, log
    event rates per ms, log magnitudes, log window width (the v1 measures), the extras when
    `cfg.summary_extra`; absolute (`summary_absolute`) and/or minus the trace's median window
    (`summary_relative`; the lower middle value, as torch.median); then with
    `cfg.summary_idle` the idle shares by mechanism (SUMMARY_IDLE), absolute and (with
    `summary_relative`) relative."""
    idx = {k: i for i, k in enumerate(STAT_KEYS)}
    width_ms = max(width_us / 1e3, 1e-6)
    n = stats.shape[0]
    cols = [np.clip(stats[:, idx[k]], 0.0, 2.0) for k in SUMMARY_FRACTIONS]
    cols += [np.log1p(np.maximum(stats[:, idx[k]], 0.0) / width_ms) for k in SUMMARY_RATES]
    cols += [np.log1p(np.maximum(stats[:, idx[k]], 0.0)) / 5.0 for k in SUMMARY_LOGS]
    cols.append(np.full(n, np.log10(max(width_us, 1.0)) / 6.0))
    if cfg.summary_extra:
        cols += [np.clip(stats[:, idx[k]], 0.0, 1.0) for k in SUMMARY_EXTRA]
    s = np.nan_to_num(np.stack(cols, axis=1)).astype(np.float32)
    parts = [s] if cfg.summary_absolute else []
    if cfg.summary_relative:  # how this window differs from the trace's typical one
        parts.append(s - np.sort(s, axis=0)[(n - 1) // 2][None, :])
    if cfg.summary_idle:
        idle = np.nan_to_num(np.clip(stats[:, [idx[k] for k in SUMMARY_IDLE]], 0.0, 1.0))
        if cfg.summary_split:  # the newer mechanisms out of the ones they declare, on their own
            names = split_inputs(cfg)
            split = np.nan_to_num(np.clip(stats[:, [idx[k] for k in names]], 0.0, 1.0))
            for j, k in enumerate(names):
                if k.startswith("idle_"):
                    idle[:, MODEL_MECHANISMS.index(DECLARED[k[len("idle_"):]])] -= split[:, j]
            idle = np.concatenate([np.clip(idle, 0.0, 1.0), split], axis=1)
        idle = idle.astype(np.float32)
        parts.append(idle)
        if cfg.summary_relative:
            parts.append(idle - np.sort(idle, axis=0)[(n - 1) // 2][None, :])
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), np.float32)


def split_inputs(cfg: ModelConfig) -> tuple[str, ...]:
    """The `summary_split` inputs a config reads, in order: those its checkpoint was built
    with (`ModelConfig.split_inputs`), else SUMMARY_SPLIT of now.  ModelError (one line) for
    one this traceap no longer measures."""
    names = cfg.split_inputs or SUMMARY_SPLIT
    gone = [k for k in names if k not in SUMMARY_SPLIT]
    if gone:
        from ..errors import ModelError
        raise ModelError(f"the model reads {gone[0]!r}, which this traceap does not measure: "
                         f"retrain it (features.SUMMARY_SPLIT)")
    return tuple(names)


def summary_dim(cfg: ModelConfig) -> int:
    """Width of the per-window summary input under a config."""
    base = SUMMARY_DIM + (len(SUMMARY_EXTRA) if cfg.summary_extra else 0)
    idle = (len(SUMMARY_IDLE) + (len(split_inputs(cfg)) if cfg.summary_split else 0)) \
        * (1 + int(cfg.summary_relative)) if cfg.summary_idle else 0
    return base * (int(cfg.summary_absolute) + int(cfg.summary_relative)) + idle


def host_pick(trace: Trace, edges: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Per window, the host events that dominate it: of the host events (HOST_KINDS)
    overlapping the window, the longest occurrence (time inside the window) of each distinct
    name, the `cap` longest of those, in start order.  Returns (window, row) pairs."""
    rows = trace.rows(*HOST_KINDS)
    ts, end = trace.ts[rows], trace.end[rows]
    keep = (end > edges[0]) & (ts < edges[-1])
    rows, ts, end = rows[keep], ts[keep], end[keep]
    if not len(rows):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ev, win, inside = _spread(edges, ts, end)
    name = trace.name[rows[ev]]
    o = np.lexsort((-inside, name, win))                      # per (window, name): longest first
    w_s, n_s = win[o], name[o]
    head = np.r_[True, (w_s[1:] != w_s[:-1]) | (n_s[1:] != n_s[:-1])]
    o = o[head]
    o = o[np.lexsort((-inside[o], win[o]))]                   # per window: longest first
    w_s = win[o]
    start = np.r_[True, w_s[1:] != w_s[:-1]]
    first_pos = np.maximum.accumulate(np.where(start, np.arange(len(o)), 0))
    o = o[(np.arange(len(o)) - first_pos) < cap]
    o = o[np.lexsort((ts[ev[o]], win[o]))]                    # per window: in start order
    return win[o], rows[ev[o]]


@dataclass
class TraceFeatures:
    """What the model reads of one trace cut into N windows (K = max_events per window), raw:
    times in us and unscaled window measures, so that one cached file serves every config;
    `inputs(cfg)` quantises and scales them."""

    kernel: np.ndarray      # int32 [N, K]: index into `names` (0 = padding)
    cpu_op: np.ndarray      # int32 [N, K]: index into `names` (0 = no parent CPU op)
    delay_us: np.ndarray    # float32 [N, K]: launch delay (NaN = no linked launch)
    dur_us: np.ndarray      # float32 [N, K]: duration
    gap_us: np.ndarray      # float32 [N, K]: GPU idle just before the event (no work on any stream)
    dur_ref_us: np.ndarray  # float32 [N, K]: median duration of the event's name in the trace
    t_rel: np.ndarray       # float32 [N, K]: start within the window, in [0, 1]
    stream: np.ndarray      # int16 [N, K]: stream rank in the trace
    mask: np.ndarray        # bool [N, K]: real event (not padding)
    n_events: np.ndarray    # int32 [N]: anchors in the window before the cap
    host_name: np.ndarray   # int32 [N, H]: host events (`host_pick`), index into `names`
    host_parent: np.ndarray  # int32 [N, H]: their enclosing host event's name (0 = none)
    host_dur_us: np.ndarray  # float32 [N, H]: their whole duration
    host_ref_us: np.ndarray  # float32 [N, H]: median duration of host events with that name
    host_t_rel: np.ndarray  # float32 [N, H]: start within the window, clipped to [0, 1]
    host_mask: np.ndarray   # bool [N, H]
    stats: np.ndarray       # float32 [N, len(STAT_KEYS)]: raw per-window measures
    ref: np.ndarray         # float32 [len(REF_KEYS)]: the trace's typical delay and gap
    width_us: np.ndarray    # float64 []: window width
    names: np.ndarray       # str [U]: local name table, names[0] = "" (none)
    platform: str
    start_us: np.ndarray    # float64 [N]: window starts (trace clock)
    end_us: np.ndarray      # float64 [N]

    @property
    def n_windows(self) -> int:
        """N."""
        return int(self.kernel.shape[0])

    def inputs(self, cfg: ModelConfig) -> dict[str, np.ndarray]:
        """The model's per-trace inputs under a config: the event sequence of every window (its
        GPU anchors, then with `cfg.host_events` its dominant host events on stream position
        `max_streams`), quantised time levels (absolute, eq. 3; relative to the trace's own
        typical values when `cfg.time_relative`) and the per-window summary."""
        h = min(cfg.host_events, self.host_name.shape[1])
        nan = np.full(self.host_dur_us[:, :h].shape, np.nan, np.float32)

        def ev(gpu, host):
            return np.concatenate([gpu, host[:, :h]], axis=1) if h else gpu

        mask = ev(self.mask, self.host_mask)
        delay_us = ev(self.delay_us, nan)
        dur_us = ev(self.dur_us, self.host_dur_us)
        out = {"kernel": ev(self.kernel, self.host_name), "cpu_op": ev(self.cpu_op, self.host_parent),
               "t_rel": ev(self.t_rel, self.host_t_rel),
               "stream": ev(self.stream, np.full(self.host_name.shape, cfg.max_streams, np.int16)),
               "mask": mask, "summary": summary(self.stats, float(self.width_us), cfg)}
        if cfg.time_absolute:
            out["delay"] = quantize_time(delay_us, cfg)
            out["dur"] = quantize_time(dur_us, cfg)
        if cfg.time_relative:
            with np.errstate(invalid="ignore", divide="ignore"):
                out["delay_rel"] = quantize_ratio(delay_us / max(float(self.ref[0]), 1e-3), cfg)
                out["gap_rel"] = quantize_ratio(ev(self.gap_us, nan) / max(float(self.ref[1]), 1e-3), cfg)
                out["dur_rel"] = quantize_ratio(
                    dur_us / np.maximum(ev(self.dur_ref_us, self.host_ref_us), 1e-3), cfg)
        for k in ("delay", "dur", "delay_rel", "gap_rel", "dur_rel"):
            if k in out:
                out[k][~mask] = cfg.time_vocab
        return out

    def save(self, path: Path) -> None:
        """Write as .npz (atomically)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **{f.name: np.asarray(getattr(self, f.name)) for f in fields(self)})
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "TraceFeatures":
        """Read what `save` wrote."""
        with np.load(path, allow_pickle=False) as z:
            kw = {f.name: z[f.name] for f in fields(cls)}
        kw["platform"] = str(kw["platform"])
        return cls(**kw)


def platform_of(trace: Trace) -> str:
    """The hardware platform name the model conditions on (deviceProperties GPU name)."""
    return trace.gpu_name or UNKNOWN_PLATFORM


def _diverse_pick(names: np.ndarray, ptr: np.ndarray, count: np.ndarray, k: int) -> np.ndarray:
    """Positions (into the window-ordered anchors) of at most k anchors per window: first the
    first occurrence of every distinct name, then second occurrences, and so on, each round
    in time order; the result is in (window, time) order."""
    m = len(names)
    if m == 0:
        return np.zeros(0, np.int64)
    win = np.repeat(np.arange(len(count)), count)
    pos = np.arange(m)
    by_name = np.lexsort((pos, names, win))                 # group (window, name), time order
    w_s, n_s = win[by_name], names[by_name]
    start = np.ones(m, bool)
    start[1:] = (w_s[1:] != w_s[:-1]) | (n_s[1:] != n_s[:-1])
    first = np.maximum.accumulate(np.where(start, np.arange(m), 0))
    occurrence = np.empty(m, np.int64)
    occurrence[by_name] = np.arange(m) - first              # 0 for a name's first event, ...
    order = np.lexsort((pos, occurrence, win))              # per window: by round, then time
    rank = np.empty(m, np.int64)
    rank[order] = np.arange(m) - (ptr[:-1])[win[order]]
    return np.flatnonzero(rank < k)


def _per_row_context(t: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every row: GPU idle just before it (GPU work rows; 0 elsewhere), the median duration
    of GPU work with its name, and the trace's reference values (REF_KEYS)."""
    gap = np.zeros(len(t.ts))
    name_med = np.zeros(len(t.ts))
    rows = t.gpu_work_rows
    ref = np.ones(len(REF_KEYS), np.float32)
    if not len(rows):
        return gap, name_med, ref
    order = rows[np.argsort(t.ts[rows], kind="stable")]
    ends = np.maximum.accumulate(t.end[order])
    g = np.zeros(len(order))
    g[1:] = np.maximum(t.ts[order][1:] - ends[:-1], 0.0)
    gap[order] = g
    name_med[rows] = _median_by_name(t.name[rows], t.dur[rows])
    delay = t.launch_delay[rows]
    delay = delay[np.isfinite(delay)]
    positive = g[g > 0]
    ref[0] = np.median(delay) if len(delay) else 1.0
    ref[1] = np.median(positive) if len(positive) else 1.0
    return gap, name_med, ref


def _host_reference(t: Trace) -> np.ndarray:
    """Per row: the median duration of host events (HOST_KINDS) with its name (0 elsewhere)."""
    out = np.zeros(len(t.ts))
    rows = t.rows(*HOST_KINDS)
    if not len(rows):
        return out
    out[rows] = _median_by_name(t.name[rows], t.dur[rows])
    return out


def _median_by_name(codes: np.ndarray, durs: np.ndarray) -> np.ndarray:
    """Per row: the (lower) median duration of the rows with its name code.  Sorted by (name,
    duration), each name's group's lower middle, without a loop over names."""
    o = np.lexsort((durs, codes))
    c_s = codes[o]
    starts = np.flatnonzero(np.r_[True, c_s[1:] != c_s[:-1]])
    sizes = np.diff(np.r_[starts, len(o)])
    med = durs[o][starts + (sizes - 1) // 2]
    return med[np.searchsorted(c_s[starts], codes)]


def featurize(windows: Windows, cfg: ModelConfig) -> TraceFeatures:
    """The model inputs for one trace's windows (vectorised; no per-event Python loop)."""
    t = windows.trace
    n, k = windows.n, cfg.max_events
    rows = windows.anchor_rows
    ptr = windows.anchor_ptr
    count = np.diff(ptr).astype(np.int64)
    kept = np.minimum(count, k)
    win = np.repeat(np.arange(n), kept)
    slot = np.arange(len(win)) - np.repeat(np.cumsum(kept) - kept, kept)
    if cfg.event_sampling == "diverse":
        r = rows[_diverse_pick(t.name[rows], ptr, count, k)]
    else:  # strided: slot j of window w takes the anchor of rank floor(j * count / kept)
        r = rows[ptr[win] + (slot * count[win]) // np.maximum(kept[win], 1)]

    parent = t.cpu_op[r] if len(r) else np.zeros(0, np.int64)
    k_codes = t.name[r]
    c_codes = np.where(parent >= 0, t.name[np.maximum(parent, 0)], -1)
    h_win, h_rows = host_pick(t, windows.edges, HOST_CAP)
    h_parent = t.parent[h_rows] if len(h_rows) else np.zeros(0, np.int64)
    hn_codes = t.name[h_rows]
    hp_codes = np.where(h_parent >= 0, t.name[np.maximum(h_parent, 0)], -1)
    codes = [k_codes, c_codes, hn_codes, hp_codes]
    used, inverse = np.unique(np.concatenate([c[c >= 0] for c in codes]), return_inverse=True)
    local = []
    at = 0
    for c in codes:   # local index (1 + position in `used`), 0 where there is no name
        li = np.zeros(len(c), np.int64)
        ok = c >= 0
        li[ok] = inverse[at:at + ok.sum()] + 1
        at += ok.sum()
        local.append(li)
    local_k, local_c, local_hn, local_hp = local
    names = np.array([""] + [t.names[c] for c in used], dtype=str)
    h_count = np.bincount(h_win, minlength=n)
    h_slot = np.arange(len(h_win)) - np.repeat(np.cumsum(h_count) - h_count, h_count)
    h_ref = _host_reference(t)

    streams = np.array(t.gpu_streams, dtype=np.int64)
    s_rank = np.minimum(np.searchsorted(streams, t.stream[r]), cfg.max_streams - 1) \
        if len(streams) else np.zeros(len(r), np.int64)
    width = max(windows.width_us, 1e-9)
    t_rel = np.clip((t.ts[r] - windows.edges[win]) / width, 0.0, 1.0)
    gap, name_med, ref = _per_row_context(t)

    def grid(values, dtype, fill=0):
        out = np.full((n, k), fill, dtype=dtype)
        out[win, slot] = values
        return out

    def hgrid(values, dtype, fill=0):
        out = np.full((n, HOST_CAP), fill, dtype=dtype)
        out[h_win, h_slot] = values
        return out

    return TraceFeatures(
        kernel=grid(local_k, np.int32), cpu_op=grid(local_c, np.int32),
        delay_us=grid(t.launch_delay[r], np.float32, np.nan), dur_us=grid(t.dur[r], np.float32),
        gap_us=grid(gap[r], np.float32), dur_ref_us=grid(name_med[r], np.float32),
        t_rel=grid(t_rel, np.float32), stream=grid(s_rank, np.int16),
        mask=grid(True, bool, False), n_events=count.astype(np.int32),
        host_name=hgrid(local_hn, np.int32), host_parent=hgrid(local_hp, np.int32),
        host_dur_us=hgrid(t.dur[h_rows], np.float32), host_ref_us=hgrid(h_ref[h_rows], np.float32),
        host_t_rel=hgrid(np.clip((t.ts[h_rows] - windows.edges[h_win]) / width, 0.0, 1.0), np.float32),
        host_mask=hgrid(True, bool, False),
        stats=raw_stats(windows), ref=ref, width_us=np.float64(windows.width_us),
        names=names, platform=platform_of(t),
        start_us=windows.start_us.copy(), end_us=windows.end_us.copy(),
    )


def batch_arrays(feats: list[TraceFeatures], platform_id, cfg: ModelConfig,
                 text_table: dict[str, np.ndarray], platform_dropout: float = 0.0,
                 rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """Stack traces with the same N into one batch of model inputs; names become rows of one
    text table (row 0 = no name).  `platform_id`: platform name -> row of the model's table.
    With `cfg.names_masked` every event is nameless (the names-masked ablation).
    `net.collate` is this, as torch tensors."""
    n = {f.n_windows for f in feats}
    if len(n) != 1:
        raise ValueError("traces in a batch must have the same number of windows")
    names: dict[str, int] = {"": 0}
    remaps = []
    for f in feats:
        if cfg.names_masked:
            remaps.append(np.zeros(len(f.names), np.int64))
        else:
            remaps.append(np.array([names.setdefault(str(s), len(names)) for s in f.names],
                                   np.int64))
    text = np.zeros((len(names), cfg.text_dim), np.float32)
    for s, i in names.items():
        if i:
            text[i] = text_table[s]
    platforms = [platform_id(f.platform) for f in feats]
    if platform_dropout > 0 and rng is not None:
        platforms = [0 if rng.random() < platform_dropout else p for p in platforms]
    per_trace = [f.inputs(cfg) for f in feats]
    out = {"text": text, "platform": np.array(platforms, dtype=np.int64)}
    dtypes = {"summary": np.float32, "t_rel": np.float32, "mask": bool}
    for key in per_trace[0]:
        if key in ("kernel", "cpu_op"):   # local name index -> row of the batch's text table
            out[key] = np.stack([r[p[key]] for r, p in zip(remaps, per_trace)])
        else:
            out[key] = np.stack([p[key] for p in per_trace]).astype(dtypes.get(key, np.int64))
    return out


@dataclass(frozen=True)
class FeatureWork:
    """What featurising one training trace needs (sent to each worker once)."""

    cfg: ModelConfig


def featurize_trace(work: FeatureWork, job: tuple[str, str, tuple[int, ...]]
                    ) -> tuple[str, dict[int, TraceFeatures] | str]:
    """The task of one training trace (`traceap.parallel.run`): load it once and featurise
    it at every N asked for; (entry id, N -> features) or (entry id, why it failed).

    The features come back to the caller, which writes the cache, so workers on other
    machines (Ray) need to read only the trace."""
    from ..errors import TraceapError
    from ..load import load

    key, path, ns = job
    try:
        trace = load(path)
        return key, {n: featurize(Windows(trace, n), work.cfg) for n in ns}
    except (TraceapError, OSError, ValueError) as exc:
        return key, f"{path}: {exc}"


__all__ = ["HOST_CAP", "HOST_KINDS", "RATIO_SPAN", "REF_KEYS", "STAT_KEYS", "SUMMARY_DIM",
           "SUMMARY_IDLE", "SUMMARY_SPLIT", "FeatureWork", "TraceFeatures", "UNKNOWN_PLATFORM",
           "batch_arrays",
           "featurize", "featurize_trace", "host_pick", "longest_idle", "platform_of",
           "quantize_ratio", "quantize_time", "raw_stats", "split_inputs", "summary", "summary_dim"]
