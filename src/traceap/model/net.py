"""The whole detector (paper Figure 5), from per-trace features to window scores.

    TraceFeatures --collate--> batch --EventEncoder--> E_event --WindowEncoder--> E_win
      --WindowToWindow--> window scores P_w;  PatternHead --> per-window pattern probabilities
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .config import ModelConfig, preset
from .event_encoder import EventEncoder
from .features import UNKNOWN_PLATFORM, TraceFeatures, batch_arrays, summary_dim
from .heads import PatternHead, SVMHyperplane
from .relation import WindowToWindow
from .window_encoder import WindowEncoder


class TraceAPModel(nn.Module):
    """Event encoder -> window encoder -> window-to-window detector (+ pattern head)."""

    def __init__(self, cfg: ModelConfig, platforms: list[str]):
        super().__init__()
        cfg = cfg.with_head()   # the head's pattern list fixed now: the checkpoint stores it
        if not platforms or platforms[0] != UNKNOWN_PLATFORM:
            platforms = [UNKNOWN_PLATFORM] + [p for p in platforms if p != UNKNOWN_PLATFORM]
        if not cfg.platform_embedding:  # every trace gets the one "unknown" platform
            platforms = [UNKNOWN_PLATFORM]
        self.cfg = cfg
        self.platforms = list(platforms)
        self.events = EventEncoder(cfg)
        self.windows = WindowEncoder(cfg, len(self.platforms), summary_dim(cfg))
        self.relation = WindowToWindow(cfg)
        self.patterns = PatternHead(cfg.D, len(cfg.head_patterns))
        self.svm = SVMHyperplane(cfg.D)

    def platform_id(self, name: str) -> int:
        """Index of a platform in the table (0 = unknown / unseen)."""
        try:
            return self.platforms.index(name)
        except ValueError:
            return 0

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """batch (see `collate`) -> logits [B, N], scores [B, N], emb [B, N, D],
        pattern_logits [B, N, P] (P = len(cfg.head_patterns)), svm_margin [B, N]."""
        e_event = self.events(batch)
        e_win = self.windows(e_event, batch)
        feat, logits = self.relation(e_win)
        return {"logits": logits, "scores": torch.sigmoid(logits), "emb": e_win,
                "pattern_logits": self.patterns(feat), "svm_margin": self.svm(e_win)}


def collate(feats: list[TraceFeatures], model: TraceAPModel, text_table: dict[str, np.ndarray],
            platform_dropout: float = 0.0, rng: np.random.Generator | None = None
            ) -> dict[str, torch.Tensor]:
    """Stack traces with the same N into one batch; names become rows of one text table
    (`features.batch_arrays`, as tensors)."""
    arrays = batch_arrays(feats, model.platform_id, model.cfg, text_table, platform_dropout, rng)
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def create_model(name: str | ModelConfig = "small", platforms: list[str] | None = None,
                 ablations=()) -> TraceAPModel:
    """Build an untrained model from a preset name (or a config) and a platform table."""
    cfg = preset(name) if isinstance(name, str) else name
    if ablations:
        cfg = cfg.with_ablations(ablations)
    return TraceAPModel(cfg, platforms or [UNKNOWN_PLATFORM])


__all__ = ["TraceAPModel", "collate", "create_model"]
