"""File roles and their fusion weights: tests, docs, config and vendored code count less unless the question asks for them."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from daemons.lib.fusion import RRF_K
from daemons.lib.assembly import context_line
from daemons.lib.notes import weights_note
from daemons.lib.roles import CONFIG, DOC, SOURCE, TEST, VENDORED, file_role, role_weights, roles_present, wanted_roles, weight_of
from daemons.lib.search import SearchParams, hybrid_search
from daemons.lib.store import IndexStore
from tests.support import index_row

DIM = 8
META = {"model_id": "m@1", "dim": DIM, "chunker_version": "1", "chunk_max_chars": 1000}


@pytest.mark.parametrize("path, role", [
    ("src/requests/sessions.py", SOURCE),
    ("tests/test_sessions.py", TEST),
    ("testing/python/collect.py", TEST),
    ("pkg/conftest.py", TEST),
    ("server/handler_test.go", TEST),
    ("web/src/app.spec.ts", TEST),
    ("web/src/__tests__/app.js", TEST),
    ("src/main/java/FooTest.java", TEST),
    ("docs/api.rst", DOC),
    ("README.md", DOC),
    ("doc/conf.py", DOC),
    ("src/_pytest/python.py", SOURCE),
    ("src/contest.py", SOURCE),
    ("lib/latest.py", SOURCE),
    ("CHANGES", DOC),
    ("CHANGES.old", DOC),
    ("pkg/NEWS", DOC),
    ("sphinx/locale/fr/LC_MESSAGES/sphinx.po", DOC),
    ("sphinx/locale/sphinx.pot", DOC),
    ("IPython/core/history.py", SOURCE),
    ("pkg/changes.py", SOURCE),
    ("PKG-INFO", CONFIG),
    ("setup.py", CONFIG),
    ("tox.ini", CONFIG),
    ("ci/requirements/py38.yml", CONFIG),
    (".github/workflows/test.yml", CONFIG),
    ("pylint/config/argument.py", SOURCE),
    ("doc/Makefile", DOC),
    ("requests/packages/urllib3/connectionpool.py", VENDORED),
    ("pip/_vendor/six.py", VENDORED),
    ("third_party/zlib/inflate.c", VENDORED),
    ("vendor/github.com/pkg/errors/errors.go", VENDORED),
    ("astropy/extern/ply/lex.py", VENDORED),
    ("cextern/wcslib/C/wcs.c", VENDORED),
    ("botocore/vendored/six.py", VENDORED),
    ("requests/packages/urllib3/README.rst", DOC),
    ("requests/packages/urllib3/tests/test_util.py", TEST),
    ("poetry/packages/locker.py", SOURCE),
    ("packages/core/src/index.ts", SOURCE),
    ("web/packages/ui/button.ts", SOURCE),
    ("src/vendors.py", SOURCE),
])
def test_file_role_reads_the_path(path: str, role: str) -> None:
    """The role of a file comes from its folders, name and suffix, in the usual conventions of several languages."""
    assert file_role(path) == role


def test_question_that_asks_for_tests_or_docs_lifts_their_weight() -> None:
    """A question naming tests or docs weighs that role fully; other questions get the configured weights."""
    plain = role_weights("where is the retry logic?", 0.5, 0.25)
    assert plain == {SOURCE: 1.0, TEST: 0.5, DOC: 0.25, CONFIG: 1.0, VENDORED: 1.0}
    assert role_weights("how is the retry logic tested?", 0.5, 0.25)[TEST] == 1.0
    assert role_weights("where is the retry logic documented?", 0.5, 0.25)[DOC] == 1.0
    assert role_weights("pytest fails to collect a docstring", 0.5, 0.25) == plain
    assert weight_of("tests/test_x.py", None) == 1.0
    assert weight_of("tests/test_x.py", plain) == 0.5


def test_config_counts_less_unless_the_question_is_about_build_or_ci() -> None:
    """Packaging and CI files get the config weight, except for questions naming them or CI; "config" and "install" alone do not lift it."""
    assert role_weights("config loading fails after pip install", 0.5, 0.5, 0.5)[CONFIG] == 0.5
    assert role_weights("tox.ini envlist ignores py38", 0.5, 0.5, 0.5)[CONFIG] == 1.0
    assert role_weights("the CI workflow skips Windows", 0.5, 0.5, 0.5)[CONFIG] == 1.0
    assert role_weights("which dependencies pin numpy?", 0.5, 0.5, 0.5)[CONFIG] == 1.0


def test_vendored_code_counts_less_unless_the_question_asks_about_the_vendored_copy() -> None:
    """Vendored code gets its weight for a question about the project, and counts fully when the question says vendored or third-party; naming the library alone does not lift it."""
    assert role_weights("urllib3 ProtocolError escapes Session.send", 0.1, 0.1, 0.25, 0.25)[VENDORED] == 0.25
    assert role_weights("update the vendored urllib3", 0.1, 0.1, 0.25, 0.25)[VENDORED] == 1.0
    assert role_weights("a bug in third-party code we bundle", 0.1, 0.1, 0.25, 0.25)[VENDORED] == 1.0
    assert role_weights("runs an external command", 0.1, 0.1, 0.25, 0.25)[VENDORED] == 0.25
    assert role_weights("anything", 0.1, 0.1)[VENDORED] == 1.0  # the rule is off unless a weight is given
    assert weight_of("requests/packages/urllib3/util.py", role_weights("timeouts", 0.1, 0.1, 0.25, 0.25)) == 0.25


@pytest.mark.timeout(120)
def test_hybrid_search_puts_source_above_a_test_that_repeats_its_names(tmp_path) -> None:
    """A test that matches the question better than the source ranks below it after weighting, and above it when the question asks for tests."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal(DIM).astype(np.float32)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    # the test is all question words and nearest the question; the source is second on both lists
    store.replace_file("tests/test_retry.py", [index_row("tests/test_retry.py", 0, "retry backoff", q + 0.01)])
    store.replace_file("src/retry.py", [index_row("src/retry.py", 0, "retry backoff session adapter timeout", q + 0.3 * rng.standard_normal(DIM))])
    for k in range(4):
        store.replace_file(f"src/other{k}.py", [index_row(f"src/other{k}.py", 0, f"unrelated{k} words", rng.standard_normal(DIM))])

    # without the test's subject as a list of its own (subjects.py, off by default), which would lift src/retry.py too
    plain = SearchParams(test_subjects=False)
    unweighted = hybrid_search(store, "retry backoff", q, params=plain)
    assert [c["path"] for c in unweighted.candidates[:2]] == ["tests/test_retry.py", "src/retry.py"]
    assert all(c["weight"] == 1.0 for c in unweighted.candidates)

    weighted = hybrid_search(store, "retry backoff", q, params=replace(plain, role_weights=role_weights("where is the retry backoff?", 0.5, 0.5)))
    assert [c["path"] for c in weighted.candidates[:2]] == ["src/retry.py", "tests/test_retry.py"]
    test_hit = weighted.candidates[1]
    assert test_hit["weight"] == 0.5
    assert test_hit["fused_score"] == pytest.approx(0.5 * sum(1 / (RRF_K + r) for r in test_hit["ranks"].values()))

    asked = hybrid_search(store, "retry backoff", q, params=replace(plain, role_weights=role_weights("how is retry backoff tested?", 0.5, 0.5)))
    assert asked.candidates[0]["path"] == "tests/test_retry.py"


@pytest.mark.timeout(120)
def test_vendored_copy_ranks_below_the_projects_own_code_under_the_shipped_settings(tmp_path) -> None:
    """With the default settings a vendored library that matches the question best ranks below the project's own module, and first again when the question asks about the vendored copy."""
    from daemons.lib.config import Settings
    from daemons.lib.question import plan_for
    from daemons.lib.search import question_params

    rng = np.random.default_rng(5)
    q = rng.standard_normal(DIM).astype(np.float32)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    store.replace_file("requests/packages/urllib3/connectionpool.py",
                       [index_row("requests/packages/urllib3/connectionpool.py", 0, "connection pool timeout retries", q + 0.01)])
    store.replace_file("requests/adapters.py", [index_row("requests/adapters.py", 0, "adapter connection pool timeout send", q + 0.3 * rng.standard_normal(DIM))])
    for k in range(4):
        store.replace_file(f"requests/other{k}.py", [index_row(f"requests/other{k}.py", 0, f"unrelated{k} words", rng.standard_normal(DIM))])
    s = Settings()

    def first(question: str) -> str:
        qplan = plan_for(question, s)
        return hybrid_search(store, qplan.keyword_query, q, params=question_params(s, qplan)).candidates[0]["path"]

    assert first("connection pool timeout") == "requests/adapters.py"
    assert first("the vendored connection pool timeout") == "requests/packages/urllib3/connectionpool.py"


def test_context_line_names_the_roles_weighted_down() -> None:
    """The context line says which roles were weighted down among the candidates, and says nothing when none were."""
    note = weights_note([("src/a.py", 1.0), ("docs/a.rst", 0.5), ("tests/test_a.py", 0.25)])
    assert note == "tests ×0.25, docs ×0.5"
    assert weights_note([("vendor/x/y.go", 0.25), ("setup.py", 0.25)]) == "configs ×0.25, vendored ×0.25"
    assert weights_note([("src/a.py", 1.0)]) == ""
    line = context_line("retry", 3, [("src/a.py:1-9", 0.9)], [], notes=[f"weighted {note}"])
    assert line == 'searched "retry" · reranked 3 · kept src/a.py:1-9 0.90 · weighted tests ×0.25, docs ×0.5'


def test_blocks_of_equal_probability_put_source_before_tests() -> None:
    """Merged blocks are ordered by probability times role weight, so a test ranks below source unless it is much more probable."""
    from daemons.lib.assembly import Hit, merge_hits

    hits = [
        Hit(path="tests/test_a.py", start_line=1, end_line=3, text="t", score=0.9, weight=0.5),
        Hit(path="src/a.py", start_line=1, end_line=3, text="s", score=0.6),
        Hit(path="docs/a.rst", start_line=1, end_line=3, text="d", score=0.99, weight=0.5),
    ]
    assert [b.path for b in merge_hits(hits, {})] == ["src/a.py", "docs/a.rst", "tests/test_a.py"]
    assert [b.score for b in merge_hits(hits, {})] == [0.6, 0.99, 0.9]


def test_order_key_overrides_probability_times_weight() -> None:
    """When hits carry an order key (the front's fused/cross-encoder blend), blocks follow it, and a merged block keeps its best key."""
    from daemons.lib.assembly import Hit, merge_hits

    hits = [
        Hit(path="src/a.py", start_line=1, end_line=3, text="a", score=0.9, order=0.10),
        Hit(path="src/b.py", start_line=1, end_line=3, text="b", score=0.2, order=0.12),
        Hit(path="src/a.py", start_line=4, end_line=6, text="a2", score=0.3, order=0.15),
    ]
    blocks = merge_hits(hits, {})
    assert [b.path for b in blocks] == ["src/a.py", "src/b.py"]
    assert (blocks[0].start_line, blocks[0].end_line, blocks[0].order, blocks[0].score) == (1, 6, 0.15, 0.9)


def test_wanted_roles_and_roles_present_name_what_a_question_asks_for_and_what_an_index_holds() -> None:
    """A question asks for tests, docs or config by its words; the roles present are those of at least one path."""
    assert wanted_roles("how is the retry tested? where is it documented?") == [TEST, DOC]
    assert wanted_roles("where is the retry logic?") == []
    assert roles_present(frozenset({"src/a.py", "docs/index.md"})) == {SOURCE, DOC}
    assert roles_present(frozenset()) == set()
