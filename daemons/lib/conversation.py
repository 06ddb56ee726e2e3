"""Follow-up detection and per-conversation memory (SPEC §2 "Follow-ups").

A question with fewer than two content words, or fewer than three content words
and a pronoun, is a follow-up: the previous question of the same conversation
(as it was searched) is put in front of it before anything else happens. The
files the previous answer used are remembered for the focus files.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

#: A question with fewer content words than this is always a follow-up.
FOLLOW_UP_MIN_WORDS = 2
#: A question with fewer content words than this *and* a pronoun is a follow-up.
FOLLOW_UP_PRONOUN_MIN_WORDS = 3
#: How many conversations are remembered (least recently used are forgotten).
MAX_CONVERSATIONS = 1000

#: Words that refer back to something said before.
PRONOUNS: frozenset[str] = frozenset(
    {
        "it", "its", "itself", "this", "that", "these", "those", "they", "them",
        "their", "theirs", "themselves", "there", "he", "him", "his", "she",
        "her", "hers", "one", "ones", "same", "former", "latter",
    }
)

try:  # the shared stop-word and pronoun lists, when the keywords module is present
    from daemons.lib import keywords as _keywords
except Exception:  # pragma: no cover - only while keywords.py is missing
    _keywords = None  # type: ignore[assignment]
else:
    PRONOUNS = PRONOUNS | frozenset(getattr(_keywords, "PRONOUNS", frozenset()))

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_']*")

# Used only while daemons.lib.keywords is unavailable.
_FALLBACK_STOP_WORDS: frozenset[str] = frozenset(
    """a about above after again against all am an and any are as at be because
    been before being below between both but by can could did do does doing done
    down during each else few for from further get got had has have having here
    how i if in into is just like me more most my no nor not now of off on once
    only or other our out over own please s show should so some such t tell than
    the then to too under until up very was we were what when where which while
    who whom why will with would you your find look explain work works""".split()
)


def _content_words(question: str) -> list[str]:
    """Content words of *question* via ``daemons.lib.keywords`` when present, else a local fallback."""
    content_words = getattr(_keywords, "content_words", None)
    if content_words is not None:
        return list(content_words(question))
    words = [w.strip("'").lower() for w in _WORD.findall(question)]
    return [w for w in words if w and w not in _FALLBACK_STOP_WORDS]


def _raw_words(question: str) -> list[str]:
    """Lower-cased word tokens of *question*, apostrophes stripped."""
    return [w.strip("'").lower() for w in _WORD.findall(question)]


def is_follow_up(question: str) -> bool:
    """True when *question* has < 2 content words, or < 3 content words and a pronoun.

    Pronouns never count as content words (whatever the stop-word list says),
    and each content word counts once.
    """
    content = {w for w in _content_words(question) if w.lower() not in PRONOUNS}
    if len(content) < FOLLOW_UP_MIN_WORDS:
        return True
    has_pronoun = any(w in PRONOUNS for w in _raw_words(question))
    return len(content) < FOLLOW_UP_PRONOUN_MIN_WORDS and has_pronoun


@dataclass
class _State:
    """What is remembered of one conversation."""

    question: str = ""
    files: list[str] = field(default_factory=list)


class Conversations:
    """Thread-safe, LRU-capped in-memory state of conversations.

    Contract: ``effective_question`` never mutates state except LRU order;
    ``remember`` stores the question as it was searched and the files the
    answer used. A ``None`` or empty conversation id has no memory.
    """

    def __init__(self, max_conversations: int = MAX_CONVERSATIONS) -> None:
        """Create an empty store keeping at most *max_conversations* conversations."""
        if max_conversations < 1:
            raise ValueError("max_conversations must be >= 1")
        self._max = max_conversations
        self._states: OrderedDict[str, _State] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Number of conversations currently remembered."""
        with self._lock:
            return len(self._states)

    def _get(self, conv_id: str | None) -> _State | None:
        """Return the state of *conv_id* and mark it recently used (lock held by caller)."""
        if not conv_id:
            return None
        state = self._states.get(conv_id)
        if state is not None:
            self._states.move_to_end(conv_id)
        return state

    def effective_question(self, conv_id: str | None, question: str, max_chars: int | None = None) -> tuple[str, bool]:
        """Return ``(searched_question, was_follow_up)``.

        For a follow-up with a previous question in the same conversation the
        searched question is ``"<previous searched question> <question>"``;
        otherwise it is *question* unchanged (``was_follow_up`` is then False
        even for a short question, since nothing was put in front of it).
        With *max_chars*, a follow-up's searched question is at most that long, as
        a question is, so a chain of follow-ups never grows without bound: the
        previous one keeps its start (what the conversation is about), at least
        half the cap when it is that long, and the follow-up gets the rest.
        """
        question = question.strip()
        with self._lock:
            state = self._get(conv_id)
            previous = state.question if state else ""
        if previous and is_follow_up(question):
            if max_chars is not None and len(previous) + 1 + len(question) > max_chars:
                keep = max(max_chars - len(question) - 1, min(len(previous), max_chars // 2))
                previous = previous[:keep].rstrip()
                question = question[: max(0, max_chars - len(previous) - 1)].rstrip()
            return f"{previous} {question}".strip(), True
        return question, False

    def remember(self, conv_id: str | None, searched_question: str, files: list[str]) -> None:
        """Store the searched question and the files its answer used (deduplicated, in order)."""
        if not conv_id:
            return
        unique = list(dict.fromkeys(f for f in files if f))
        with self._lock:
            self._states[conv_id] = _State(searched_question.strip(), unique)
            self._states.move_to_end(conv_id)
            while len(self._states) > self._max:
                self._states.popitem(last=False)

    def previous_files(self, conv_id: str | None) -> list[str]:
        """Files the previous answer of *conv_id* used (empty when unknown)."""
        with self._lock:
            state = self._get(conv_id)
            return list(state.files) if state else []

    def forget(self, conv_id: str) -> None:
        """Drop everything remembered of *conv_id*."""
        with self._lock:
            self._states.pop(conv_id, None)
