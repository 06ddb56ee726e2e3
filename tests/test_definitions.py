"""The files that define a question's identifiers: the definition rule, and the ``defined`` list over a real LanceDB table."""
from __future__ import annotations

import numpy as np
import pytest

from daemons.lib.definitions import MAX_AMBIGUOUS, defined_files, defines, identifier_query
from daemons.lib.fusion import DEFINED, KEYWORD, LIST_WEIGHTS
from daemons.lib.search import SearchParams, hybrid_search
from daemons.lib.store import IndexStore
from tests.support import index_row

DIM = 8
META = {"model_id": "m@1", "dim": DIM, "chunker_version": "1", "chunk_max_chars": 1000}


@pytest.mark.parametrize("text, ident", [
    ("def wait_random(x):", "wait_random"),
    ("    async def fetch(self):", "fetch"),
    ("class RetryError(Exception):", "RetryError"),
    ("export default function addDays(date, amount) {", "addDays"),
    ("export const formatISO = (d) => d", "formatISO"),
    ("func (c *Context) JSON(code int, obj any) {", "JSON"),
    ("pub(crate) fn walk_dir(path: &Path) {", "walk_dir"),
    ("type Handler interface {", "Handler"),
])
def test_a_definition_line_of_each_language_defines_its_name(text: str, ident: str) -> None:
    """A line that defines the name with its language's keyword, after indentation and modifiers, counts as its definition."""
    assert defines("x = 1\n" + text + "\n    pass", ident)


@pytest.mark.parametrize("text, ident", [
    ("result = wait_random(3)", "wait_random"),
    ("def wait_random_exponential():", "wait_random"),
    ("# def wait_random(): was removed", "wait_random"),
    ("raise RetryError(last)", "RetryError"),
])
def test_a_use_a_longer_name_or_a_comment_is_not_a_definition(text: str, ident: str) -> None:
    """Calling a name, defining a longer name that starts with it, or a comment is not a definition."""
    assert not defines(text, ident)


def _row(path: str, text: str) -> dict:
    return {"chunk_id": f"{path}#{hash(text) % 1000}", "path": path, "text": text}


def test_defined_files_follow_the_identifiers_order_and_skip_ambiguous_names() -> None:
    """Each file enters once at its defining chunk, in the order of the question's identifiers; a name defined in too many files names none."""
    run = [_row(f"m{i}.py", "def run():\n    pass") for i in range(MAX_AMBIGUOUS + 1)]
    hits = [
        ("run", run),
        ("RetryError", [_row("tests/t.py", "raise RetryError()"), _row("src/errors.py", "class RetryError(Exception):")]),
        ("wait_random", [_row("src/wait.py", "x = 1"), _row("src/wait.py", "def wait_random():"), _row("src/errors.py", "def wait_random():")]),
    ]
    out = defined_files(hits)
    assert [(r["path"], r["text"]) for r in out] == [("src/errors.py", "class RetryError(Exception):"), ("src/wait.py", "def wait_random():")]
    assert defined_files(hits, limit=1)[0]["path"] == "src/errors.py"
    assert identifier_query("wait_randomExponential") == "wait random exponential"


@pytest.mark.timeout(120)
def test_the_defined_list_puts_the_defining_file_in_fusion_at_its_defining_chunk(tmp_path) -> None:
    """With a weight, a question naming ``RetryError`` fuses the file defining it, at that chunk, although another file uses the name more."""
    rng = np.random.default_rng(3)
    s = IndexStore.open_writer(tmp_path / "ix", META)
    s.replace_file("src/api.py", [
        index_row("src/api.py", i, f"retry error raise RetryError RetryError api call{i}", rng.standard_normal(DIM)) for i in range(4)
    ])
    s.replace_file("src/errors.py", [
        index_row("src/errors.py", 0, "import os", rng.standard_normal(DIM)),
        index_row("src/errors.py", 1, "class RetryError(Exception):\n    retry error", rng.standard_normal(DIM)),
    ])
    weights = {**LIST_WEIGHTS, DEFINED: 1.0}
    res = hybrid_search(s, "retry error", None, params=SearchParams(identifiers=("RetryError",), list_weights=weights))
    assert [r for r in res.lists[DEFINED]] == ["src/errors.py|h|1"]
    by_id = {c["chunk_id"]: c for c in res.candidates}
    assert by_id["src/errors.py|h|1"]["ranks"][DEFINED] == 1
    # the shipped weight 0, or a question without identifiers, runs no definition search
    assert DEFINED not in hybrid_search(s, "retry error", None, params=SearchParams(identifiers=("RetryError",), list_weights=LIST_WEIGHTS)).lists
    assert set(hybrid_search(s, "retry error", None, params=SearchParams(list_weights=weights)).lists) >= {KEYWORD}
    assert DEFINED not in hybrid_search(s, "retry error", None, params=SearchParams(list_weights=weights)).lists
