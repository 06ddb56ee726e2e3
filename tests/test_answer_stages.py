"""The answer's stages after the searches (daemons/lib/pipeline.py), as the front and the benchmarks run them."""
from __future__ import annotations

from daemons.lib import pipeline
from daemons.lib.config import Settings
from daemons.lib.fusion import MENTIONED
from daemons.lib.metrics import files_in_order
from protocol.schema import Candidate

SOURCE = (
    "import time\n"
    "\n"
    "\n"
    "def retry(call, attempts=3):\n"
    "    for i in range(attempts):\n"
    "        try:\n"
    "            return call()\n"
    "        except OSError:\n"
    "            time.sleep(2 ** i)\n"
    "\n"
    "\n"
    "def give_up(reason):\n"
    "    raise RuntimeError(f'gave up after every attempt: {reason}')\n"
)


def cand(path: str, start: int = 1, end: int = 2, text: str = "x = 1", weight: float = 1.0, fused: float = 0.1,
         ranks: dict[str, int] | None = None, role_weight: float | None = None, quotes_question: bool = False) -> Candidate:
    return Candidate(chunk_id=f"{path}|h|{start}", path=path, start_line=start, end_line=end, text=text, fused_score=fused,
                     ranks=ranks or {"keyword": 1}, weight=weight, role_weight=weight if role_weight is None else role_weight,
                     quotes_question=quotes_question)


def test_without_probabilities_every_candidate_is_kept_in_fused_order_at_its_fused_score() -> None:
    """Reranking off or failed: nothing is cut, nothing is a near miss, and no final-order key is set."""
    cands = [cand("a.py", fused=0.3), cand("b.py", fused=0.2)]
    ordered = pipeline.order(cands, None, Settings(), 0.5)
    assert [(c.path, score) for c, score in ordered.kept] == [("a.py", 0.3), ("b.py", 0.2)]
    assert ordered.near == [] and ordered.keys == {} and not ordered.reranked


def test_the_threshold_keeps_named_files_and_the_near_misses_are_the_best_of_the_rest() -> None:
    """Below the threshold only a file the question names stays; the near misses are the next best, at most near_misses."""
    s = Settings(near_misses=1)
    cands = [cand("a.py"), cand("named.py", ranks={MENTIONED: 1}), cand("c.py"), cand("d.py")]
    ordered = pipeline.order(cands, [0.9, 0.01, 0.05, 0.02], s, 0.5)
    assert [c.path for c, _ in ordered.kept] == ["a.py", "named.py"]
    assert [(c.path, p) for c, p in ordered.near] == [("c.py", 0.05)]
    assert set(ordered.keys) == {id(c) for c in cands} and ordered.reranked


def test_the_benchmarks_file_order_is_the_order_the_front_keys_give() -> None:
    """final_files ranks the same files in the same order as the keys of order() with no threshold."""
    s = Settings()
    cands = [cand("a.py", weight=0.1), cand("b.py"), cand("a.py", 3, 4), cand("c.py"), cand("d.py")]
    probs = [0.2, 0.1, 0.95, 0.6, 0.05]
    ordered = pipeline.order(cands, probs, s, 0.0)
    by_key = sorted(range(len(cands)), key=lambda i: (-ordered.keys[id(cands[i])], i))
    assert pipeline.final_files([c.path for c in cands], [p * c.weight for c, p in zip(cands, probs)], s.rerank_fusion_k,
                                s.rerank_fusion_weight) == files_in_order([cands[i].path for i in by_key])


def test_a_hit_is_widened_to_its_function_in_the_current_text_or_kept_as_indexed() -> None:
    """With the file's text a chunk in a function's body grows to the function; without it the indexed chunk stands."""
    c = cand("net.py", 6, 7, text="        try:\n            return call()")
    ordered = pipeline.order([c], [0.8], Settings(), 0.1)
    hit = pipeline.widen_hits(ordered, lambda p: SOURCE, lambda p: "python", 200)[0]
    assert (hit.start_line, hit.end_line) == (4, 9) and hit.text.startswith("def retry(") and hit.score == 0.8
    assert hit.order == ordered.keys[id(c)] and hit.retrievers == ["keyword"]
    unread = pipeline.widen_hits(ordered, lambda p: None, lambda p: "python", 3000)[0]
    assert (unread.start_line, unread.end_line, unread.text) == (6, 7, c.text)


def test_notes_name_question_copies_apart_from_the_role_weights() -> None:
    """A test chunk quoting the question is counted as a copy, and the roles' note shows the test weight alone."""
    s = Settings()
    q = "where is the retry logic?"
    copy = cand("tests/test_cli.py", text=f'ask("{q}")', weight=s.test_weight * s.question_copy_weight,
                role_weight=s.test_weight, quotes_question=True)
    plain = cand("tests/test_net.py", weight=s.test_weight)
    notes = pipeline.notes([copy, plain, cand("net.py")], s, focus=[], changes=[], roles_missing=[], follow_up=False,
                           previous_files=[], answered_files=["net.py"])
    assert notes[0] == f"weighted tests ×{s.test_weight:g}"
    assert notes[1] == f"1 candidate quotes the question ×{s.question_copy_weight:g}"


def test_a_long_question_gives_the_cross_encoder_its_own_blend_and_the_short_blend_is_one_setting_away() -> None:
    """A long question is ordered with rerank_fusion_k_long and rerank_fusion_weight_long (0 and 1: the cross-encoder's best file, fused fourth, climbs from third to second), a short one as before; setting the long pair to the short one gives the short order."""
    s = Settings()
    assert pipeline.blend(s, False) == (s.rerank_fusion_k, s.rerank_fusion_weight) == (60, 0.5)
    assert pipeline.blend(s, True) == (s.rerank_fusion_k_long, s.rerank_fusion_weight_long) == (0, 1.0)
    cands = [cand("a.py"), cand("b.py"), cand("c.py"), cand("d.py")]
    probs = [0.5, 0.1, 0.2, 0.9]

    def files(settings: Settings, long: bool) -> list[str]:
        ordered = pipeline.order(cands, probs, settings, 0.0, long=long)
        return [cands[i].path for i in sorted(range(len(cands)), key=lambda i: (-ordered.keys[id(cands[i])], i))]

    assert files(s, False) == ["a.py", "b.py", "d.py", "c.py"]
    assert files(s, True) == ["a.py", "d.py", "b.py", "c.py"]
    assert pipeline.final_files([c.path for c in cands], probs, *pipeline.blend(s, True)) == files(s, True)
    assert files(Settings(rerank_fusion_k_long=60, rerank_fusion_weight_long=0.5), True) == files(s, False)
