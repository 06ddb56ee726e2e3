"""Files a question names: paths and dotted module names resolved against the workspace.

A question often names the file it is about: a traceback frame (``File
"/home/u/proj/sympy/core/basic.py", line 12``), a path typed by hand (``core/basic.py``,
``src\\app\\views.ts``), a bare file name (``conftest.py``) or a dotted module
(``sphinx.ext.autodoc``). BM25 sees those only as loose words among the rest of the question, so
``hybrid_search`` fuses the named files as one more ranked list (``mentioned``).

Contract
--------
* ``mentions(question)`` is every path-like token (one with a file extension: letters and digits
  after the last dot) and every dotted name of at least two parts, in order of first appearance,
  deduplicated; separators normalised to ``/``, quotes, ``./`` and trailing punctuation
  stripped. Nothing is resolved here: most tokens (``np.nan``, ``e.g``) name no file and are
  dropped by ``PathIndex.resolve``.
* ``PathIndex(paths).resolve(mention)`` is the workspace files the mention names, best match
  only. A path mention matches a file when one is a ``/``-suffix of the other (an absolute
  traceback path ends with the workspace path; a partial path is the end of one); among
  matches, those sharing the most trailing components win. A dotted name ``a.b.c`` is tried as
  the module ``a/b/c`` (``a/b/c.<ext>`` or the package ``a/b/c/__init__.<ext>``), then without
  its last part (``a.b.C`` names a class of module ``a.b``), down to two parts. A mention with
  more than ``MAX_AMBIGUOUS`` best matches (``__init__.py``, ``utils.py``) names nothing.
* ``PathIndex.named_files(mentions, limit)`` resolves each mention in turn: the named files in
  order of first mention, deduplicated, at most ``limit``; ``path_index(paths)`` caches one
  index per path set.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["MAX_AMBIGUOUS", "MENTIONED_MAX", "PathIndex", "best_matches", "first_paths", "mentions", "path_index", "per_path_set"]

#: A mention matching more files than this (at its best match length) is ignored as ambiguous.
MAX_AMBIGUOUS = 3
#: At most this many named files enter the fused lists.
MENTIONED_MAX = 10

# Runs of path characters; ':' ends a run, so "x.py:12" and "C:\\x.py" need no special case.
_RUN_RE = re.compile(r"[\w.~/\\-]+")
# A file name's extension: letters and digits after the last dot, at least one letter.
_EXT_RE = re.compile(r"\.[A-Za-z0-9]*[A-Za-z][A-Za-z0-9]*$")
_DOTTED_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_RELATIVE_RE = re.compile(r"^(?:\.{1,2}/)+")
#: Longer runs (a base64 blob, a minified line) name no file and are not looked at.
_RUN_MAX = 400
_PACKAGE_STEMS = ("__init__", "index", "mod")


def mentions(question: str) -> list[str]:
    """Every path-like token and dotted name in *question*, normalised, in order, deduplicated."""
    out: list[str] = []
    seen: set[str] = set()
    for run in _RUN_RE.findall(question):
        if len(run) > _RUN_MAX:
            continue
        token = _RELATIVE_RE.sub("", run.replace("\\", "/")).rstrip(".").lstrip("-").strip("/")
        if not token or token in seen:
            continue
        if _EXT_RE.search(token.rsplit("/", 1)[-1]) or _DOTTED_RE.fullmatch(token):
            seen.add(token)
            out.append(token)
    return out


def _suffix_len(a: list[str], b: list[str]) -> int:
    """How many trailing components *a* and *b* share."""
    n = 0
    while n < len(a) and n < len(b) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


class PathIndex:
    """The workspace's file paths, indexed by file name and by module stem for ``resolve``."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.by_name: dict[str, list[list[str]]] = defaultdict(list)
        self.by_stem: dict[str, list[tuple[list[str], str]]] = defaultdict(list)
        for path in paths:
            parts = path.split("/")
            self.by_name[parts[-1]].append(parts)
            stem, dot, _ = parts[-1].rpartition(".")
            if not dot or not stem:
                continue
            module = [*parts[:-1], stem] if stem not in _PACKAGE_STEMS else parts[:-1]
            if module:
                self.by_stem[module[-1]].append((module, path))

    def resolve(self, mention: str) -> list[str]:
        """The files *mention* names (best matches only), or [] when none or too many."""
        files = self._resolve_path(mention.split("/"))
        if files or not _DOTTED_RE.fullmatch(mention):
            return files
        parts = mention.split(".")
        for n in range(len(parts), 1, -1):
            files = self._resolve_module(parts[:n])
            if files:
                return files
        return []

    def _resolve_path(self, parts: list[str]) -> list[str]:
        scored = []
        for cand in self.by_name.get(parts[-1], ()):
            n = _suffix_len(parts, cand)
            if n == len(parts) or n == len(cand):  # one is a suffix of the other
                scored.append((n, "/".join(cand)))
        return best_matches(scored)

    def _resolve_module(self, module: list[str]) -> list[str]:
        scored = []
        for cand, path in self.by_stem.get(module[-1], ()):
            n = _suffix_len(module, cand)
            if n == len(module):  # the dotted name is the end of the module path (src/ layouts)
                scored.append((n, path))
        return best_matches(scored)

    def named_files(self, found: Iterable[str], limit: int = MENTIONED_MAX) -> list[str]:
        """The files the mentions name, in order of first mention, deduplicated, at most *limit*."""
        return first_paths((self.resolve(mention) for mention in found), limit)


def first_paths(groups: Iterable[Iterable[str]], limit: int) -> list[str]:
    """The paths of each group in turn, deduplicated, at most *limit*."""
    out: list[str] = []
    for group in groups:
        for path in group:
            if path not in out:
                out.append(path)
                if len(out) >= limit:
                    return out
    return out


def best_matches(scored: list[tuple[int, str]]) -> list[str]:
    """The paths of the highest score in *scored* (score, path) pairs, sorted; none when more than
    ``MAX_AMBIGUOUS`` tie."""
    if not scored:
        return []
    top = max(n for n, _ in scored)
    best = sorted(p for n, p in scored if n == top)
    return best if len(best) <= MAX_AMBIGUOUS else []


T = TypeVar("T")


def per_path_set(build: Callable[[frozenset[str]], T]) -> Callable[[frozenset[str]], T]:
    """*build* of a path set, built once per path set (``IndexStore.paths`` returns the same
    frozenset until the table changes); at most 16 kept."""
    built: dict[int, tuple[frozenset[str], T]] = {}

    def of(paths: frozenset[str]) -> T:
        hit = built.get(id(paths))
        if hit is None or hit[0] is not paths:
            if len(built) >= 16:
                built.clear()
            hit = built[id(paths)] = (paths, build(paths))
        return hit[1]

    return of


#: A ``PathIndex`` of a path set, built once per path set.
path_index: Callable[[frozenset[str]], PathIndex] = per_path_set(PathIndex)
