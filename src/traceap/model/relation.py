"""Window-to-window detector (paper 5.4, Figure 5D): window embeddings -> one score per window.

  E_win + 1-D positional encoding
    local:  sum of dilated 1-D convolutions (several dilations)      -> D
    global: self-attention over all windows                           -> D
  concat (2D = 4d) --1x1 conv--> 2d --FFN--> anomaly logit per window
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


def sincos_1d(n: int, dim: int, device=None) -> torch.Tensor:
    """Transformer sinusoidal positional encoding [n, dim]."""
    pos = torch.arange(n, dtype=torch.float32, device=device).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device)
                    * (-math.log(10000.0) / dim))
    pe = torch.zeros(n, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


class DilatedConvs(nn.Module):
    """Local relations: sum of 3-tap 1-D convolutions with dilations 1, 2, 4, ... (DiConv)."""

    def __init__(self, dim: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(dim, dim, 3, padding=d, dilation=d) for d in dilations)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = x.transpose(1, 2)
        y = sum(conv(xt) for conv in self.convs)
        return self.norm(F.gelu(y).transpose(1, 2))


class GlobalAttention(nn.Module):
    """Global relations: pre-norm self-attention layers over the windows of a trace."""

    def __init__(self, dim: int, heads: int, layers: int, dropout: float):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.attns = nn.ModuleList(nn.MultiheadAttention(dim, heads, dropout=dropout,
                                                         batch_first=True) for _ in range(layers))
        self.out = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, attn in zip(self.norms, self.attns):
            h = norm(x)
            x = x + attn(h, h, h, need_weights=False)[0]
        return self.out(x)


class WindowToWindow(nn.Module):
    """Figure 5D: E_win [B, N, D] -> (fused window features [B, N, D], logits [B, N])."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        dim = cfg.D
        self.enabled = not cfg.no_relation
        if self.enabled:
            self.local = DilatedConvs(dim, cfg.dilations)
            self.globl = GlobalAttention(dim, cfg.heads, cfg.relation_layers, cfg.dropout)
            self.fuse = nn.Sequential(nn.Conv1d(2 * dim, dim, 1), nn.GELU())
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(),
                                 nn.Dropout(cfg.dropout), nn.Linear(dim, 1))

    def forward(self, win: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.enabled:
            x = win + sincos_1d(win.shape[1], win.shape[2], win.device)
            both = torch.cat([self.local(x), self.globl(x)], dim=-1)      # [B, N, 2D]
            feat = self.fuse(both.transpose(1, 2)).transpose(1, 2) + win
        else:  # ablation: each window scored on its own embedding
            feat = win
        return feat, self.ffn(feat).squeeze(-1)


__all__ = ["DilatedConvs", "GlobalAttention", "WindowToWindow", "sincos_1d"]
