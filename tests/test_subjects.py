"""The source files that test files test: each language's naming convention, the nearest candidate, and the ``tested`` list in hybrid search."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from daemons.lib.fusion import TESTED
from daemons.lib.search import SearchParams, hybrid_search
from daemons.lib.store import IndexStore
from daemons.lib.subjects import SubjectIndex, subject_index, subject_stem
from tests.support import index_row

DIM = 8
META = {"model_id": "m@1", "dim": DIM, "chunker_version": "1", "chunk_max_chars": 1000}


@pytest.mark.parametrize(("path", "stem"), [
    ("xarray/tests/test_groupby.py", "groupby"),
    ("pkg/retry_test.go", "retry"),
    ("lib/parser_spec.rb", "parser"),
    ("src/button.test.tsx", "button"),
    ("src/api/client.spec.js", "client"),
    ("core/src/test/java/org/x/ParserTest.java", "Parser"),
    ("Tests/CacheTests.swift", "Cache"),
    ("tests/lexer.rs", "lexer"),
    ("__tests__/store.js", "store"),
])
def test_a_test_files_name_gives_the_module_it_tests(path: str, stem: str) -> None:
    """Each language's test-file naming convention gives the stem of the module under test."""
    assert subject_stem(path) == stem


@pytest.mark.parametrize("path", ["tests/conftest.py", "tests/__init__.py", "src/groupby.py", "docs/testing.rst", "test.py", "tests/test.py"])
def test_files_that_test_no_one_module_name_nothing(path: str) -> None:
    """Fixtures, package markers, source files and bare ``test`` files name no subject."""
    assert subject_stem(path) is None


def test_the_subject_shares_the_most_leading_folders_with_the_test() -> None:
    """Among same-named sources, the one under the test's own package wins, and a test of another language family matches nothing."""
    ix = SubjectIndex([
        "xarray/core/groupby.py", "other/groupby.py", "pkg/a.go", "pkg/sub/a.go", "web/src/a.ts", "docs/groupby.rst",
        "xarray/tests/test_groupby.py",
    ])
    assert ix.subjects("xarray/tests/test_groupby.py") == ["xarray/core/groupby.py"]
    assert ix.subjects("pkg/a_test.go") == ["pkg/a.go"]
    assert ix.subjects("web/src/a.test.js") == ["web/src/a.ts"]
    assert ix.subjects("tests/test_a.rb") == []


def test_too_many_equally_near_subjects_name_none() -> None:
    """A stem with more equally near sources than mentions.MAX_AMBIGUOUS (utils.py everywhere) names nothing; three are all kept."""
    four = SubjectIndex([f"p{i}/utils.py" for i in range(4)])
    assert four.subjects("tests/test_utils.py") == []
    three = SubjectIndex([f"p{i}/utils.py" for i in range(3)])
    assert three.subjects("tests/test_utils.py") == ["p0/utils.py", "p1/utils.py", "p2/utils.py"]


def test_tested_files_follow_their_first_test_and_skip_sources() -> None:
    """Subjects come in the order of their first test hit, once each, source hits are skipped, and the list stops at its limit."""
    ix = SubjectIndex(["src/a.py", "src/b.py", "src/c.py"])
    hits = ["src/c.py", "tests/test_b.py", "tests/test_a.py", "tests/b_test.py", "tests/test_c.py"]
    assert ix.tested_files(hits) == ["src/b.py", "src/a.py", "src/c.py"]
    assert ix.tested_files(hits, limit=1) == ["src/b.py"]


def test_the_index_is_built_once_per_path_set() -> None:
    """The same path set gives the same index object; a new set gives a new one."""
    paths = frozenset({"src/a.py", "tests/test_a.py"})
    assert subject_index(paths) is subject_index(paths)
    assert subject_index(frozenset(set(paths))) is not subject_index(paths)


@pytest.mark.timeout(120)
def test_a_source_file_found_only_through_its_test_enters_fusion_as_the_tested_list(tmp_path) -> None:
    """A module neither search finds, whose test both searches rank first, is fused through the ``tested`` list at its first chunk, and not without it."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal(DIM).astype(np.float32)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    store.replace_file("tests/test_backoff.py", [index_row("tests/test_backoff.py", 0, "retry jitter", q + 0.01)])
    # the module shares no word with the question and points elsewhere
    store.replace_file("src/backoff.py", [
        index_row("src/backoff.py", 0, "import random", -q),
        index_row("src/backoff.py", 1, "def delay(n): return 2 ** n", -q),
    ])
    for k in range(3):
        store.replace_file(f"src/other{k}.py", [index_row(f"src/other{k}.py", 0, f"unrelated{k} words", rng.standard_normal(DIM))])

    params = SearchParams(vector_k=3, keyword_k=3, test_subjects=True)
    res = hybrid_search(store, "retry jitter", q, params=params)
    assert res.lists[TESTED] == [next(c["chunk_id"] for c in res.candidates if c["path"] == "src/backoff.py")]
    entered = next(c for c in res.candidates if c["path"] == "src/backoff.py")
    assert entered["ranks"] == {TESTED: 1} and entered["start_line"] == 1
    assert "tested" in res.timings_ms

    off = hybrid_search(store, "retry jitter", q, params=replace(params, test_subjects=False))
    assert TESTED not in off.lists
    assert "src/backoff.py" not in {c["path"] for c in off.candidates}
