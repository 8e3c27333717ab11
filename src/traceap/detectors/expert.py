"""The expert-rule detector: a window's score is the strongest anti-pattern signature in it.

No training; each of the eight rules in `traceap.patterns` scores windows from its mechanism,
and this detector takes the maximum, so a flagged window always has a named cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from ..windows import Windows
from .base import clip01


@dataclass(frozen=True)
class ExpertConfig:
    """Which patterns vote (default: all eight) and the flagging threshold."""

    patterns: tuple[str, ...] | None = None
    threshold: float = 0.5


class ExpertDetector:
    """Max over the per-pattern scores of `traceap.patterns.REGISTRY`."""

    name = "expert"

    def __init__(self, patterns: Sequence[str] | None = None, threshold: float = 0.5):
        from ..patterns import REGISTRY
        unknown = [p for p in (patterns or ()) if p not in REGISTRY]
        if unknown:
            from ..errors import TraceapError
            raise TraceapError(f"unknown pattern id {unknown[0]!r}; known: {', '.join(REGISTRY)}")
        self.config = ExpertConfig(tuple(patterns) if patterns else None, threshold)
        self.threshold = threshold

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "ExpertDetector":
        """Expert rules need no training."""
        return self

    def pattern_scores(self, windows: Windows) -> dict[str, np.ndarray]:
        """Per-pattern window scores of the voting patterns."""
        from ..patterns import REGISTRY
        ids = self.config.patterns or tuple(REGISTRY)
        return {p: REGISTRY[p].score_windows(windows) for p in ids}

    def score_windows(self, windows: Windows) -> np.ndarray:
        """Per window: the strongest pattern score."""
        scores = self.pattern_scores(windows)
        return clip01(np.max(np.stack(list(scores.values())), axis=0)) if scores else \
            np.zeros(windows.n)
