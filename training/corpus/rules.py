"""The miner's rules, as plain functions: which commits become questions, what a question says,
which lines a commit changed, and which files count as source. The message and file rules live in
``daemons.lib.history``, shared with ``wsctx eval``; they are imported here under their names.

Contract
--------
* ``clean_message``, ``skip_reason``, ``is_source``: see ``daemons.lib.history``.
* ``parse_hunks(diff)`` is ``{path: [(start, end), ...]}`` of the *old* side (the parent's lines,
  1-based, inclusive) that each hunk of a ``git diff -U0`` changed. A pure insertion after old
  line L is recorded as ``(L, L)`` (``(1, 1)`` at the top): the code the new lines join.
* ``overlaps(span, ranges)`` says whether a chunk's line span touches any changed range.
* ``is_eval_repo(owner_name)`` is True for the evaluation repositories, their forks under
  another owner and names that embed them (``EVAL_REPOS``): the miner refuses them.
* ``near_duplicate(a, b)`` is True when two passages share at least ``NEAR_DUP`` of their
  identifier sets (Jaccard): such a negative would teach the model that the positive is wrong.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from daemons.lib.history import (  # noqa: F401  (the message and file rules, shared with `wsctx eval`)
    MAX_SOURCE_FILES, MIN_SUBJECT_WORDS, QUERY_MAX_CHARS, SOURCE_LANGUAGES, clean_message, files_skip_reason, is_source,
    message_skip_reason, skip_reason, subject_words,
)
from daemons.lib.keywords import identifiers

#: The evaluation repositories (``../shared/eval``): never mined, nor their forks or copies.
EVAL_REPOS = frozenset({
    "astropy", "requests", "flask", "click", "httpx", "pytest", "pylint", "seaborn", "sphinx", "sympy",
    "xarray", "twinny", "sqlfluff", "pvlib-python", "astroid", "pydicom", "marshmallow", "django",
    "scikit-learn", "matplotlib",
})
#: Identifier-set Jaccard at or above which a negative counts as a copy of a positive.
NEAR_DUP = 0.8

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def parse_hunks(diff: str) -> dict[str, list[tuple[int, int]]]:
    """Old-side changed line ranges per file of a ``git diff -U0`` (see the module contract).

    Files are keyed by their old path (``--- a/PATH``); created files (``--- /dev/null``) are
    left out, since the parent has nothing of them to find.
    """
    out: dict[str, list[tuple[int, int]]] = {}
    current: str | None = None
    for line in diff.split("\n"):
        if line.startswith("--- "):
            name = line[4:].strip()
            if name.startswith('"'):
                name = name.strip('"')
            current = name[2:] if name.startswith("a/") else None
            if current is not None:
                out.setdefault(current, [])
            continue
        if current is None:
            continue
        m = _HUNK.match(line)
        if m:
            start = int(m.group(1))
            count = 1 if m.group(2) is None else int(m.group(2))
            if count == 0:
                out[current].append((max(start, 1), max(start, 1)))
            else:
                out[current].append((start, start + count - 1))
    return {p: r for p, r in out.items() if r}


def overlaps(span: tuple[int, int], ranges: Iterable[tuple[int, int]]) -> bool:
    """Whether the inclusive line span touches any of the inclusive ranges."""
    s, e = span
    return any(s <= re_ and rs <= e for rs, re_ in ranges)


def is_eval_repo(owner_name: str) -> bool:
    """Whether ``owner/name`` is an evaluation repository, a fork of one or a copy that names it."""
    name = owner_name.rsplit("/", 1)[-1].lower()
    if name in EVAL_REPOS:
        return True
    parts = set(re.split(r"[-_.]", name))
    return any(e in parts or name.startswith(e + "-") or name.endswith("-" + e) for e in EVAL_REPOS if "-" not in e) \
        or any(e in name for e in EVAL_REPOS if "-" in e)


def near_duplicate(a: str, b: str) -> bool:
    """Whether two passages' identifier sets overlap by at least ``NEAR_DUP`` (Jaccard)."""
    sa, sb = set(identifiers(a)), set(identifiers(b))
    if not sa or not sb:
        return a.strip() == b.strip()
    return len(sa & sb) / len(sa | sb) >= NEAR_DUP
