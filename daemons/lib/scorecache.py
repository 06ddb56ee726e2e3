"""Cross-encoder scores remembered by (model, question, passage), so a repeated question costs no rerank.

A passage carries its chunk's path and text, so its digest is the chunk's content hash: an edited
chunk misses and is scored again, an untouched one hits. The cache is bounded (least recently
used entries go first) and holds one 16-byte digest and one float per pair. Not thread-safe: one
owner (the reranker broker's loop) uses it. No sockets here.
"""
from __future__ import annotations

import hashlib

from daemons.lib.lru import LRU


def pair_key(model_id: str, query: str, passage: str) -> bytes:
    """The cache key of one (query, passage) pair scored by *model_id*."""
    h = hashlib.blake2b(digest_size=16)
    for part in (model_id, query, passage):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


class ScoreCache(LRU[bytes, float]):
    """At most *capacity* pair scores by :func:`pair_key` (0: remembers nothing)."""

    def put(self, key: bytes, score: float) -> None:
        super().put(key, float(score))
