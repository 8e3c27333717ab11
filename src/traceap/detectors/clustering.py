"""The paper's "Clustering" baseline: K-means on window feature vectors, distance as score.

Windows are described by `Windows.stats` (GPU busy share, kernel counts and sizes, launch
delays, memcpy, sync and NCCL shares, ...), log-scaled and standardised.  Fitted on training
traces (their good traces when labelled), a window far from every centroid is unusual; unfitted,
it clusters the trace's own windows.  Distance d maps to d / (d + d_ref) with d_ref the 95th
percentile of the fitting windows' distances, so 0.5 means "as far as the rarest 5%".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import TraceapError
from ..trace import Trace
from ..windows import DEFAULT_WINDOWS, Windows
from .base import BaseDetector, clip01
from .registry import register_detector


@dataclass(frozen=True)
class ClusteringConfig:
    """K-means settings (K = 8, as small windows fall into few regimes) and reference quantile."""

    k: int = 8
    n_windows: int = DEFAULT_WINDOWS
    quantile: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if self.k < 1:
            raise TraceapError("clustering detector: k must be at least 1")


def window_features(windows: Windows) -> tuple[list[str], np.ndarray]:
    """(feature names, N x F matrix): `Windows.stats`, log1p-scaled (counts and times vary by
    orders of magnitude between models)."""
    stats = windows.stats
    names = sorted(stats)
    x = np.stack([np.asarray(stats[n], dtype=np.float64) for n in names], axis=1)
    return names, np.log1p(np.clip(np.nan_to_num(x), 0.0, None))


class ClusteringDetector(BaseDetector):
    """Distance to the nearest K-means centroid of (training) window features."""

    name = "clustering"

    def __init__(self, k: int = 8, n_windows: int = DEFAULT_WINDOWS, quantile: float = 0.95, seed: int = 0):
        self.config = ClusteringConfig(k, n_windows, quantile, seed)
        self.threshold = 0.5
        self._model = None  # (mean, std, centroids, d_ref)

    def _fit_matrix(self, x: np.ndarray):
        from sklearn.cluster import KMeans

        mean, std = x.mean(axis=0), x.std(axis=0)
        std = np.where(std > 1e-9, std, 1.0)
        z = (x - mean) / std
        k = max(1, min(self.config.k, len(np.unique(z, axis=0))))
        km = KMeans(n_clusters=k, n_init=4, random_state=self.config.seed).fit(z)
        d = np.min(km.transform(z), axis=1)
        d_ref = float(np.quantile(d, self.config.quantile)) if len(d) else 1.0
        return mean, std, km.cluster_centers_, max(d_ref, 1e-6)

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "ClusteringDetector":
        """Cluster the windows of the good training traces (all traces if none is labelled good)."""
        labels = list(labels) if labels is not None else [0] * len(traces)
        use = [t for t, y in zip(traces, labels) if not y] or list(traces)
        if not use:
            raise TraceapError("clustering detector: fit needs at least one trace")
        x = np.concatenate([window_features(Windows(t, self.config.n_windows))[1] for t in use])
        self._model = self._fit_matrix(x)
        return self

    def score_windows(self, windows: Windows) -> np.ndarray:
        """Per window: distance to the nearest centroid, squashed to [0, 1]."""
        _, x = window_features(windows)
        mean, std, centroids, d_ref = self._model or self._fit_matrix(x)
        z = (x - mean) / std
        d = np.sqrt(((z[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)).min(axis=1)
        return clip01(d / (d + d_ref))


register_detector("clustering", ClusteringDetector)
