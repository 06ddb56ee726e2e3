"""Cross-encoder scores remembered by (model, question, passage), so a repeated question costs no rerank.

A passage carries its chunk's path and text, so its digest is the chunk's content hash: an edited
chunk misses and is scored again, an untouched one hits. The cache is bounded (least recently
used entries go first) and holds one 16-byte digest and one float per pair. Not thread-safe: one
owner (the reranker broker's loop) uses it. No sockets here.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict


def pair_key(model_id: str, query: str, passage: str) -> bytes:
    """The cache key of one (query, passage) pair scored by *model_id*."""
    h = hashlib.blake2b(digest_size=16)
    for part in (model_id, query, passage):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


class ScoreCache:
    """At most *capacity* pair scores (0: remembers nothing)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity is at least 0, not {capacity}")
        self.capacity = capacity
        self._scores: OrderedDict[bytes, float] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._scores)

    def get(self, key: bytes) -> float | None:
        score = self._scores.get(key)
        if score is None:
            self.misses += 1
            return None
        self._scores.move_to_end(key)
        self.hits += 1
        return score

    def put(self, key: bytes, score: float) -> None:
        if self.capacity == 0:
            return
        self._scores[key] = float(score)
        self._scores.move_to_end(key)
        while len(self._scores) > self.capacity:
            self._scores.popitem(last=False)
