"""Window encoder (paper 5.3, Figure 5C): a window's events -> one window embedding (its CLS).

  [CLS] + E_event --2-D RoPE over (relative start time, stream)--> transformer encoder
  --> projection: CLS cross-attends to a trainable hardware-platform embedding --> E_win
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class Rope2D(nn.Module):
    """Rotary position embedding on two axes (RoFormer, extended to 2-D): of each head's
    rotation pairs, half turn with the event's relative start time, half with its stream."""

    def __init__(self, head_dim: int, time_base: float = 100.0, stream_base: float = 10.0):
        super().__init__()
        quarter = head_dim // 4
        idx = torch.arange(quarter, dtype=torch.float32) / quarter
        self.register_buffer("freq_time", time_base ** -idx, persistent=False)
        self.register_buffer("freq_stream", stream_base ** -idx, persistent=False)

    def angles(self, pos_time: torch.Tensor, pos_stream: torch.Tensor):
        """(cos, sin), each [S, 1, L, head_dim/2], for positions [S, L]; computed once per
        forward and shared by every layer."""
        angle = torch.cat([pos_time.unsqueeze(-1) * self.freq_time,
                           pos_stream.unsqueeze(-1) * self.freq_stream], dim=-1).unsqueeze(1)
        return angle.cos(), angle.sin()

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate pairs (x[i], x[i + hd/2]) of x [S, H, L, hd] by the given angles."""
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class RopeAttention(nn.Module):
    """Multi-head self-attention with 2-D RoPE on queries and keys."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x, rope, attn_mask):
        s, l, c = x.shape
        q, k, v = self.qkv(x).reshape(s, l, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k = Rope2D.rotate(q, *rope), Rope2D.rotate(k, *rope)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(s, l, c))


class EncoderBlock(nn.Module):
    """Pre-norm transformer layer: MHSA (with RoPE) + FFN, each with a residual."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RopeAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, dim))

    def forward(self, x, rope, attn_mask):
        x = x + self.attn(self.norm1(x), rope, attn_mask)
        return x + self.mlp(self.norm2(x))


class PlatformProjection(nn.Module):
    """Final projection: the CLS token cross-attends to the trace's hardware-platform tokens."""

    def __init__(self, dim: int, heads: int, n_platforms: int, tokens: int):
        super().__init__()
        self.tokens = tokens
        self.platform = nn.Embedding(n_platforms, tokens * dim)
        self.norm_q = nn.LayerNorm(dim)
        self.cross = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.proj = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim))

    def forward(self, cls: torch.Tensor, platform: torch.Tensor) -> torch.Tensor:
        # cls: [B, N, D]; platform: [B] -> [B, N, D]
        b, n, dim = cls.shape
        kv = self.platform(platform).reshape(b, self.tokens, dim)
        y, _ = self.cross(self.norm_q(cls), kv, kv, need_weights=False)
        return self.proj(cls + y)


class WindowEncoder(nn.Module):
    """Figure 5C: E_event [B, N, K, D] -> window embeddings E_win [B, N, D] (the CLS outputs)."""

    def __init__(self, cfg: ModelConfig, n_platforms: int, summary_dim: int):
        super().__init__()
        dim = cfg.D
        self.cfg = cfg
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.cls, std=0.02)
        self.summary = nn.Sequential(nn.Linear(summary_dim, dim), nn.GELU(), nn.Linear(dim, dim)) \
            if cfg.window_summary else None
        self.blocks = nn.ModuleList(
            [] if cfg.no_transformer else
            [EncoderBlock(dim, cfg.heads, cfg.mlp_ratio, cfg.dropout) for _ in range(cfg.layers)])
        self.rope = Rope2D(dim // cfg.heads)
        self.norm = nn.LayerNorm(dim)
        self.projection = PlatformProjection(dim, cfg.heads, n_platforms, cfg.platform_tokens)

    def forward(self, events: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        b, n, k, dim = events.shape
        mask = batch["mask"].reshape(b * n, k)
        cls = self.cls.expand(b * n, 1, dim)
        if self.summary is not None:
            summary = batch["summary"]      # [B, N, S] (features.summary: absolute / relative)
            cls = cls + self.summary(summary).reshape(b * n, 1, dim)
        x = torch.cat([cls, events.reshape(b * n, k, dim)], dim=1)     # eq. 5
        if self.blocks:
            zero = torch.zeros(b * n, 1, dtype=x.dtype, device=x.device)
            pos_time = torch.cat([zero, batch["t_rel"].reshape(b * n, k) * self.cfg.rope_time_scale], 1)
            pos_stream = torch.cat([zero, batch["stream"].reshape(b * n, k).to(x.dtype)], 1)
            keep = torch.cat([torch.ones_like(mask[:, :1]), mask], 1)      # CLS always attends
            attn_mask = keep[:, None, None, :]                              # [S, 1, 1, L]
            rope = self.rope.angles(pos_time, pos_stream)
            for block in self.blocks:
                x = block(x, rope, attn_mask)
            win = x[:, 0]
        else:  # ablation: no transformer; CLS plus the mean of the window's events
            m = mask.unsqueeze(-1).to(x.dtype)
            win = x[:, 0] + (x[:, 1:] * m).sum(1) / m.sum(1).clamp(min=1.0)
        win = self.norm(win).reshape(b, n, dim)
        return self.projection(win, batch["platform"])


__all__ = ["EncoderBlock", "PlatformProjection", "Rope2D", "RopeAttention", "WindowEncoder"]
