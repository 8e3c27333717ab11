"""The whole detector (paper Figure 5), from per-trace features to window scores.

    TraceFeatures --collate--> batch --EventEncoder--> E_event --WindowEncoder--> E_win
      --WindowToWindow--> window scores P_w;  PatternHead --> per-window pattern probabilities
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..dataset import PATTERNS
from .config import ModelConfig, preset
from .event_encoder import EventEncoder
from .features import SUMMARY_DIM, UNKNOWN_PLATFORM, TraceFeatures
from .heads import PatternHead, SVMHyperplane
from .relation import WindowToWindow
from .window_encoder import WindowEncoder


class TraceAPModel(nn.Module):
    """Event encoder -> window encoder -> window-to-window detector (+ pattern head)."""

    def __init__(self, cfg: ModelConfig, platforms: list[str]):
        super().__init__()
        if not platforms or platforms[0] != UNKNOWN_PLATFORM:
            platforms = [UNKNOWN_PLATFORM] + [p for p in platforms if p != UNKNOWN_PLATFORM]
        self.cfg = cfg
        self.platforms = list(platforms)
        self.events = EventEncoder(cfg)
        self.windows = WindowEncoder(cfg, len(self.platforms), SUMMARY_DIM)
        self.relation = WindowToWindow(cfg)
        self.patterns = PatternHead(cfg.D, len(PATTERNS))
        self.svm = SVMHyperplane(cfg.D)

    def platform_id(self, name: str) -> int:
        """Index of a platform in the table (0 = unknown / unseen)."""
        try:
            return self.platforms.index(name)
        except ValueError:
            return 0

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """batch (see `collate`) -> logits [B, N], scores [B, N], emb [B, N, D],
        pattern_logits [B, N, P], svm_margin [B, N]."""
        e_event = self.events(batch)
        e_win = self.windows(e_event, batch)
        feat, logits = self.relation(e_win)
        return {"logits": logits, "scores": torch.sigmoid(logits), "emb": e_win,
                "pattern_logits": self.patterns(feat), "svm_margin": self.svm(e_win)}


def collate(feats: list[TraceFeatures], model: TraceAPModel, text_table: dict[str, np.ndarray],
            platform_dropout: float = 0.0, rng: np.random.Generator | None = None
            ) -> dict[str, torch.Tensor]:
    """Stack traces with the same N into one batch; names become rows of one text table."""
    n = {f.n_windows for f in feats}
    if len(n) != 1:
        raise ValueError("traces in a batch must have the same number of windows")
    names: dict[str, int] = {"": 0}
    remaps = []
    for f in feats:
        remaps.append(np.array([names.setdefault(str(s), len(names)) for s in f.names], np.int64))
    dim = model.cfg.text_dim
    text = np.zeros((len(names), dim), np.float32)
    for s, i in names.items():
        if i:
            text[i] = text_table[s]
    platforms = [model.platform_id(f.platform) for f in feats]
    if platform_dropout > 0 and rng is not None:
        platforms = [0 if rng.random() < platform_dropout else p for p in platforms]

    def stack(attr, dtype):
        return torch.from_numpy(np.stack([getattr(f, attr) for f in feats]).astype(dtype))

    return {
        "text": torch.from_numpy(text),
        "kernel": torch.from_numpy(np.stack([r[f.kernel] for r, f in zip(remaps, feats)])),
        "cpu_op": torch.from_numpy(np.stack([r[f.cpu_op] for r, f in zip(remaps, feats)])),
        "delay": stack("delay", np.int64), "dur": stack("dur", np.int64),
        "t_rel": stack("t_rel", np.float32), "stream": stack("stream", np.int64),
        "mask": stack("mask", bool), "summary": stack("summary", np.float32),
        "platform": torch.tensor(platforms, dtype=torch.long),
    }


def create_model(name: str | ModelConfig = "small", platforms: list[str] | None = None,
                 ablations=()) -> TraceAPModel:
    """Build an untrained model from a preset name (or a config) and a platform table."""
    cfg = preset(name) if isinstance(name, str) else name
    if ablations:
        cfg = cfg.with_ablations(ablations)
    return TraceAPModel(cfg, platforms or [UNKNOWN_PLATFORM])


__all__ = ["TraceAPModel", "collate", "create_model"]
