"""The paper's "Rule" baseline: HTA-style outliers of CUDA kernel runtimes per kernel name.

Each kernel name has a runtime distribution (from training traces when fitted, else from the
trace itself); a kernel running past its name's IQR fence (Q3 + k * IQR) or z-score threshold
is an outlier, and a window's score grows with the excess runtime of its outliers.  Like
HTA, it knows nothing about why a kernel was slow, which is why it generalises poorly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import TraceapError
from ..trace import Kind, Trace
from ..windows import Windows
from .base import BaseDetector, clip01
from .registry import register_detector


@dataclass(frozen=True)
class RuleConfig:
    """Outlier test and score scale.  Defaults: Tukey's fence, z > 3, HTA's 100 us delay."""

    method: str = "iqr"          # "iqr" or "zscore"
    iqr_k: float = 1.5
    z: float = 3.0
    #: Names seen fewer times than this have no distribution to be an outlier of.
    min_count: int = 5
    #: Score = excess / (excess + scale * window width): half-score at `scale` of the window.
    scale: float = 0.05
    #: Also count launches delayed over this (HTA's launch-delay outlier); 0 disables.
    launch_delay_us: float = 0.0

    def __post_init__(self):
        if self.method not in ("iqr", "zscore"):
            raise TraceapError("rule detector: method must be 'iqr' or 'zscore'")


def _group_stats(names: np.ndarray, durs: np.ndarray) -> dict[str, np.ndarray]:
    """Per unique name: count, q1, median, q3, mean, std (vectorised over sorted groups)."""
    order = np.lexsort((durs, names))
    n_sorted, d_sorted = names[order], durs[order]
    uniq, start, count = np.unique(n_sorted, return_index=True, return_counts=True)

    def q(p: float) -> np.ndarray:
        pos = start + p * (count - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, start + count - 1)
        f = pos - lo
        return d_sorted[lo] * (1 - f) + d_sorted[hi] * f

    s1 = np.add.reduceat(d_sorted, start) if len(start) else np.zeros(0)
    s2 = np.add.reduceat(d_sorted ** 2, start) if len(start) else np.zeros(0)
    mean = s1 / np.maximum(count, 1)
    std = np.sqrt(np.maximum(s2 / np.maximum(count, 1) - mean ** 2, 0.0))
    return {"names": uniq, "count": count, "q1": q(0.25), "median": q(0.5), "q3": q(0.75),
            "mean": mean, "std": std}


class RuleDetector(BaseDetector):
    """Kernel-runtime outliers per kernel name (the paper's Rule baseline)."""

    name = "rule"

    def __init__(self, method: str = "iqr", iqr_k: float = 1.5, z: float = 3.0,
                 min_count: int = 5, scale: float = 0.05, launch_delay_us: float = 0.0):
        self.config = RuleConfig(method, iqr_k, z, min_count, scale, launch_delay_us)
        self.threshold = 0.5
        self._fitted: dict[str, np.ndarray] | None = None

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "RuleDetector":
        """Learn each kernel name's runtime distribution from the good traces (all if none)."""
        labels = list(labels) if labels is not None else [0] * len(traces)
        use = [t for t, y in zip(traces, labels) if not y] or list(traces)
        names, durs = [], []
        for t in use:
            k = t.rows(Kind.KERNEL)
            names.append(t.names_array[t.name[k]].astype(str))
            durs.append(t.dur[k])
        if names:
            self._fitted = _group_stats(np.concatenate(names), np.concatenate(durs))
        return self

    def kernel_excess(self, trace: Trace) -> tuple[np.ndarray, np.ndarray]:
        """(kernel rows, excess runtime in us over the name's median; 0 for non-outliers)."""
        c = self.config
        k = trace.rows(Kind.KERNEL)
        if not len(k):
            return k, np.zeros(0)
        dur = trace.dur[k]
        if self._fitted is not None:
            names = trace.names_array[trace.name[k]].astype(str)
            st = self._fitted
            pos = np.searchsorted(st["names"], names)
            pos = np.minimum(pos, len(st["names"]) - 1)
            known = st["names"][pos] == names
            # Names never seen in training fall back to this trace's own distribution.
            own = _group_stats(trace.name[k], dur)
            opos = np.searchsorted(own["names"], trace.name[k])
            stat = {key: np.where(known, st[key][pos], own[key][opos])
                    for key in ("count", "q1", "median", "q3", "mean", "std")}
        else:
            own = _group_stats(trace.name[k], dur)
            opos = np.searchsorted(own["names"], trace.name[k])
            stat = {key: own[key][opos] for key in ("count", "q1", "median", "q3", "mean", "std")}
        if c.method == "iqr":
            iqr = np.maximum(stat["q3"] - stat["q1"], 0.05 * stat["median"])
            out = dur > stat["q3"] + c.iqr_k * iqr
        else:
            out = (dur - stat["mean"]) > c.z * np.maximum(stat["std"], 0.05 * stat["mean"])
        out &= stat["count"] >= c.min_count
        excess = np.where(out, dur - stat["median"], 0.0)
        if c.launch_delay_us > 0:
            delay = np.nan_to_num(trace.launch_delay[k])
            excess = excess + np.where(delay > c.launch_delay_us, delay - c.launch_delay_us, 0.0)
        return k, np.clip(excess, 0.0, None)

    def score_windows(self, windows: Windows) -> np.ndarray:
        """Per window: excess outlier runtime, squashed to [0, 1]."""
        rows, excess = self.kernel_excess(windows.trace)
        per_w = windows.total(rows, excess) if len(rows) else np.zeros(windows.n)
        ref = self.config.scale * windows.width_us
        return clip01(per_w / (per_w + ref))


register_detector("rule", RuleDetector)
