"""Files that define what a question names: the ``defined`` list of ``hybrid_search`` (issue 19).

A commit message or an issue names the functions, classes and exceptions it is about
(``wait_random_exponential``, ```FileHandler```, ``RetryError``). BM25 ranks every chunk that
uses such a name; the file that *defines* it is usually the one to change. So each identifier of
the question's analysis (``question.Analysis.identifiers``: traceback functions, the error's
name, code-like names) is looked up in the keyword index, and the chunks whose text defines it
(``def``, ``class``, ``function``, ``fn``, ``func``, ``type``, ``const`` ... at a line's start)
make a file-ranked list.

Contract
--------
* ``defines(text, identifier)`` is whether *text* has a line that defines *identifier*: optional
  indentation and modifiers (``export``, ``default``, ``pub``/``pub(crate)``, ``async``,
  ``static``), a definition keyword of Python, JavaScript/TypeScript, Go or Rust, a Go method's
  receiver, then the identifier as a whole word.
* ``identifier_query(identifier)`` is the keyword query that finds its chunks: its parts, lower
  case (the keyword column holds identifiers split the same way).
* ``defined_files(hits, limit)`` takes, for each identifier in the question's order, the chunk
  rows its keyword search returned, and returns one row per file (a copy of the first row in it
  that defines one of them), in order of the identifiers and then of the rows, at most *limit*.
  An identifier defined in more than ``MAX_AMBIGUOUS`` files (``__init__``, ``run``, ``get``)
  names nothing.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from daemons.lib.keywords import split_identifier

__all__ = ["DEFINED_MAX", "DEFINITION_ROWS", "IDENTIFIERS_MAX", "MAX_AMBIGUOUS", "defined_files", "defines", "identifier_query"]

#: At most this many of the question's identifiers are looked up (the analysis puts the error's
#: and the traceback's first).
IDENTIFIERS_MAX = 8
#: Keyword hits read per identifier when looking for its definition.
DEFINITION_ROWS = 20
#: An identifier defined in more files than this is too common to point at one.
MAX_AMBIGUOUS = 3
#: At most this many defining files enter fusion.
DEFINED_MAX = 10

_MODIFIERS = r"(?:(?:export|default|pub(?:\([^)\n]*\))?|async|static|abstract|public|private|protected|final)\s+)*"
_KEYWORDS = r"(?:def|class|function\*?|fn|func(?:\s*\([^)\n]*\))?|struct|enum|interface|type|trait|const|let|var)"


@lru_cache(maxsize=1024)
def _definition_re(identifier: str) -> re.Pattern[str]:
    return re.compile(rf"^[ \t]*{_MODIFIERS}{_KEYWORDS}\s+{re.escape(identifier)}(?!\w)", re.MULTILINE)


def defines(text: str, identifier: str) -> bool:
    """Whether *text* has a line defining *identifier* (see the module's contract)."""
    return identifier in text and _definition_re(identifier).search(text) is not None


def identifier_query(identifier: str) -> str:
    """The keyword query for one identifier: its parts, lower case, space-separated."""
    return " ".join(split_identifier(identifier))


def defined_files(hits: Sequence[tuple[str, Sequence[dict[str, Any]]]], limit: int = DEFINED_MAX) -> list[dict[str, Any]]:
    """One row per file that defines one of the identifiers, from ``(identifier, keyword rows)``
    pairs in the question's order: each file at its first defining row (a copy), at most
    *limit*; an identifier defined in more than ``MAX_AMBIGUOUS`` files is skipped."""
    out: dict[str, dict[str, Any]] = {}
    for ident, rows in hits:
        if len(out) >= limit:
            break
        found: dict[str, dict[str, Any]] = {}
        for row in rows:
            if row["path"] not in found and defines(str(row.get("text") or ""), ident):
                found[row["path"]] = row
        if len(found) > MAX_AMBIGUOUS:
            continue
        for path, row in found.items():
            if path not in out and len(out) < limit:
                out[path] = dict(row)
    return list(out.values())
