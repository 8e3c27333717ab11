"""Beyond the paper: a pattern head, so flagged windows get an anti-pattern name without an LLM.

Trained by multiple-instance learning from trace-level `patterns` only: each pattern's trace
probability is the mean of its top-k window probabilities (k = topk_fraction * N), a good trace
has no pattern anywhere.  Window-level anomaly intervals are read only when the config asks
for window supervision (`w_window_pattern` > 0: per-window BCE where a train trace's anomalies
are known, `losses.window_pattern_loss`).
"""

from __future__ import annotations

import torch
from torch import nn


class PatternHead(nn.Module):
    """Fused window features [B, N, D] -> per-window pattern logits [B, N, P], one column per
    pattern of the config's `head_patterns`."""

    def __init__(self, dim: int, n_patterns: int):
        super().__init__()
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(),
                                  nn.Linear(dim, n_patterns))

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return self.head(feat)


class SVMHyperplane(nn.Module):
    """The linear separator of the SVM-style loss (paper eq. 11-13) on window embeddings."""

    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, 1)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return self.fc(emb).squeeze(-1)


__all__ = ["PatternHead", "SVMHyperplane"]
