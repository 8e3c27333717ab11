"""The learned detector (paper section 5) behind the `Detector` protocol.

`LearnedDetector()` loads the checkpoint shipped with traceap (`traceap/data/model.pt`);
`LearnedDetector(path)` loads one written by `traceap train`.  Besides window scores it gives
per-window pattern probabilities (`pattern_probabilities`), the learned pattern head that the
offline classifier blends with the expert rules.  Its flagging threshold is the checkpoint's
`meta["flag_threshold"]` (chosen on a validation split by `traceap ship model --calibrate`,
`traceap.model.ship.calibrate_threshold`), else 0.5.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from weakref import WeakKeyDictionary

import numpy as np

from ..trace import Trace
from ..windows import Windows
from .base import BaseDetector, clip01
from .registry import register_detector


class LearnedDetector(BaseDetector):
    """Window scores from a trained TorchTraceAP-style model (weakly supervised, CPU)."""

    name = "model"

    def __init__(self, path: str | os.PathLike | None = None, threads: int | None = 1):
        from ..model.predict import Predictor
        self.path = path
        self.predictor = Predictor(path, threads=threads)
        self.threshold = float(self.predictor.checkpoint.meta.get("flag_threshold", 0.5))
        self._last: WeakKeyDictionary = WeakKeyDictionary()

    def fit(self, traces: Sequence[Trace], labels: Sequence[int]) -> "LearnedDetector":
        """The checkpoint is already trained (`traceap train` trains one); returns self."""
        return self

    def _predict(self, windows: Windows):
        pred = self._last.get(windows)
        if pred is None:
            pred = self.predictor.predict(windows)
            self._last[windows] = pred
        return pred

    def score_windows(self, windows: Windows) -> np.ndarray:
        """Anomaly score per window, in [0, 1]."""
        return clip01(self._predict(windows).scores)

    @property
    def config(self):
        """The model configuration of the checkpoint (`traceap.model.config`): its ablation
        switches name an ablation variant (`traceap eval --ablation`)."""
        return self.predictor.cfg

    @property
    def pattern_head(self):
        """The learned pattern head (`pattern_probabilities`)."""
        return self.pattern_probabilities

    def pattern_probabilities(self, windows: Windows) -> dict[str, np.ndarray]:
        """Per pattern id the checkpoint's head names (`config.head_patterns`): per-window
        probability from the learned pattern head."""
        probs = self._predict(windows).patterns
        return {p: clip01(probs[:, i]) for i, p in enumerate(self.predictor.head_patterns)}

    def __repr__(self) -> str:
        return f"LearnedDetector({str(self.predictor.checkpoint.path)!r})"


register_detector("model", LearnedDetector, built_from_options=True)


__all__ = ["LearnedDetector"]
