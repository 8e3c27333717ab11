"""The one protocol every window detector follows (rule, clustering, expert, model, LLM)."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..trace import Trace
from ..windows import Windows


@runtime_checkable
class Detector(Protocol):
    """Scores every window of a trace for anti-patterns.

    `fit` takes training traces and trace-level labels (1 = bad, 0 = good) and returns self;
    detectors without training return self unchanged.  `score_windows` returns one score
    in [0, 1] per window (higher = more likely an anti-pattern).
    """

    name: str

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "Detector": ...

    def score_windows(self, windows: Windows) -> np.ndarray: ...


def clip01(x: np.ndarray) -> np.ndarray:
    """Scores as float64 in [0, 1] with NaN -> 0."""
    return np.clip(np.nan_to_num(np.asarray(x, dtype=np.float64)), 0.0, 1.0)
