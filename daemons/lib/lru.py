"""A bounded map that forgets its least recently used entries first. No sockets here.

Not thread-safe: one owner uses it, or the owner holds a lock around it.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most *capacity* entries (0: remembers nothing); ``hits`` and ``misses`` count ``get``."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity is at least 0, not {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether *key* is kept (neither counted nor made recent)."""
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value kept for *key* (now the most recently used), or None."""
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: K, value: V) -> None:
        if self.capacity == 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Forget *key*; its value, or None when it was not kept."""
        return self._entries.pop(key, None)
