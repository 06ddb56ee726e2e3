"""Question copies: code that holds the question itself as a string literal (issue 22).

A workspace that talks about questions keeps sample ones: a benchmark's list of questions, a
test that asks one, a README's example command. Asked that very question, such a chunk matches
every search best (the vector of a near copy, every keyword) although it only quotes the question;
the code that answers it matches less well. A quoted copy is almost never the answer, so the
searcher weighs it down like a file role the question did not ask for (setting
``question_copy_weight``).

Contract
--------
* ``copy_key(question)`` is the question's words, lower-cased and joined by single spaces, when it
  has at least ``MIN_WORDS`` words; "" otherwise (a name or a short phrase is what definitions hold,
  not a copy of a question).
* ``quotes_question(text, key)`` is true when some string literal of *text* on one line (in
  ``"…"``, ``'…'`` or backticks, not a triple-quoted docstring) has the words of *key*, and those
  words are at least ``MIN_SHARE`` of the literal's words: the question itself, or the question
  with a short prefix or suffix such as ``"Q: …"``. A docstring or comment that states what a
  function does in the question's words is not a copy, since that is often the answer.
"""
from __future__ import annotations

import re

__all__ = ["MIN_SHARE", "MIN_WORDS", "QUESTION_COPY_WEIGHT", "copy_key", "quotes_question"]

#: A question of fewer words has no copy key.
MIN_WORDS = 3
#: The question's words are at least this share of a literal that copies it.
MIN_SHARE = 0.6
#: The RRF multiplier of a chunk that quotes the question (settings ``question_copy_weight``;
#: SPEC §2 has none: 1.0).
QUESTION_COPY_WEIGHT = 0.25

_WORD_RE = re.compile(r"[^\W_]+")
# a literal on one line; the look-arounds keep the inside of '"""…"""' and "'''…'''" out
_LITERAL_RE = re.compile(
    r'(?<!["\\])"((?:[^"\\\n]|\\.){8,})"(?!")'
    r"|(?<![\w'\\])'((?:[^'\\\n]|\\.){8,})'(?!')"
    r"|(?<![`\\])`((?:[^`\\\n]|\\.){8,})`(?!`)"
)


def _words(text: str) -> str:
    return " ".join(_WORD_RE.findall(text.lower()))


def copy_key(question: str) -> str:
    """The words of *question* as ``quotes_question`` compares them, or "" for a question too
    short to be told from a name."""
    key = _words(question)
    return key if key.count(" ") + 1 >= MIN_WORDS else ""


def quotes_question(text: str, key: str) -> bool:
    """Whether *text* holds a string literal that copies the question whose ``copy_key`` is *key*."""
    if not key:
        return False
    # cheap test first: most chunks do not hold the question's first word at all
    first = key.split(" ", 1)[0]
    if first not in text.lower():
        return False
    for m in _LITERAL_RE.finditer(text):
        inside = _words(m.group(1) or m.group(2) or m.group(3))
        if f" {key} " in f" {inside} " and len(key) >= MIN_SHARE * len(inside):
            return True
    return False
