"""Scoring windows with a loaded checkpoint: anomaly score and pattern probabilities per window."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ..dataset import PATTERNS
from ..windows import Windows
from .checkpoint import Checkpoint, load_model
from .features import TraceFeatures, featurize
from .net import collate
from .text import TextEncoder


@dataclass
class Prediction:
    """Model outputs for one trace's windows."""

    scores: np.ndarray     # float64 [N] in [0, 1]
    patterns: np.ndarray   # float64 [N, len(PATTERNS)] in [0, 1]

    def pattern_of(self, w: int) -> tuple[str, float]:
        """Most likely pattern of window w and its probability."""
        i = int(np.argmax(self.patterns[w]))
        return PATTERNS[i], float(self.patterns[w, i])


@contextmanager
def torch_threads(n: int | None):
    """Run a block with n torch CPU threads (None: leave as is), restoring the setting after."""
    if not n:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class Predictor:
    """A checkpoint ready to score traces (text encoder with the checkpoint's vocabulary).

    `threads`: torch CPU threads while scoring.  One is the default because the model is small:
    extra threads buy little and, on a busy machine, cost several times the run time."""

    def __init__(self, checkpoint: Checkpoint | str | os.PathLike | None = None,
                 threads: int | None = 1):
        self.threads = threads
        self.checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else load_model(checkpoint)
        self.model = self.checkpoint.model.eval()
        self.text = TextEncoder(extra=self.checkpoint.text_table)

    @property
    def cfg(self):
        """The model's config."""
        return self.model.cfg

    def featurize(self, windows: Windows) -> TraceFeatures:
        """Model inputs of these windows."""
        return featurize(windows, self.cfg)

    @torch.no_grad()
    def predict_features(self, feats: TraceFeatures) -> Prediction:
        """Scores and pattern probabilities from precomputed features."""
        names = [str(n) for n in feats.names[1:]]
        table = dict(zip(names, self.text.embed(names))) if names else {}
        with torch_threads(self.threads):
            out = self.model(collate([feats], self.model, table))
        return Prediction(out["scores"][0].double().numpy(),
                          torch.sigmoid(out["pattern_logits"][0]).double().numpy())

    def predict(self, windows: Windows) -> Prediction:
        """Scores and pattern probabilities of every window."""
        return self.predict_features(self.featurize(windows))


__all__ = ["Prediction", "Predictor"]
