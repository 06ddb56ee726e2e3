"""Tests for daemons.lib.fusion (SPEC §1 Windows, §2 Four searches and Fusion)."""

import pytest

from daemons.lib.fusion import FOCUS_K, KEYWORD_K, RERANK_TOP, RRF_K, VECTOR_K, Fused, fold_windows, rrf


def test_defaults_match_spec():
    """k is 60, the reranker gets 12, the searches take 20, 20 and 6 rows."""
    assert (RRF_K, RERANK_TOP, VECTOR_K, KEYWORD_K, FOCUS_K) == (60, 12, 20, 20, 6)


def test_rrf_arithmetic_k60():
    """Each list gives each member 1/(60 + rank), ranks 1-based."""
    out = rrf({"vector": ["a", "b"], "keyword": ["b"]})
    by_id = {f.id: f for f in out}
    assert by_id["a"].score == pytest.approx(1 / 61)
    assert by_id["b"].score == pytest.approx(1 / 62 + 1 / 61)
    assert by_id["b"].ranks == {"vector": 2, "keyword": 1}
    assert [f.id for f in out] == ["b", "a"]


def test_high_in_both_beats_top_of_one():
    """A chunk ranked 3rd in both lists beats the top of only one list."""
    vector = ["solo", "x1", "both"]
    keyword = ["x2", "x3", "both"]
    out = rrf({"vector": vector, "keyword": keyword})
    assert out[0].id == "both"
    assert 2 / 63 > 1 / 61


def test_focus_lists_weigh_files_up():
    """A focus hit adds its own term, lifting a chunk otherwise ranked lower."""
    out = rrf({"vector": ["a", "b"], "focus_vector": ["b"]})
    assert out[0].id == "b"


def test_ties_are_deterministic():
    """Equal scores are ordered by best rank then id."""
    out = rrf({"vector": ["b", "a"], "keyword": ["a", "b"], "other": ["z"]})
    assert [f.id for f in out][:2] == ["a", "b"]
    assert out[2].id == "z"
    out2 = rrf({"keyword": ["a", "b"], "vector": ["b", "a"], "other": ["z"]})
    assert [f.id for f in out2] == [f.id for f in out]


def test_fused_unpacks_as_tuple_and_k_is_a_parameter():
    """Fused is (id, score, ranks) and k can be changed; repeats in one list count once."""
    (cid, score, ranks), = rrf({"v": ["a", "a"]}, k=10)
    assert isinstance(rrf({"v": ["a"]})[0], Fused)
    assert (cid, ranks) == ("a", {"v": 1}) and score == pytest.approx(1 / 11)


def test_empty_lists():
    """Empty vector lists (embedder down) leave the keyword lists to decide."""
    out = rrf({"vector": [], "focus_vector": [], "keyword": ["k1", "k2"], "focus_keyword": []})
    assert [f.id for f in out] == ["k1", "k2"]


def test_fold_windows_keeps_nearest_window_rank():
    """Rows fold to one per chunk, at the rank of its nearest window, order preserved."""
    rows = [
        {"chunk_id": "a", "window": 2, "_distance": 0.1},
        {"chunk_id": "b", "window": 0, "_distance": 0.2},
        {"chunk_id": "a", "window": 0, "_distance": 0.3},
        {"chunk_id": "c", "window": 1, "_distance": 0.4},
        {"chunk_id": "b", "window": 1, "_distance": 0.5},
    ]
    out = fold_windows(rows)
    assert [(r["chunk_id"], r["window"]) for r in out] == [("a", 2), ("b", 0), ("c", 1)]
    assert fold_windows(rows, limit=2)[-1]["chunk_id"] == "b"


def test_fold_windows_unsorted_input_uses_distance():
    """When rows come unsorted, the nearest window decides both row and position."""
    rows = [
        {"chunk_id": "a", "window": 0, "_distance": 0.9},
        {"chunk_id": "b", "window": 0, "_distance": 0.5},
        {"chunk_id": "a", "window": 1, "_distance": 0.1},
    ]
    out = fold_windows(rows)
    assert [(r["chunk_id"], r["window"]) for r in out] == [("a", 1), ("b", 0)]
