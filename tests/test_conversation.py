"""Tests for daemons.lib.conversation (SPEC §2 Follow-ups)."""

import threading

from daemons.lib.conversation import (
    FOLLOW_UP_MIN_WORDS,
    FOLLOW_UP_PRONOUN_MIN_WORDS,
    MAX_CONVERSATIONS,
    PRONOUNS,
    Conversations,
    is_follow_up,
)


def test_thresholds_are_spec_defaults():
    """The follow-up thresholds are two content words, and three with a pronoun."""
    assert FOLLOW_UP_MIN_WORDS == 2
    assert FOLLOW_UP_PRONOUN_MIN_WORDS == 3
    assert {"it", "this", "that", "they", "them", "those", "these", "its", "their"} <= PRONOUNS


def test_fewer_than_two_content_words_is_follow_up():
    """A question with one content word is a follow-up, even without a pronoun."""
    assert is_follow_up("and the tests?")
    assert is_follow_up("why?")
    assert is_follow_up("")


def test_two_content_words_without_pronoun_is_not_follow_up():
    """Two content words and no pronoun make a standalone question."""
    assert not is_follow_up("where is the retry logic?")


def test_two_content_words_with_pronoun_is_follow_up():
    """Fewer than three content words plus a pronoun make a follow-up."""
    assert is_follow_up("and how is it tested?")
    assert is_follow_up("what about its retry timeout?")


def test_three_content_words_with_pronoun_is_not_follow_up():
    """Three content words are enough even with a pronoun."""
    assert not is_follow_up("where does this parse config files?")


def test_effective_question_puts_previous_in_front():
    """A follow-up gets the previous searched question put in front of it."""
    conv = Conversations()
    assert conv.effective_question("c1", "where is the retry logic?") == ("where is the retry logic?", False)
    conv.remember("c1", "where is the retry logic?", ["a.py", "b.py", "a.py"])
    searched, follow = conv.effective_question("c1", "and how is it tested?")
    assert follow is True
    assert searched == "where is the retry logic? and how is it tested?"
    assert conv.previous_files("c1") == ["a.py", "b.py"]


def test_follow_up_without_history_or_in_other_conversation_is_unchanged():
    """Only the same conversation's previous question is used."""
    conv = Conversations()
    conv.remember("c1", "where is the retry logic?", ["a.py"])
    assert conv.effective_question("c2", "and it?") == ("and it?", False)
    assert conv.effective_question(None, "and it?") == ("and it?", False)
    assert conv.previous_files("c2") == []


def test_standalone_question_is_not_prefixed():
    """A question that is not a follow-up is searched as asked."""
    conv = Conversations()
    conv.remember("c1", "retry logic", [])
    assert conv.effective_question("c1", "how is the config parsed?") == ("how is the config parsed?", False)


def test_lru_cap_forgets_least_recently_used():
    """The store keeps at most its cap, evicting the least recently used conversation."""
    assert MAX_CONVERSATIONS == 1000
    conv = Conversations(max_conversations=2)
    conv.remember("a", "qa", ["a.py"])
    conv.remember("b", "qb", ["b.py"])
    conv.previous_files("a")  # touch a
    conv.remember("c", "qc", ["c.py"])
    assert len(conv) == 2
    assert conv.previous_files("b") == []
    assert conv.previous_files("a") == ["a.py"]


def test_thread_safety_under_concurrent_use():
    """Concurrent remember/read calls neither fail nor exceed the cap."""
    conv = Conversations(max_conversations=50)
    errors = []

    def work(n):
        try:
            for i in range(200):
                cid = f"{n}-{i % 80}"
                conv.remember(cid, "q", ["f.py"])
                conv.effective_question(cid, "and it?")
                conv.previous_files(cid)
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(conv) <= 50


def test_a_chain_of_long_follow_ups_stays_within_the_cap():
    """Eleven pronoun-only follow-ups of 99,999 characters give a searched question no longer than the cap, starting with the first question."""
    conv = Conversations()
    conv.remember("c", "how does the retry loop back off?", [])
    for _ in range(11):
        searched, follow_up = conv.effective_question("c", "it " * 33_333, max_chars=100_000)
        assert follow_up and len(searched) <= 100_000
        assert searched.startswith("how does the retry loop back off?")
        conv.remember("c", searched, [])
    short, _ = conv.effective_question("c", "and that?", max_chars=100_000)
    assert short.endswith("and that?") and len(short) <= 100_000
