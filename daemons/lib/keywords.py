"""Keyword text for the BM25 column and the keyword query (SPEC sections 1 and 2).

Contract
--------
* ``split_identifier`` splits on underscores, case changes (``camelCase``, ``PascalCase``),
  acronym ends (``HTTPServer`` -> ``http server``) and letter/digit boundaries
  (``parseJSON2Html`` -> ``parse json 2 html``); parts are lower case, never empty.
* ``keyword_text(code, path)`` is, for every identifier in ``code`` in order of appearance, the
  identifier lowercased and whole, followed by its parts when it has more than one part (or when
  its one part differs from the whole, e.g. ``_private`` -> ``_private private``).  **Repeats are
  kept** because term frequency matters to BM25, but each output token is capped at
  ``MAX_TOKEN_REPEATS`` (8) occurrences so a generated table cannot drown a chunk.  Then the words
  of ``path`` (split on ``/``, ``.``, ``-`` and anything else not an identifier character) are
  appended once each, the same way: ``src/auth/tokenStore.ts`` -> ``src auth tokenstore token
  store ts``.  Language keywords are identifiers too and are kept (the SPEC says every
  identifier); they are never in a query unless quoted as code, so they only add length.
* ``file_keyword_text(chunk_texts, path)`` is the same for a whole file (its chunks' texts in
  order) with no repeat cap: one document per file for the whole-file BM25 list.
* ``query_keywords(question)`` treats the question like code: identifiers (dotted names such as
  ``os.path.join`` fall apart on the dots) lowercased whole, plus their parts; stop words dropped
  (whole words and parts) unless the word is code-like (contains ``_`` or a digit, has several
  parts, or sits in backticks: ``is_code_like``); deduplicated in order of first appearance.
  ``query_terms(question)`` is the same terms with repeats.
* ``content_words(question)`` is the non-stop words, lowercased, deduplicated in order; the
  follow-up rule counts them.  ``PRONOUNS`` is the pronoun set that rule uses.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection

__all__ = [
    "MAX_TOKEN_REPEATS",
    "PRONOUNS",
    "STOP_WORDS",
    "content_words",
    "file_keyword_text",
    "identifiers",
    "is_code_like",
    "keyword_text",
    "query_keywords",
    "query_terms",
    "split_identifier",
]

#: Each token appears at most this many times in a chunk's keyword text.
MAX_TOKEN_REPEATS = 8

# Letters (any script) or underscore, then word characters.
_IDENT_RE = re.compile(r"[^\W\d]\w*")
_BACKTICK_RE = re.compile(r"`([^`]*)`")

PRONOUNS: frozenset[str] = frozenset(
    "it its itself this that these those they them their theirs he him his she her hers "
    "one ones there here".split()
)

# English stop words, question words and conversational filler.  Words that are common code
# identifiers (file, function, class, type, test, error, value, name, data, list, map, set,
# get, run, call, return, import, config, new, use...) are deliberately NOT here.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a about above after again against all almost also am an and any anyone anything are aren
    around as at be because been before being below between both but by can cannot could couldn
    did didn do does doesn doing don done down during each either else ever every few for from
    further had hadn has hasn have haven having he her here hers herself him himself his how i
    if in into is isn it its itself just let lets ll me might mine more most much must mustn my
    myself need needs no nor not now of off often on once only or other others our ours
    ourselves out over own per please quite rather re really same shall shan she should shouldn
    so some somehow something somewhere such than that the their theirs them themselves then
    there these they thing things this those though through thus to too under until up upon us
    ve very via was wasn we were weren what whatever when whenever where whereas wherever whether
    which while who whom whose why will with within without won would wouldn yet you your yours
    yourself yourselves s t d m o y
    hi hello hey thanks thank pls kindly
    show tell explain find look see know want wanna trying try happen happens happening
    exactly actually basically stuff okay ok
    """.split()
) | PRONOUNS


def _char_class(c: str) -> int:
    """0 = digit, 1 = upper-case letter, 2 = other letter (lower or caseless)."""
    if c.isdigit():
        return 0
    if c.isupper():
        return 1
    return 2


def split_identifier(ident: str) -> list[str]:
    """Split an identifier into lower-case parts.

    ``fetchModelEmbedding`` -> ``['fetch', 'model', 'embedding']``; ``MAX_FILE_BYTES`` ->
    ``['max', 'file', 'bytes']``; ``HTTPServer`` -> ``['http', 'server']``; ``parseJSON2Html``
    -> ``['parse', 'json', '2', 'html']``; ``getURLs`` -> ``['get', 'urls']``.  Non-word characters act like underscores.  Returns
    ``[]`` when there is nothing alphanumeric.
    """
    parts: list[str] = []
    for word in re.split(r"[\W_]+", ident):
        if not word:
            continue
        start = 0
        n = len(word)
        for i in range(1, n):
            prev, cur = _char_class(word[i - 1]), _char_class(word[i])
            boundary = False
            if (prev == 0) != (cur == 0):
                boundary = True  # letter <-> digit
            elif prev == 2 and cur == 1:
                boundary = True  # camel hump: fooBar
            elif prev == 1 and cur == 1 and i + 1 < n and _char_class(word[i + 1]) == 2:
                # End of an acronym: HTTPServer -> HTTP|Server, but a plural acronym stays
                # whole: getURLs -> get|URLs.
                plural = word[i + 1] == "s" and (i + 2 == n or _char_class(word[i + 2]) != 2)
                boundary = not plural
            if boundary:
                parts.append(word[start:i].lower())
                start = i
        parts.append(word[start:].lower())
    return [p for p in parts if p]


def identifiers(text: str) -> list[str]:
    """All identifier-like words of ``text`` in order (letter or ``_`` first, then word chars;
    any script).  Words made only of underscores are skipped."""
    return [m for m in _IDENT_RE.findall(text) if m.strip("_")]


def _expand(ident: str) -> list[str]:
    """The identifier lowercased and whole, then its parts when they say something more."""
    whole = ident.lower()
    parts = split_identifier(ident)
    if len(parts) > 1 or (len(parts) == 1 and parts[0] != whole):
        return [whole, *parts]
    return [whole]


def keyword_text(code: str, path: str, max_repeats: int | None = MAX_TOKEN_REPEATS) -> str:
    """The BM25 keyword column for one chunk: see the module docstring for the contract.

    ``max_repeats`` None keeps every repeat (the whole-file column, ``file_keyword_text``)."""
    counts: Counter[str] = Counter()
    out: list[str] = []
    for ident in identifiers(code):
        for tok in _expand(ident):
            if max_repeats is None or counts[tok] < max_repeats:
                counts[tok] += 1
                out.append(tok)
    seen: set[str] = set()
    for ident in identifiers(path.replace("\\", "/")):
        for tok in _expand(ident):
            if tok not in seen:
                seen.add(tok)
                out.append(tok)
    return " ".join(out)


def file_keyword_text(chunk_texts: list[str], path: str) -> str:
    """The whole-file BM25 column: ``keyword_text`` of the file's chunk texts joined in order
    (they cover every non-blank line once, so this is the file), with no repeat cap, since
    across a whole file term frequency is the evidence and BM25 saturates it anyway."""
    return keyword_text("\n".join(chunk_texts), path, max_repeats=None)


def is_code_like(ident: str, quoted: Collection[str] = ()) -> bool:
    """Whether *ident* reads as code: it contains ``_`` (not only at its ends) or a digit, has
    several parts, or is among *quoted* (identifiers written as code, e.g. in backticks)."""
    return (
        ident in quoted
        or "_" in ident.strip("_")
        or any(c.isdigit() for c in ident)
        or len(split_identifier(ident)) > 1
    )


def query_terms(question: str, quoted: Collection[str] | None = None) -> list[str]:
    """The terms of ``query_keywords``, with repeats, in order of appearance. *quoted* are the
    identifiers written as code (default: those inside backticks anywhere in *question*)."""
    if quoted is None:
        quoted = {i for m in _BACKTICK_RE.finditer(question) for i in identifiers(m.group(1))}
    out: list[str] = []
    for ident in identifiers(question):
        if not is_code_like(ident, quoted) and ident.lower() in STOP_WORDS:
            continue
        # a part like "is" of isValid adds nothing
        out.extend(tok for i, tok in enumerate(_expand(ident)) if i == 0 or tok not in STOP_WORDS)
    return out


def query_keywords(question: str) -> str:
    """The BM25 query for a question: see the module docstring for the contract."""
    return " ".join(dict.fromkeys(query_terms(question)))


def content_words(question: str) -> list[str]:
    """Non-stop words of ``question``, lowercased, deduplicated in order of first appearance."""
    out: list[str] = []
    seen: set[str] = set()
    for ident in identifiers(question):
        w = ident.lower()
        if w in STOP_WORDS or w in seen:
            continue
        seen.add(w)
        out.append(w)
    return out
