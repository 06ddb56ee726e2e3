"""The source files that test files test, by the naming conventions of each language.

A question's searches find tests as readily as code: a test repeats the code's names and
describes its behaviour in the words an issue uses. Fusion weighs tests down (``roles``), so a test
hit does not crowd out the source, but the hit is evidence about the source too:
``xarray/tests/test_groupby.py`` matching a question says ``xarray/core/groupby.py`` bears on it.
``hybrid_search`` fuses those subjects as one more ranked list (``tested``).

Contract
--------
* ``subject_stem(path)`` is the module name a test file's name says it tests, or ``None``: a
  ``test_`` prefix or a ``_test``/``_tests``/``_spec`` suffix (Python, Go, Ruby), a ``.test``/``.spec``
  infix (JavaScript, TypeScript), a ``Test``/``Tests`` suffix (Java, Kotlin, C#, Swift, Scala). A
  file in a test folder (``tests/``, ``__tests__/``, ``spec/``) without such a marker names its
  subject by its own stem (Rust's ``tests/parser.rs``). ``conftest``, ``__init__`` and bare
  ``test``/``tests`` name none.
* ``SubjectIndex(paths).subjects(test_path)`` is the source files (``roles.file_role`` source) of
  that stem in the same language family (``.py`` with ``.py``; ``.js``/``.ts``/``.jsx``/``.tsx``/``.mjs``/
  ``.cjs`` with each other ...), best first. A candidate scores the number of leading folders it
  shares with the test's path once the test folders are dropped from it, so
  ``pkg/tests/test_a.py`` picks ``pkg/a.py`` over ``other/a.py``; on a tie, the one with fewer
  folders of its own below the shared ones, so Go's ``x/a_test.go`` picks ``x/a.go`` over
  ``x/sub/a.go``. Only the best-scoring candidates are returned, and none when more than
  ``mentions.MAX_AMBIGUOUS`` tie.
* ``SubjectIndex.tested_files(test_paths, limit)`` maps each test path in turn: the subjects in
  order of their first test, deduplicated, at most *limit*; non-test paths are skipped.
  ``subject_index(paths)`` caches one index per path set.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable

from daemons.lib.mentions import best_matches, first_paths, per_path_set
from daemons.lib.roles import SOURCE, TEST, file_role

__all__ = ["SubjectIndex", "subject_index", "subject_stem"]

#: At most this many subject files enter the fused lists.
TESTED_MAX = 10

#: Suffixes that are one language family: a test in one may test a file in another.
_FAMILIES: tuple[frozenset[str], ...] = (
    frozenset({".js", ".jsx", ".ts", ".tsx", ".mjs", ".cjs", ".mts", ".cts", ".vue", ".svelte"}),
    frozenset({".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh"}),
    frozenset({".java", ".kt", ".kts", ".scala", ".groovy"}),
)
_TEST_DIRS = frozenset({"test", "tests", "testing", "__tests__", "spec", "specs", "unittests", "unit_tests", "integration_tests"})
_MARKED = (
    re.compile(r"^test_(?P<stem>.+)$"),
    re.compile(r"^(?P<stem>.+?)_(?:tests?|spec)$"),
    re.compile(r"^(?P<stem>.+?)\.(?:test|spec)$"),
    re.compile(r"^(?P<stem>[A-Z]\w*?)Tests?$"),
)
_NAMES_NOTHING = frozenset({"conftest", "__init__", "test", "tests"})


def _split_suffix(name: str) -> tuple[str, str]:
    stem, dot, ext = name.rpartition(".")
    return (stem, "." + ext.lower()) if dot and stem else (name, "")


def _family(suffix: str) -> frozenset[str]:
    for fam in _FAMILIES:
        if suffix in fam:
            return fam
    return frozenset({suffix})


def subject_stem(path: str) -> str | None:
    """The module stem a test file's name says it tests (module docstring), or None."""
    parts = path.split("/")
    stem, _ = _split_suffix(parts[-1])
    for pattern in _MARKED:
        m = pattern.match(stem)
        if m:
            stem = m.group("stem")
            break
    else:
        if not any(p.lower() in _TEST_DIRS for p in parts[:-1]):
            return None
    return None if not stem or stem.lower() in _NAMES_NOTHING else stem


class SubjectIndex:
    """The workspace's source files by stem, for ``subjects``."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.by_stem: dict[str, list[tuple[str, list[str]]]] = defaultdict(list)
        for path in paths:
            if file_role(path) != SOURCE:
                continue
            parts = path.split("/")
            stem, suffix = _split_suffix(parts[-1])
            if suffix:
                self.by_stem[stem].append((suffix, parts[:-1]))

    def subjects(self, test_path: str) -> list[str]:
        """The source files *test_path* tests, best matches only (module docstring)."""
        stem = subject_stem(test_path)
        if stem is None:
            return []
        parts = test_path.split("/")
        family = _family(_split_suffix(parts[-1])[1])
        folders = [p for p in parts[:-1] if p.lower() not in _TEST_DIRS]
        scored = []
        for suffix, cand in self.by_stem.get(stem, ()):
            if suffix in family:
                shared = 0
                while shared < len(folders) and shared < len(cand) and folders[shared] == cand[shared]:
                    shared += 1
                # more shared leading folders first, then fewer folders of its own below them
                scored.append((1000 * shared - (len(cand) - shared), "/".join([*cand, stem + suffix])))
        return best_matches(scored)

    def tested_files(self, test_paths: Iterable[str], limit: int = TESTED_MAX) -> list[str]:
        """The subjects of *test_paths* in order of their first test, deduplicated, at most *limit*."""
        tests = [path for path in dict.fromkeys(test_paths) if file_role(path) == TEST]
        return first_paths((self.subjects(path) for path in tests), limit)


#: A ``SubjectIndex`` of a path set, built once per path set.
subject_index: Callable[[frozenset[str]], SubjectIndex] = per_path_set(SubjectIndex)
