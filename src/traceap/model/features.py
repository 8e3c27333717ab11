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

from ..trace import Trace
from ..windows import Windows
from .config import ModelConfig

#: Per-window summary measures (from `Windows.stats`) and how they are scaled.
SUMMARY_FRACTIONS = ("gpu_busy_frac", "compute_busy_frac", "kernel_time_frac", "memcpy_time_frac",
                     "runtime_time_frac", "sync_time_frac", "nccl_time_frac", "cpu_op_time_frac")
SUMMARY_RATES = ("n_kernels", "n_short_kernels", "n_memcpy", "n_runtime", "n_sync", "n_nccl")
SUMMARY_LOGS = ("mean_kernel_us", "mean_launch_delay_us", "memcpy_mb")
SUMMARY_DIM = len(SUMMARY_FRACTIONS) + len(SUMMARY_RATES) + len(SUMMARY_LOGS) + 1

UNKNOWN_PLATFORM = "unknown"


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


def window_summary(windows: Windows) -> np.ndarray:
    """[N, SUMMARY_DIM] float32: time fractions, log event rates per ms, log magnitudes."""
    s = windows.stats
    width_ms = max(windows.width_us / 1e3, 1e-6)
    cols = [np.clip(s[k], 0.0, 2.0) for k in SUMMARY_FRACTIONS]
    cols += [np.log1p(np.maximum(s[k], 0.0) / width_ms) for k in SUMMARY_RATES]
    cols += [np.log1p(np.maximum(np.nan_to_num(s[k]), 0.0)) / 5.0 for k in SUMMARY_LOGS]
    cols.append(np.full(windows.n, np.log10(max(windows.width_us, 1.0)) / 6.0))
    return np.nan_to_num(np.stack(cols, axis=1)).astype(np.float32)


@dataclass
class TraceFeatures:
    """The model inputs of one trace cut into N windows (K = max_events per window)."""

    kernel: np.ndarray    # int32 [N, K]: index into `names` (0 = padding)
    cpu_op: np.ndarray    # int32 [N, K]: index into `names` (0 = no parent CPU op)
    delay: np.ndarray     # int16 [N, K]: quantised launch delay (time_vocab = unknown)
    dur: np.ndarray       # int16 [N, K]: quantised duration
    t_rel: np.ndarray     # float32 [N, K]: start within the window, in [0, 1]
    stream: np.ndarray    # int16 [N, K]: stream rank in the trace
    mask: np.ndarray      # bool [N, K]: real event (not padding)
    n_events: np.ndarray  # int32 [N]: anchors in the window before the cap
    summary: np.ndarray   # float32 [N, SUMMARY_DIM]
    names: np.ndarray     # str [U]: local name table, names[0] = "" (none)
    platform: str
    start_us: np.ndarray  # float64 [N]: window starts (trace clock)
    end_us: np.ndarray    # float64 [N]

    @property
    def n_windows(self) -> int:
        """N."""
        return int(self.kernel.shape[0])

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
    used, inverse = np.unique(np.concatenate([k_codes, c_codes[c_codes >= 0]]), return_inverse=True)
    local_k = inverse[:len(k_codes)] + 1
    local_c = np.zeros(len(c_codes), np.int64)
    local_c[c_codes >= 0] = inverse[len(k_codes):] + 1
    names = np.array([""] + [t.names[c] for c in used], dtype=str)

    streams = np.array(t.gpu_streams, dtype=np.int64)
    s_rank = np.minimum(np.searchsorted(streams, t.stream[r]), cfg.max_streams - 1) \
        if len(streams) else np.zeros(len(r), np.int64)
    width = max(windows.width_us, 1e-9)
    t_rel = np.clip((t.ts[r] - windows.edges[win]) / width, 0.0, 1.0)

    def grid(values, dtype, fill=0):
        out = np.full((n, k), fill, dtype=dtype)
        out[win, slot] = values
        return out

    return TraceFeatures(
        kernel=grid(local_k, np.int32), cpu_op=grid(local_c, np.int32),
        delay=grid(quantize_time(t.launch_delay[r], cfg), np.int16, cfg.time_vocab),
        dur=grid(quantize_time(t.dur[r], cfg), np.int16, cfg.time_vocab),
        t_rel=grid(t_rel, np.float32), stream=grid(s_rank, np.int16),
        mask=grid(True, bool, False), n_events=count.astype(np.int32),
        summary=window_summary(windows), names=names, platform=platform_of(t),
        start_us=windows.start_us.copy(), end_us=windows.end_us.copy(),
    )


def batch_arrays(feats: list[TraceFeatures], platform_id, text_dim: int,
                 text_table: dict[str, np.ndarray], platform_dropout: float = 0.0,
                 rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """Stack traces with the same N into one batch of model inputs; names become rows of one
    text table (row 0 = no name).  `platform_id`: platform name -> row of the model's table.
    `net.collate` is this, as torch tensors."""
    n = {f.n_windows for f in feats}
    if len(n) != 1:
        raise ValueError("traces in a batch must have the same number of windows")
    names: dict[str, int] = {"": 0}
    remaps = []
    for f in feats:
        remaps.append(np.array([names.setdefault(str(s), len(names)) for s in f.names], np.int64))
    text = np.zeros((len(names), text_dim), np.float32)
    for s, i in names.items():
        if i:
            text[i] = text_table[s]
    platforms = [platform_id(f.platform) for f in feats]
    if platform_dropout > 0 and rng is not None:
        platforms = [0 if rng.random() < platform_dropout else p for p in platforms]

    def stack(attr, dtype):
        return np.stack([getattr(f, attr) for f in feats]).astype(dtype)

    return {
        "text": text,
        "kernel": np.stack([r[f.kernel] for r, f in zip(remaps, feats)]),
        "cpu_op": np.stack([r[f.cpu_op] for r, f in zip(remaps, feats)]),
        "delay": stack("delay", np.int64), "dur": stack("dur", np.int64),
        "t_rel": stack("t_rel", np.float32), "stream": stack("stream", np.int64),
        "mask": stack("mask", bool), "summary": stack("summary", np.float32),
        "platform": np.array(platforms, dtype=np.int64),
    }


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


__all__ = ["SUMMARY_DIM", "FeatureWork", "TraceFeatures", "UNKNOWN_PLATFORM", "batch_arrays",
           "featurize", "featurize_trace", "platform_of", "quantize_time", "window_summary"]
