"""The embedder's batches are bounded by padded tokens (models/batching.py)."""
from __future__ import annotations

import random

import pytest

from models.batching import BATCH_MAX, BATCH_TOKENS, batch_plan


def _flat(plan: list[list[int]]) -> list[int]:
    return [i for batch in plan for i in batch]


def test_every_text_once_shortest_first():
    """Each index appears exactly once, in ascending length order with ties by index."""
    lengths = [5, 3, 9, 3, 1, 7]
    plan = batch_plan(lengths, max_tokens=12, max_count=4)
    assert _flat(plan) == [4, 1, 3, 0, 5, 2]


def test_padded_tokens_stay_within_the_budget():
    """A batch's size times its longest text never passes the token budget."""
    rng = random.Random(7)
    lengths = [rng.randint(1, 256) for _ in range(500)]
    plan = batch_plan(lengths, max_tokens=512, max_count=32)
    assert sorted(_flat(plan)) == list(range(500))
    for batch in plan:
        assert len(batch) * max(lengths[i] for i in batch) <= 512
        assert len(batch) <= 32


def test_a_text_longer_than_the_budget_goes_alone():
    """A text whose own length passes the budget is a batch of one, not an error."""
    plan = batch_plan([600, 10, 700], max_tokens=512, max_count=8)
    assert plan == [[1], [0], [2]]


def test_short_texts_are_capped_by_count():
    """Short texts fill a batch up to the count bound, not the token budget."""
    plan = batch_plan([2] * 70, max_tokens=512, max_count=32)
    assert [len(b) for b in plan] == [32, 32, 6]


def test_no_token_bound_gives_batches_of_the_count():
    """A budget of 0 gives fixed-size batches (the rule before token bounds)."""
    plan = batch_plan([100, 200, 50, 250, 10], max_tokens=0, max_count=2)
    assert plan == [[4, 2], [0, 1], [3]]


def test_empty_input_and_bad_count():
    """No texts give no batches; a count bound under 1 is refused."""
    assert batch_plan([]) == []
    with pytest.raises(ValueError):
        batch_plan([1, 2], max_count=0)


def test_defaults_are_the_settings_defaults():
    """The settings' embed_batch and embed_batch_tokens defaults are this module's numbers."""
    from daemons.lib.config import Settings

    s = Settings()
    assert (s.embed_batch, s.embed_batch_tokens) == (BATCH_MAX, BATCH_TOKENS)
