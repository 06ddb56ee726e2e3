"""The files a question names: path and dotted-name tokens, and their resolution against the workspace."""
from __future__ import annotations

import pytest

from daemons.lib.mentions import MAX_AMBIGUOUS, PathIndex, mentions, path_index

WORKSPACE = [
    "sympy/core/basic.py", "basic.py", "sympy/printing/latex.py", "sympy/utils.py", "sympy/core/utils.py",
    "src/sphinx/ext/autodoc/__init__.py", "setup.cfg", "sympy/core/expr.py", ".github/workflows/ci.yml",
    *[f"pkg{k}/__init__.py" for k in range(MAX_AMBIGUOUS + 1)], *[f"pkg{k}/helpers.py" for k in range(MAX_AMBIGUOUS + 1)],
]


def test_mentions_finds_traceback_windows_url_relative_and_dotted_tokens_in_order() -> None:
    """Path tokens lose quotes, drive letters, ./ prefixes, line numbers and sentence dots; dotted names stay whole."""
    q = ('File "/home/u/proj/sympy/core/basic.py", line 12, in subs\n'
         'File "C:\\Users\\x\\sympy\\printing\\latex.py", line 3\n'
         "see ./sympy/utils.py:40 and `sphinx.ext.autodoc.Documenter`, e.g. version 1.2.3 in setup.cfg.\n"
         "https://github.com/sympy/sympy/blob/master/sympy/core/expr.py#L12 and again sympy/utils.py")
    assert mentions(q) == [
        "home/u/proj/sympy/core/basic.py", "Users/x/sympy/printing/latex.py", "sympy/utils.py",
        "sphinx.ext.autodoc.Documenter", "e.g", "setup.cfg", "github.com/sympy/sympy/blob/master/sympy/core/expr.py",
    ]


def test_mentions_of_plain_prose_and_huge_tokens_are_empty() -> None:
    """A question with no path or dotted name, or one whose only token is a 10,000-character blob, names nothing."""
    assert mentions("why does the session drop cookies on redirect?") == []
    assert mentions("x" * 5000 + "/" + "y" * 5000 + ".py") == []


@pytest.mark.parametrize("mention, files", [
    ("home/u/proj/sympy/core/basic.py", ["sympy/core/basic.py"]),    # absolute: the longest shared suffix wins over ./basic.py
    ("basic.py", ["basic.py", "sympy/core/basic.py"]),                # a bare name: every file of that name (up to the cap)
    ("core/utils.py", ["sympy/core/utils.py"]),                       # a partial path is the end of one
    ("utils.py", ["sympy/core/utils.py", "sympy/utils.py"]),
    ("sphinx.ext.autodoc.Documenter", ["src/sphinx/ext/autodoc/__init__.py"]),  # class of a package, under src/
    ("sympy.core.basic", ["sympy/core/basic.py"]),
    (".github/workflows/ci.yml", [".github/workflows/ci.yml"]),
    ("__init__.py", []),                                               # more than MAX_AMBIGUOUS files: names nothing
    ("helpers.py", []),
    ("other/basic.py", ["basic.py"]),                                 # a root file: any path ending in its name
    ("np.nan", []), ("e.g", []), ("other/latex.py", []), ("sympy.core.nothing", []),
])
def test_resolve_keeps_the_best_matching_files_only(mention: str, files: list[str]) -> None:
    """A mention resolves to the files sharing the most trailing components with it, none when ambiguous."""
    assert PathIndex(WORKSPACE).resolve(mention) == files


def test_named_files_are_deduplicated_in_mention_order_and_capped() -> None:
    """Each named file appears once, at its first mention, and no more than the limit are returned."""
    idx = PathIndex(WORKSPACE)
    found = ["sympy/core/expr.py", "sympy.core.basic", "home/x/sympy/core/basic.py", "setup.cfg"]
    assert idx.named_files(found) == ["sympy/core/expr.py", "sympy/core/basic.py", "setup.cfg"]
    assert idx.named_files(found, limit=2) == ["sympy/core/expr.py", "sympy/core/basic.py"]


def test_path_index_is_built_once_per_path_set() -> None:
    """The same frozenset gets the same index; an equal but new set (the table changed) gets a new one."""
    paths = frozenset(WORKSPACE)
    assert path_index(paths) is path_index(paths)
    assert path_index(frozenset(WORKSPACE)) is not path_index(paths)


def test_context_line_note_lists_the_named_files_that_entered() -> None:
    """The note names the candidates' files that came in through the mentioned list, by that list's rank, once each."""
    from daemons.lib.notes import named_note

    cands = [("src/b.py", {"keyword": 1, "mentioned": 2}), ("src/a.py", {"mentioned": 1}), ("src/b.py", {"mentioned": 2}),
             ("src/c.py", {"vector": 1})]
    assert named_note(cands) == "named src/a.py, src/b.py"
    assert named_note([("src/c.py", {"vector": 1})]) == ""
