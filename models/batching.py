"""How texts are grouped into the embedder's batches: by padded tokens, not by count.

A batch is padded to its longest text, so its cost is about ``windows x longest tokens``. With
onnxruntime's memory arena off (kept off so that the embedder's RSS follows the work, not its
largest batch ever), every batch allocates its intermediate tensors afresh; the attention scores
of 16 windows of 190 tokens are 28 MB, and at that size the allocation costs more than the int8
matrix products. Sympy 1.7's windows embedded 16 at a time ran at 85 windows/s on 2 cores and at
most 512 padded tokens at a time at 131 (with every onnxruntime fusion, as before), and 16 at a
time with the arena on at 118 (``python -m bench.embedder_speed``, README "Embedding batches and
one fusion").

Contract
--------
``batch_plan(lengths, max_tokens, max_count)`` returns the indices of ``lengths`` in ascending
length order (ties by index), cut into consecutive batches. A batch holds at most ``max_count``
texts, and ``len(batch) * max(lengths of batch) <= max_tokens`` unless it holds a single text
(one longer than the budget goes alone). ``max_tokens <= 0`` means no token bound: batches of
``max_count``. Every index appears exactly once. ``max_count < 1`` raises ``ValueError``.
"""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ["BATCH_MAX", "BATCH_TOKENS", "batch_plan"]

#: Padded tokens per embedding batch (the ``embed_batch_tokens`` setting's default).
BATCH_TOKENS = 512
#: Texts per embedding batch at most, for short texts (the ``embed_batch`` setting's default).
BATCH_MAX = 32


def batch_plan(lengths: Sequence[int], max_tokens: int = BATCH_TOKENS, max_count: int = BATCH_MAX) -> list[list[int]]:
    """Indices of ``lengths`` shortest first, cut into batches (see module doc)."""
    if max_count < 1:
        raise ValueError("max_count must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # ascending order: the newcomer is the batch's longest, so it sets the padded width
        too_wide = max_tokens > 0 and (len(current) + 1) * lengths[i] > max_tokens
        if current and (too_wide or len(current) >= max_count):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
