"""Event encoder (paper 5.2, Figure 5B): four attributes of an anchor event -> one 2d embedding.

  kernel name, CPU op name --frozen text encoder--> FC + ReLU adapters   (eq. 1-2)
  launch delay, duration   --log quantise (eq. 3)--> embedding table --> LN + FC + ReLU
    (with `time_relative`, the delay slot also adds the embeddings of the delay and of the GPU
    idle gap before the event relative to the trace's typical ones, and the duration slot that
    of the duration relative to the median of the same name: scale-free across GPUs and batches)
  concat (4d) --> convolutional neck over the window's events --> E_event (2d)   (eq. 4)
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig


class TextAdapter(nn.Module):
    """Eq. 1-2: ReLU(FC(text embedding)).  Applied once per unique name, then gathered."""

    def __init__(self, text_dim: int, d: int, trainable: bool = True):
        super().__init__()
        self.fc = nn.Linear(text_dim, d)
        self.act = nn.ReLU() if trainable else nn.Identity()
        if not trainable:  # ablation: a fixed random projection stands in for the adapter
            nn.init.orthogonal_(self.fc.weight)
            nn.init.zeros_(self.fc.bias)
            self.fc.requires_grad_(False)

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(text))


class TimeEmbedding(nn.Module):
    """Quantised time level -> trainable table -> LN + FC + ReLU adapter."""

    def __init__(self, vocab: int, d: int, adapter: bool = True):
        super().__init__()
        self.table = nn.Embedding(vocab + 1, d)  # +1: the "unknown" level
        self.adapter = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.ReLU()) if adapter \
            else nn.Identity()

    def forward(self, level: torch.Tensor) -> torch.Tensor:
        return self.adapter(self.table(level))


class LayerNormChannels(nn.Module):
    """LayerNorm over the channel axis of [B, C, L] (SAM's neck uses LayerNorm2d the same way)."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class ConvNeck(nn.Module):
    """SAM-style neck over the events of a window: 1x1 conv 4d->2d, LN, 3-tap conv, LN."""

    def __init__(self, d: int):
        super().__init__()
        self.reduce = nn.Conv1d(4 * d, 2 * d, kernel_size=1, bias=False)
        self.norm1 = LayerNormChannels(2 * d)
        self.mix = nn.Conv1d(2 * d, 2 * d, kernel_size=3, padding=1, bias=False)
        self.norm2 = LayerNormChannels(2 * d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: [S, K, 4d], mask: [S, K] -> [S, K, 2d]; padding is zeroed so it never leaks in.
        m = mask.unsqueeze(1).to(x.dtype)
        y = self.norm1(self.reduce(x.transpose(1, 2))) * m
        y = self.norm2(self.mix(y)) * m
        return y.transpose(1, 2)


class EventEncoder(nn.Module):
    """Figure 5B: (kernel name, CPU op name, delay, duration) -> E_event [B, N, K, 2d]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        adapt = not cfg.no_event_adapter
        self.kernel_text = TextAdapter(cfg.text_dim, cfg.d, trainable=adapt)
        self.cpu_text = TextAdapter(cfg.text_dim, cfg.d, trainable=adapt)
        if cfg.time_absolute:
            self.delay = TimeEmbedding(cfg.time_vocab, cfg.d, adapter=adapt)
            self.duration = TimeEmbedding(cfg.time_vocab, cfg.d, adapter=adapt)
        if cfg.time_relative:
            self.delay_rel = TimeEmbedding(cfg.time_vocab, cfg.d, adapter=adapt)
            self.gap_rel = TimeEmbedding(cfg.time_vocab, cfg.d, adapter=adapt)
            self.duration_rel = TimeEmbedding(cfg.time_vocab, cfg.d, adapter=adapt)
        self.time_absolute, self.time_relative = cfg.time_absolute, cfg.time_relative
        self.neck = ConvNeck(cfg.d)
        self.name_dropout = cfg.name_dropout

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        text = batch["text"]                                   # [U, text_dim], row 0 = no name
        kernel, cpu_op = batch["kernel"], batch["cpu_op"]
        if self.training and self.name_dropout > 0:  # lean on timing too, not names alone
            hide = torch.rand(kernel.shape, device=kernel.device) < self.name_dropout
            kernel, cpu_op = kernel.masked_fill(hide, 0), cpu_op.masked_fill(hide, 0)
        e_kernel = self.kernel_text(text)[kernel]              # [B, N, K, d]
        e_cpu = self.cpu_text(text)[cpu_op]
        delay, dur = [], []
        if self.time_absolute:
            delay.append(self.delay(batch["delay"]))
            dur.append(self.duration(batch["dur"]))
        if self.time_relative:
            delay += [self.delay_rel(batch["delay_rel"]), self.gap_rel(batch["gap_rel"])]
            dur.append(self.duration_rel(batch["dur_rel"]))
        x = torch.cat([e_kernel, e_cpu, sum(delay), sum(dur)], dim=-1)  # [B, N, K, 4d]
        b, n, k, c = x.shape
        y = self.neck(x.reshape(b * n, k, c), batch["mask"].reshape(b * n, k))
        return y.reshape(b, n, k, -1)


__all__ = ["ConvNeck", "EventEncoder", "TextAdapter", "TimeEmbedding"]
