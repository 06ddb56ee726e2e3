"""Window vectors by content (daemons.lib.vectorcache): real SQLite files, a counting embedder."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from daemons.lib.vectorcache import VectorCache, cache_file, window_key


class CountingEmbedder:
    """A deterministic embedder that records every text it was asked to embed."""

    def __init__(self, dim: int = 8) -> None:
        self.dim = dim
        self.asked: list[str] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.asked += texts
        return np.stack([np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(self.dim).astype(np.float32) for t in texts])


def test_a_window_embedded_once_is_never_embedded_again_even_after_reopening(tmp_path: Path):
    """Texts seen before (or earlier in the same call) come back from the cache, bit for bit, in order, also from a new connection; only new texts reach the model."""
    emb = CountingEmbedder()
    cache = VectorCache(tmp_path / "m.sqlite", "model-a", emb.dim, max_rows=100)
    first, cached = cache.embed(["a", "b", "a"], emb)
    assert cached == 1 and emb.asked == ["a", "b"]  # a text repeated in one call is embedded once
    assert np.array_equal(first[0], first[2])
    cache.close()
    again = VectorCache(tmp_path / "m.sqlite", "model-a", emb.dim, max_rows=100)
    emb.asked.clear()
    second, cached = again.embed(["b", "c", "a"], emb)
    assert cached == 2 and emb.asked == ["c"]
    assert np.array_equal(second[0], first[1]) and np.array_equal(second[2], first[0])
    assert again.rows == 3


def test_another_model_or_dimension_never_gets_these_vectors(tmp_path: Path):
    """Keys include the model id, and an entry of the wrong size counts as absent."""
    assert window_key("m1", "x") != window_key("m2", "x") and window_key("m1", "x") == window_key("m1", "x")
    emb = CountingEmbedder(8)
    VectorCache(tmp_path / "c.sqlite", "m1", 8, 100).embed(["x"], emb)
    other = CountingEmbedder(8)
    _, cached = VectorCache(tmp_path / "c.sqlite", "m2", 8, 100).embed(["x"], other)
    assert cached == 0 and other.asked == ["x"]
    wide = CountingEmbedder(16)
    cache = VectorCache(tmp_path / "c.sqlite", "m1", 16, 100)
    assert cache.get_many(cache.keys(["x"])) == {}
    vecs, cached = cache.embed(["x"], wide)
    assert cached == 0 and wide.asked == ["x"] and vecs[0].shape == (16,)
    assert cache_file("/d", "minilm-l6-v2-int8@abc/def") == Path("/d/vectors/minilm-l6-v2-int8_abc_def.sqlite")


def test_the_cache_keeps_at_most_max_rows_dropping_the_oldest(tmp_path: Path):
    """Past max_rows the first inserted go; zero rows keeps nothing; a thousand keys are looked up past SQLite's parameter chunks."""
    emb = CountingEmbedder()
    cache = VectorCache(tmp_path / "m.sqlite", "m", emb.dim, max_rows=3)
    cache.embed(["1", "2", "3", "4", "5"], emb)
    assert cache.rows == 3
    held = cache.get_many(cache.keys(["1", "2", "3", "4", "5"]))
    assert set(held) == set(cache.keys(["3", "4", "5"]))
    off = VectorCache(tmp_path / "off.sqlite", "m", emb.dim, max_rows=0)
    off.embed(["1"], emb)
    assert off.rows == 0
    big = VectorCache(tmp_path / "big.sqlite", "m", emb.dim, max_rows=10_000)
    texts = [f"window {i}" for i in range(1200)]
    big.embed(texts, emb)
    emb.asked.clear()
    _, cached = big.embed(texts, emb)
    assert cached == 1200 and emb.asked == []


def test_a_damaged_cache_file_raises_a_sqlite_error(tmp_path: Path):
    """A cache file that is not a database fails with sqlite3.Error, which the embedder catches to go on without it."""
    path = tmp_path / "m.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(sqlite3.Error):
        VectorCache(path, "m", 8, 10).embed(["new text"], CountingEmbedder())
