"""Question copies (daemons/lib/echoes.py): chunks that hold the question itself as a string literal."""
from __future__ import annotations

import numpy as np
import pytest

from daemons.lib.echoes import copy_key, quotes_question
from daemons.lib.search import SearchParams, hybrid_search
from daemons.lib.store import IndexStore
from tests.support import index_row

Q = "where is the retry logic?"


def test_a_short_question_has_no_copy_key_and_a_longer_one_is_its_lowered_words() -> None:
    """Fewer than three words make no key (a name is what definitions hold); punctuation and case go."""
    assert copy_key("retry_logic") == "" and copy_key("retry logic") == ""
    assert copy_key("  Where is the RETRY logic?? ") == "where is the retry logic"


def test_sample_questions_in_lists_calls_and_commands_are_copies() -> None:
    """A question list, a test that asks it, a README command and a JS template literal all quote the question."""
    key = copy_key(Q)
    assert quotes_question('GENERIC = [\n    "where is the retry logic?",\n    "how are sessions closed?",\n]', key)
    assert quotes_question("reply = client.ask('Where is the retry logic?', workspace=ws)", key)
    assert quotes_question('wsctx up && wsctx ask "where is the retry logic?"', key)
    assert quotes_question("const q = `where is the retry logic`;", key)
    assert quotes_question('ask("Q: where is the retry logic?")', key)  # a short prefix


def test_code_that_states_the_question_in_its_own_words_is_not_a_copy() -> None:
    """A docstring, a comment, a longer message and a literal holding other words are not copies."""
    key = copy_key(Q)
    assert not quotes_question('def retry():\n    """Where is the retry logic? Here: it backs off."""\n', key)
    assert not quotes_question('"""where is the retry logic"""', key)
    assert not quotes_question("# where is the retry logic? in this function\n", key)
    assert not quotes_question('log("the caller asked where is the retry logic when the session closed and nobody answered")', key)
    assert not quotes_question('x = "somewhere is the retry logic"', key)  # a word's tail is not the word
    assert not quotes_question('x = "where is the retry logic"', "")


@pytest.mark.timeout(120)
def test_the_search_weighs_a_chunk_quoting_the_question_below_the_code_that_answers_it(tmp_path) -> None:
    """With the copy weight below 1 the retry code outranks a question list that matches every search better."""
    dim = 8
    rng = np.random.default_rng(3)
    s = IndexStore.open_writer(tmp_path / "ix", {"model_id": "m@1", "dim": dim, "chunker_version": "1", "chunk_max_chars": 1000})
    qv = rng.standard_normal(dim)
    copy_text = 'QUESTIONS = ["where is the retry logic?", "retry logic where"]'
    s.replace_file("bench/questions.py", [index_row("bench/questions.py", 0, copy_text, qv + 0.01 * rng.standard_normal(dim))])
    s.replace_file("src/net.py", [index_row("src/net.py", 0, "def send(): retry with backoff logic", qv + 0.5 * rng.standard_normal(dim))])
    for k in range(4):
        s.replace_file(f"src/other{k}.py", [index_row(f"src/other{k}.py", 0, f"filler{k} words", rng.standard_normal(dim))])
    vec = (qv / np.linalg.norm(qv)).astype(np.float32)
    plain = hybrid_search(s, "retry logic", vec, params=SearchParams(copy_key=copy_key(Q), copy_weight=1.0))
    assert plain.candidates[0]["path"] == "bench/questions.py"
    weighed = hybrid_search(s, "retry logic", vec, params=SearchParams(copy_key=copy_key(Q), copy_weight=0.25))
    assert [c["path"] for c in weighed.candidates[:2]] == ["src/net.py", "bench/questions.py"]
    assert weighed.candidates[1]["weight"] == pytest.approx(0.25) and weighed.candidates[0]["weight"] == 1.0
    # the copy is marked, with its role weight apart, so the context line need not find it again
    assert weighed.candidates[1]["quotes_question"] and weighed.candidates[1]["role_weight"] == 1.0
    assert not weighed.candidates[0]["quotes_question"]
