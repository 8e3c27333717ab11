"""The detector's forward pass (paper Figure 5) in numpy, for scoring without importing torch.

Importing torch costs about two seconds, more than reading and analysing a small trace, so
`traceap analyze` scores with this mirror of `net.TraceAPModel` in eval mode, built from the
same checkpoint arrays.  The module names follow net.py one for one:

    EventEncoder -> WindowEncoder (RoPE blocks, PlatformProjection) -> WindowToWindow
      (DilatedConvs, GlobalAttention) -> scores;  PatternHead -> pattern logits

Training, ablation studies and anything else that needs gradients use the torch model;
tests/test_inference.py holds the two to the same outputs (1e-5) for the bundled checkpoint
and for every config switch.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError
from .config import ModelConfig
from .features import UNKNOWN_PLATFORM, summary_dim
from .ops import gelu, layer_norm, linear, relu, sigmoid, softmax_

#: nn.LayerNorm's default epsilon (every LayerNorm of net.py uses it).
LN_EPS = 1e-5


class Weights:
    """The checkpoint's arrays under one module prefix, with shapes checked on access."""

    def __init__(self, state: dict[str, np.ndarray], prefix: str = ""):
        self.state, self.prefix = state, prefix

    def __call__(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        key = self.prefix + name
        try:
            a = self.state[key]
        except KeyError:
            raise ModelError(f"checkpoint has no weight {key!r}") from None
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise ModelError(f"checkpoint weight {key!r} has shape {tuple(a.shape)}, "
                             f"expected {tuple(shape)}")
        return np.ascontiguousarray(a, dtype=np.float32)

    def sub(self, prefix: str) -> "Weights":
        """The arrays under a child module."""
        return Weights(self.state, self.prefix + prefix)

    def linear(self, name: str, n_in: int, n_out: int, bias: bool = True):
        """(weight [out, in], bias [out] or None) of an nn.Linear."""
        return (self(f"{name}.weight", (n_out, n_in)),
                self(f"{name}.bias", (n_out,)) if bias else None)

    def norm(self, name: str, dim: int):
        """(weight, bias) of an nn.LayerNorm."""
        return self(f"{name}.weight", (dim,)), self(f"{name}.bias", (dim,))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
              keep: np.ndarray | None = None) -> np.ndarray:
    """softmax(q k^T / sqrt(hd)) v over [..., heads, L, hd]; keep: bool, broadcast to scores."""
    scores = q @ np.swapaxes(k, -1, -2)
    scores *= np.float32(1.0 / math.sqrt(q.shape[-1]))
    if keep is not None:
        scores = np.where(keep, scores, np.float32(-np.inf))
    return softmax_(scores) @ v


def conv1d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
           dilation: int = 1) -> np.ndarray:
    """nn.Conv1d with 'same' zero padding (padding = dilation * (taps - 1) / 2), channels last:
    x [S, L, C_in], weight [C_out, C_in, taps] -> [S, L, C_out]."""
    taps = weight.shape[-1]
    pad = dilation * (taps - 1) // 2
    length = x.shape[1]
    xp = np.pad(x, ((0, 0), (pad, pad), (0, 0))) if pad else x
    y = None
    for j in range(taps):
        part = xp[:, j * dilation:j * dilation + length] @ weight[:, :, j].T
        y = part if y is None else y + part
    if bias is not None:
        y += bias
    return y


class MultiheadAttention:
    """nn.MultiheadAttention(batch_first=True), eval mode, no masks."""

    def __init__(self, w: Weights, dim: int, heads: int):
        self.heads = heads
        in_w = w("in_proj_weight", (3 * dim, dim))
        in_b = w("in_proj_bias", (3 * dim,))
        self.q, self.k, self.v = ((in_w[i * dim:(i + 1) * dim], in_b[i * dim:(i + 1) * dim])
                                  for i in range(3))
        self.out = w.linear("out_proj", dim, dim)

    def __call__(self, query: np.ndarray, key: np.ndarray, value: np.ndarray) -> np.ndarray:
        def split(x):  # [B, L, D] -> [B, heads, L, hd]
            b, n, d = x.shape
            return x.reshape(b, n, self.heads, d // self.heads).transpose(0, 2, 1, 3)
        y = attention(split(linear(query, *self.q)), split(linear(key, *self.k)),
                      split(linear(value, *self.v)))
        b, _, n, _ = y.shape
        return linear(y.transpose(0, 2, 1, 3).reshape(b, n, -1), *self.out)


class EventEncoder:
    """net.EventEncoder: (kernel name, CPU op name, delay, duration) -> E_event [B, N, K, 2d]."""

    def __init__(self, w: Weights, cfg: ModelConfig):
        d, adapt = cfg.d, not cfg.no_event_adapter
        self.kernel_text = w.linear("kernel_text.fc", cfg.text_dim, d)
        self.cpu_text = w.linear("cpu_text.fc", cfg.text_dim, d)
        self.adapt = adapt
        # a time adapter acts on each table row alone: apply it to the table once, then look up
        self.delay, self.duration = [], []          # (input key, adapted table) summed per slot
        if cfg.time_absolute:
            self.delay.append(("delay", self._time_table(w.sub("delay."), cfg)))
            self.duration.append(("dur", self._time_table(w.sub("duration."), cfg)))
        if cfg.time_relative:
            self.delay += [("delay_rel", self._time_table(w.sub("delay_rel."), cfg)),
                           ("gap_rel", self._time_table(w.sub("gap_rel."), cfg))]
            self.duration.append(("dur_rel", self._time_table(w.sub("duration_rel."), cfg)))
        self.reduce = w("neck.reduce.weight", (2 * d, 4 * d, 1))
        self.norm1 = w.norm("neck.norm1.norm", 2 * d)
        self.mix = w("neck.mix.weight", (2 * d, 2 * d, 3))
        self.norm2 = w.norm("neck.norm2.norm", 2 * d)

    def _time_table(self, w: Weights, cfg: ModelConfig) -> np.ndarray:
        table = w("table.weight", (cfg.time_vocab + 1, cfg.d))
        if not self.adapt:
            return table
        h = layer_norm(table, *w.norm("adapter.0", cfg.d), LN_EPS)
        return relu(linear(h, *w.linear("adapter.1", cfg.d, cfg.d)))

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        text = batch["text"]
        kt, ct = linear(text, *self.kernel_text), linear(text, *self.cpu_text)
        if self.adapt:
            kt, ct = relu(kt), relu(ct)
        delay = sum(table[batch[key]] for key, table in self.delay)
        dur = sum(table[batch[key]] for key, table in self.duration)
        x = np.concatenate([kt[batch["kernel"]], ct[batch["cpu_op"]], delay, dur],
                           axis=-1)                                          # [B, N, K, 4d]
        b, n, k, c = x.shape
        x = x.reshape(b * n, k, c)
        m = batch["mask"].reshape(b * n, k, 1).astype(np.float32)
        y = layer_norm(conv1d(x, self.reduce), *self.norm1, LN_EPS) * m
        y = layer_norm(conv1d(y, self.mix), *self.norm2, LN_EPS) * m
        return y.reshape(b, n, k, -1)


class EncoderBlock:
    """net.EncoderBlock: pre-norm RoPE self-attention + GELU FFN, each with a residual."""

    def __init__(self, w: Weights, dim: int, heads: int, hidden: int):
        self.heads = heads
        self.norm1, self.norm2 = w.norm("norm1", dim), w.norm("norm2", dim)
        self.qkv = w.linear("attn.qkv", dim, 3 * dim)
        self.proj = w.linear("attn.proj", dim, dim)
        self.up = w.linear("mlp.0", dim, hidden)
        self.down = w.linear("mlp.3", hidden, dim)

    def __call__(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, keep: np.ndarray):
        s, n, c = x.shape
        qkv = linear(layer_norm(x, *self.norm1, LN_EPS), *self.qkv)
        q, k, v = qkv.reshape(s, n, 3, self.heads, c // self.heads).transpose(2, 0, 3, 1, 4)
        y = attention(rotate(q, cos, sin), rotate(k, cos, sin), v, keep)
        x = x + linear(y.transpose(0, 2, 1, 3).reshape(s, n, c), *self.proj)
        h = gelu(linear(layer_norm(x, *self.norm2, LN_EPS), *self.up))
        return x + linear(h, *self.down)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """net.Rope2D.rotate: turn pairs (x[i], x[i + hd/2]) by the given angles."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class WindowEncoder:
    """net.WindowEncoder: E_event [B, N, K, D] -> E_win [B, N, D] (CLS outputs, then the
    cross-attention to the platform tokens)."""

    def __init__(self, w: Weights, cfg: ModelConfig, n_platforms: int):
        dim, self.cfg = cfg.D, cfg
        self.cls = w("cls", (1, 1, dim))
        width = summary_dim(cfg)
        self.summary = (w.linear("summary.0", width, dim), w.linear("summary.2", dim, dim)) \
            if cfg.window_summary else None
        hidden = int(dim * cfg.mlp_ratio)
        self.blocks = [] if cfg.no_transformer else \
            [EncoderBlock(w.sub(f"blocks.{i}."), dim, cfg.heads, hidden) for i in range(cfg.layers)]
        quarter = dim // cfg.heads // 4
        idx = np.arange(quarter, dtype=np.float32) / np.float32(quarter)
        self.freq_time = np.power(np.float32(100.0), -idx)      # net.Rope2D's bases
        self.freq_stream = np.power(np.float32(10.0), -idx)
        self.norm = w.norm("norm", dim)
        p = w.sub("projection.")
        self.tokens = cfg.platform_tokens
        self.platform = p("platform.weight", (n_platforms, cfg.platform_tokens * dim))
        self.norm_q = p.norm("norm_q", dim)
        self.cross = MultiheadAttention(p.sub("cross."), dim, cfg.heads)
        self.proj_norm = p.norm("proj.0", dim)
        self.proj = p.linear("proj.1", dim, dim)

    def __call__(self, events: np.ndarray, batch: dict[str, np.ndarray]) -> np.ndarray:
        b, n, k, dim = events.shape
        mask = batch["mask"].reshape(b * n, k)
        cls = np.broadcast_to(self.cls, (b * n, 1, dim))
        if self.summary is not None:
            summary = batch["summary"]      # features.summary: absolute and/or relative
            (w1, b1), (w2, b2) = self.summary
            cls = cls + linear(gelu(linear(summary, w1, b1)), w2, b2).reshape(b * n, 1, dim)
        x = np.concatenate([cls, events.reshape(b * n, k, dim)], axis=1)
        if self.blocks:
            zero = np.zeros((b * n, 1), np.float32)
            pos_time = np.concatenate(
                [zero, batch["t_rel"].reshape(b * n, k) * np.float32(self.cfg.rope_time_scale)], 1)
            pos_stream = np.concatenate([zero, batch["stream"].reshape(b * n, k).astype(np.float32)], 1)
            angle = np.concatenate([pos_time[..., None] * self.freq_time,
                                    pos_stream[..., None] * self.freq_stream], -1)[:, None]
            cos, sin = np.cos(angle), np.sin(angle)
            keep = np.concatenate([np.ones((b * n, 1), bool), mask], 1)[:, None, None, :]
            for block in self.blocks:
                x = block(x, cos, sin, keep)
            win = x[:, 0]
        else:
            m = mask[..., None].astype(np.float32)
            win = x[:, 0] + (x[:, 1:] * m).sum(1) / np.maximum(m.sum(1), 1.0)
        win = layer_norm(win, *self.norm, LN_EPS).reshape(b, n, dim)
        kv = self.platform[batch["platform"]].reshape(b, self.tokens, dim)
        y = self.cross(layer_norm(win, *self.norm_q, LN_EPS), kv, kv)
        return linear(layer_norm(win + y, *self.proj_norm, LN_EPS), *self.proj)


def sincos_1d(n: int, dim: int) -> np.ndarray:
    """net.sincos_1d: the transformer's sinusoidal positional encoding [n, dim]."""
    pos = np.arange(n, dtype=np.float32)[:, None]
    div = np.exp(np.arange(0, dim, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / dim))
    pe = np.zeros((n, dim), np.float32)
    pe[:, 0::2] = np.sin(pos * div)
    pe[:, 1::2] = np.cos(pos * div)
    return pe


class WindowToWindow:
    """net.WindowToWindow: E_win [B, N, D] -> (fused features [B, N, D], logits [B, N])."""

    def __init__(self, w: Weights, cfg: ModelConfig):
        dim = cfg.D
        self.enabled = not cfg.no_relation
        if self.enabled:
            self.dilations = tuple(cfg.dilations)
            self.convs = [(w(f"local.convs.{i}.weight", (dim, dim, 3)),
                           w(f"local.convs.{i}.bias", (dim,))) for i in range(len(self.dilations))]
            self.local_norm = w.norm("local.norm", dim)
            self.norms = [w.norm(f"globl.norms.{i}", dim) for i in range(cfg.relation_layers)]
            self.attns = [MultiheadAttention(w.sub(f"globl.attns.{i}."), dim, cfg.heads)
                          for i in range(cfg.relation_layers)]
            self.global_norm = w.norm("globl.out", dim)
            self.fuse = (w("fuse.0.weight", (dim, 2 * dim, 1)), w("fuse.0.bias", (dim,)))
        self.ffn_norm = w.norm("ffn.0", dim)
        self.ffn1 = w.linear("ffn.1", dim, dim)
        self.ffn2 = w.linear("ffn.4", dim, 1)

    def __call__(self, win: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.enabled:
            x = win + sincos_1d(win.shape[1], win.shape[2])
            local = sum(conv1d(x, cw, cb, d) for (cw, cb), d in zip(self.convs, self.dilations))
            local = layer_norm(gelu(local), *self.local_norm, LN_EPS)
            g = x
            for norm, attn in zip(self.norms, self.attns):
                h = layer_norm(g, *norm, LN_EPS)
                g = g + attn(h, h, h)
            g = layer_norm(g, *self.global_norm, LN_EPS)
            feat = gelu(conv1d(np.concatenate([local, g], -1), *self.fuse)) + win
        else:
            feat = win
        h = gelu(linear(layer_norm(feat, *self.ffn_norm, LN_EPS), *self.ffn1))
        return feat, linear(h, *self.ffn2)[..., 0]


class InferenceModel:
    """net.TraceAPModel in eval mode: batch (`features.batch_arrays`) -> scores, pattern logits."""

    def __init__(self, cfg: ModelConfig, platforms: list[str], state: dict[str, np.ndarray]):
        cfg = cfg.with_head()   # as net.TraceAPModel (a checkpoint's config names its list)
        if not platforms or platforms[0] != UNKNOWN_PLATFORM:  # as net.TraceAPModel
            platforms = [UNKNOWN_PLATFORM] + [p for p in platforms if p != UNKNOWN_PLATFORM]
        if not cfg.platform_embedding:
            platforms = [UNKNOWN_PLATFORM]
        self.cfg, self.platforms = cfg, list(platforms)
        w = Weights(state)
        self.events = EventEncoder(w.sub("events."), cfg)
        self.windows = WindowEncoder(w.sub("windows."), cfg, len(self.platforms))
        self.relation = WindowToWindow(w.sub("relation."), cfg)
        p = w.sub("patterns.head.")
        self.pattern_norm = p.norm("0", cfg.D)
        self.pattern_hidden = p.linear("1", cfg.D, cfg.D)
        self.pattern_out = p.linear("3", cfg.D, len(cfg.head_patterns))

    def platform_id(self, name: str) -> int:
        """Index of a platform in the table (0 = unknown / unseen)."""
        try:
            return self.platforms.index(name)
        except ValueError:
            return 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """batch -> {"logits", "scores" [B, N], "emb" [B, N, D], "pattern_logits" [B, N, P]}."""
        e_win = self.windows(self.events(batch), batch)
        feat, logits = self.relation(e_win)
        h = gelu(linear(layer_norm(feat, *self.pattern_norm, LN_EPS), *self.pattern_hidden))
        return {"logits": logits, "scores": sigmoid(logits), "emb": e_win,
                "pattern_logits": linear(h, *self.pattern_out)}


__all__ = ["InferenceModel", "sincos_1d"]
