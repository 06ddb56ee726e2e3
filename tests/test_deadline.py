"""A question's time budget and the broker's wait estimate (daemons.lib.deadline), and the pair cache (daemons.lib.scorecache)."""
from __future__ import annotations

import time

import pytest

from daemons.lib.deadline import MIN_EMBED_MS, MIN_RERANK_MS, RESERVE_MS, Budget, ScoringRate
from daemons.lib.scorecache import ScoreCache, pair_key


def test_no_deadline_leaves_every_stage_its_own_timeout():
    """A budget of 0 is no deadline: nothing is left to count, the embedding keeps its configured timeout and the rerank is never skipped."""
    b = Budget(0)
    assert not b.limited and b.left_ms() is None and not b.spent()
    assert b.embed_timeout_ms(1500) == 1500 and b.rerank_ms() is None


def test_the_budget_counts_from_receipt_and_keeps_a_reserve():
    """Time spent before the question was picked up counts; the rerank gets what is left after the reserve, and nothing when too little is left."""
    now = time.monotonic()
    fresh = Budget(2000, started=now)
    assert fresh.rerank_ms() == pytest.approx(2000 - RESERVE_MS, abs=20)
    assert fresh.embed_timeout_ms(1500) == pytest.approx((2000 - RESERVE_MS) / 2, abs=20)
    late = Budget(2000, started=now - 1.8)
    assert late.rerank_ms() == 0  # 2000 - 1800 - reserve < MIN_RERANK_MS
    assert late.embed_timeout_ms(1500) == MIN_EMBED_MS
    over = Budget(2000, started=now - 3)
    assert over.spent() and over.left_ms() < 0
    assert Budget(RESERVE_MS + MIN_RERANK_MS + 50).rerank_ms() >= MIN_RERANK_MS
    with pytest.raises(ValueError):
        Budget(-1)


def test_the_scoring_rate_predicts_the_queue_and_guesses_nothing_before_it_knows():
    """No estimate before a worker reported; then backlog plus the new work at the mean rate over the workers, plus a start when none is ready."""
    rate = ScoringRate(alpha=0.5)
    assert rate.finish_ms(10_000, 1_000, 2, True) is None
    rate.observe(100.0, 1_000)  # 0.1 ms a character
    assert rate.finish_ms(9_000, 1_000, 2, True) == pytest.approx(500.0)
    rate.observe(300.0, 1_000)  # mean moves half way to 0.3
    assert rate.ms_per_char == pytest.approx(0.2)
    rate.observe_startup(800.0)
    assert rate.finish_ms(0, 1_000, 1, False) == pytest.approx(200.0 + 800.0)
    rate.observe(0.0, 0)  # an empty part teaches nothing
    assert rate.ms_per_char == pytest.approx(0.2)


def test_the_pair_cache_keys_model_question_and_passage_and_forgets_the_oldest():
    """A pair's key changes with any of model, question or passage; the least recently used pair goes first; capacity 0 keeps nothing."""
    keys = {pair_key("m1", "q", "p"), pair_key("m2", "q", "p"), pair_key("m1", "q2", "p"), pair_key("m1", "q", "p2"),
            pair_key("m1", "qp", ""), pair_key("m1", "q", "p\udcff")}
    assert len(keys) == 6
    cache = ScoreCache(2)
    a, b, c = (pair_key("m", "q", x) for x in "abc")
    cache.put(a, 0.1)
    cache.put(b, 0.2)
    assert cache.get(a) == 0.1  # a is now the most recent
    cache.put(c, 0.3)
    assert cache.get(b) is None and cache.get(a) == 0.1 and cache.get(c) == 0.3
    assert len(cache) == 2 and cache.hits == 3 and cache.misses == 1
    assert a in cache and cache.hits == 3  # asking whether it is kept counts nothing
    assert cache.pop(a) == 0.1 and a not in cache and cache.pop(a) is None
    off = ScoreCache(0)
    off.put(a, 0.5)
    assert off.get(a) is None and len(off) == 0
    with pytest.raises(ValueError):
        ScoreCache(-1)
