"""Scoring windows with a loaded checkpoint: anomaly score and pattern probabilities per window.

Scoring runs on numpy (`inference.InferenceModel`), so a `traceap analyze` never pays for
importing torch; `engine="torch"` runs the torch model instead (same outputs to 1e-5).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..windows import Windows
from .checkpoint import Checkpoint, load_model
from .features import TraceFeatures, batch_arrays, featurize
from .inference import InferenceModel
from .ops import blas_threads, sigmoid
from .text import TextEncoder

ENGINES = ("numpy", "torch")


@dataclass
class Prediction:
    """Model outputs for one trace's windows."""

    scores: np.ndarray     # float64 [N] in [0, 1]
    patterns: np.ndarray   # float64 [N, P] in [0, 1], a column per `Predictor.head_patterns`


class Predictor:
    """A checkpoint ready to score traces (text encoder with the checkpoint's vocabulary).

    `threads`: CPU threads while scoring (BLAS for numpy, torch's for torch).  One is the
    default because the model is small: extra threads buy little and, on a busy machine, cost
    several times the run time.  `engine`: "numpy" (default) or "torch"."""

    def __init__(self, checkpoint: Checkpoint | str | os.PathLike | None = None,
                 threads: int | None = 1, engine: str = "numpy"):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}")
        self.threads, self.engine = threads, engine
        self.checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else load_model(checkpoint)
        ckpt = self.checkpoint
        # one net per ensemble member (one for a single model); outputs averaged in logit space
        self.nets = [InferenceModel(ckpt.config, ckpt.platforms, s) for s in ckpt.states] \
            if engine == "numpy" else ckpt.torch_models()
        self.net = self.nets[0]
        self.text = TextEncoder(extra=ckpt.text_table)

    @property
    def cfg(self):
        """The model's config."""
        return self.checkpoint.config

    @property
    def head_patterns(self) -> tuple[str, ...]:
        """The pattern ids of the pattern head's columns (`Prediction.patterns`), in order."""
        return self.cfg.head_patterns

    def featurize(self, windows: Windows) -> TraceFeatures:
        """Model inputs of these windows."""
        return featurize(windows, self.cfg)

    def predict_features(self, feats: TraceFeatures) -> Prediction:
        """Scores and pattern probabilities from precomputed features."""
        names = [] if self.cfg.names_masked else [str(n) for n in feats.names[1:]]
        table = dict(zip(names, self.text.embed(names))) if names else {}
        batch = batch_arrays([feats], self.net.platform_id, self.cfg, table)
        if self.engine == "numpy":
            with blas_threads(self.threads):
                outs = [net(batch) for net in self.nets]
            runs = [(o["scores"][0], o["logits"][0], o["pattern_logits"][0]) for o in outs]
        else:
            runs = self._torch_forward(batch)
        if len(runs) == 1:
            scores, logits = runs[0][0], runs[0][2]
        else:   # an ensemble: the mean of the members' logits
            scores = sigmoid(np.mean([np.asarray(r[1], np.float64) for r in runs], axis=0))
            logits = np.mean([np.asarray(r[2], np.float64) for r in runs], axis=0)
        return Prediction(np.asarray(scores, np.float64),
                          sigmoid(np.asarray(logits, np.float32)).astype(np.float64))

    def _torch_forward(self, batch: dict[str, np.ndarray]) -> list[tuple[np.ndarray, ...]]:
        import torch

        old = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.no_grad():
                tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
                outs = [net(tensors) for net in self.nets]
        finally:
            torch.set_num_threads(old)
        return [(o["scores"][0].numpy(), o["logits"][0].numpy(), o["pattern_logits"][0].numpy())
                for o in outs]

    def predict(self, windows: Windows) -> Prediction:
        """Scores and pattern probabilities of every window."""
        return self.predict_features(self.featurize(windows))


__all__ = ["ENGINES", "Prediction", "Predictor"]
