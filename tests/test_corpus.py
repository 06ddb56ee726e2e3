"""The training corpus miner (training/corpus): message cleaning, skip rules, the parent tree,
changed-line overlap, negatives and the exclusion of the evaluation repositories, on real git
repositories built by the tests."""
from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from training.corpus import manifest, rules
from daemons.lib.bm25 import Bm25
from training.corpus.docstrings import definitions
from training.corpus.git import Repo
from training.corpus.mine import mine_repo


def test_trailers_references_and_urls_are_stripped_from_the_question() -> None:
    """Sign-offs, co-authors, issue and PR numbers, URLs, template comments and check-lists leave the question; the prose stays."""
    message = (
        "Retry idempotent requests after a read timeout (#1234)\n\n"
        "The pool gave up on GET after one timeout. See https://example.org/issues/12, fixes #99.\n\n"
        "<!-- describe your change -->\n- [x] tests added\n\n"
        "Signed-off-by: Ann Author <ann@example.org>\nCo-authored-by: Bo <bo@example.org>"
    )
    q = rules.clean_message(message)
    assert q.startswith("Retry idempotent requests after a read timeout\n\nThe pool gave up on GET after one timeout.")
    for gone in ("#1234", "#99", "http", "Signed-off-by", "Co-authored-by", "tests added", "describe your change"):
        assert gone not in q


def test_a_merge_subject_is_dropped_so_the_pull_request_description_is_the_question() -> None:
    """'Merge pull request #N from a/b' gives way to the description under it; with none, nothing is left."""
    assert rules.clean_message("Merge pull request #12 from a/b\n\nAdd proxy support to the session object") == \
        "Add proxy support to the session object"
    assert rules.clean_message("Merge pull request #12 from a/b") == ""


def test_a_trailer_like_line_inside_prose_is_kept() -> None:
    """Only a trailing block of Key: value lines is a trailer block; a 'Note: ...' sentence mid-body stays."""
    q = rules.clean_message("Parse dates with a trailing zone name\n\nNote: this changes the parser.\n\nMore prose follows here.")
    assert "Note: this changes the parser." in q


@pytest.mark.parametrize(("author", "message", "merge", "files", "reason"), [
    ("dependabot[bot] <x@y>", "Bump lodash from 1 to 2 in the lockfile", False, ["a.py"], "bot"),
    ("Ann <a@b>", "Merge branch 'main' into feature", True, ["a.py"], "merge_no_description"),
    ("Ann <a@b>", "Fix typo", False, ["a.py"], "short_subject"),
    ("Ann <a@b>", "Reformat the whole package with black", False, ["a.py"], "sweep"),
    ("Ann <a@b>", "Add a cache for parsed configuration files", False, [], "no_source"),
    ("Ann <a@b>", "Add a cache for parsed configuration files", False, [f"m{i}.py" for i in range(6)], "too_many_files"),
    ("Ann <a@b>", "Add a cache for parsed configuration files", False, ["a.py"], None),
])
def test_skip_rules(author: str, message: str, merge: bool, files: list[str], reason: str | None) -> None:
    """Bots, merges without a description, short subjects, sweeps and commits with no or too many source files are dropped, each by name."""
    assert rules.skip_reason(author, rules.clean_message(message), merge, files) == reason


def test_old_side_hunks_and_overlap() -> None:
    """A -U0 diff gives the parent's changed lines per file; a pure insertion marks the line it follows; new files are left out."""
    diff = (
        "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -3,2 +3,3 @@ def f\n-a\n-b\n+c\n+d\n+e\n"
        "@@ -10,0 +12,2 @@\n+f\n+g\n@@ -20 +23 @@\n-h\n+i\n"
        "diff --git a/new.py b/new.py\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,3 @@\n+x\n"
    )
    hunks = rules.parse_hunks(diff)
    assert hunks == {"x.py": [(3, 4), (10, 10), (20, 20)]}
    assert rules.overlaps((1, 3), hunks["x.py"]) and rules.overlaps((10, 15), hunks["x.py"])
    assert not rules.overlaps((5, 9), hunks["x.py"]) and not rules.overlaps((21, 40), hunks["x.py"])


def test_source_files_exclude_tests_vendored_and_other_languages() -> None:
    """Source means a non-test, non-vendored Python, JS/TS, Go or Rust file."""
    assert rules.is_source("src/pkg/core.py") and rules.is_source("lib/x.ts") and rules.is_source("cmd/main.go")
    for path in ("tests/test_core.py", "pkg/core_test.go", "src/x.spec.ts", "pip/_vendor/requests/api.py",
                 "lib/types.d.ts", "README.md", "setup.cfg", "docs/conf.py"):
        assert not rules.is_source(path), path


def test_evaluation_repositories_and_their_copies_are_refused(tmp_path: Path) -> None:
    """An eval repository, a fork under another owner or a name embedding one is refused, and the manifest's sources hold none."""
    for name in ("psf/requests", "someone/requests", "x/django-rest-framework", "me/pvlib-python", "a/scikit-learn"):
        assert rules.is_eval_repo(name), name
    for name in ("encode/starlette", "python-attrs/attrs", "sharkdp/fd"):
        assert not rules.is_eval_repo(name), name
    assert not [r for r, *_ in manifest.SOURCES if rules.is_eval_repo(r)]
    with pytest.raises(ValueError, match="evaluation repository"):
        mine_repo({"repo": "pallets/flask", "commit": "0" * 40}, tmp_path, tmp_path, 10, 10, 10)


def test_the_manifest_pins_every_source_with_its_licence_and_split() -> None:
    """The committed manifest pins at least 60 sources by commit, 15 or more outside Python, 5 or more held out for validation."""
    entries = json.loads((Path(manifest.__file__).parent / "manifest.json").read_text())["repositories"]
    assert len(entries) >= 60
    assert sum(e["language"] != "python" for e in entries) >= 15
    assert sum(e["split"] == "validation" for e in entries) >= 5
    for e in entries:
        assert len(e["commit"]) == 40 and e["licence"] and e["why"] and not rules.is_eval_repo(e["repo"])


def test_docstrings_are_removed_from_the_passage() -> None:
    """A Python definition's docstring is the question and is gone from the passage; Go, Rust and TS doc comments are found above."""
    src = 'import x\n\n\n@dec\ndef add(a, b):\n    """Add two numbers.\n\n    Longer text."""\n    return a + b\n'
    (d,) = definitions(src, "m.py")
    assert d.doc == "Add two numbers.\n\nLonger text." and (d.start_line, d.end_line) == (4, 9)
    assert d.passage == "@dec\ndef add(a, b):\n    return a + b" and "Add two" not in d.passage
    (g,) = definitions("package a\n\n// Open opens the file.\n// It retries.\nfunc Open() {}\n\nfunc Bare() {}\n", "a.go")
    assert g.doc == "Open opens the file.\nIt retries." and g.passage == "func Open() {}"
    (r,) = definitions("/// Parses a line.\n#[inline]\npub fn parse() {}\n// plain comment\nfn g() {}\n", "a.rs")
    assert r.doc == "Parses a line." and r.passage == "pub fn parse() {}"
    (t,) = definitions("/** Formats a date.\n * In UTC. */\nexport function fmt() {}\n// not a doc\nfunction h() {}\n", "a.ts")
    assert t.doc == "Formats a date.\nIn UTC." and t.passage == "export function fmt() {}"


def test_bm25_ranks_the_document_with_the_rare_term_first() -> None:
    """The miner's BM25 puts a document with the query's rare term above ones with only common terms, and skips excluded ones."""
    docs = [["retry", "self", "self"], ["timeout", "retry", "backoff", "self"], ["self", "data"], ["backoff", "jitter"]]
    index = Bm25(docs)
    assert index.top(["jitter", "self"], 2)[0] == 3
    assert 3 not in index.top(["jitter", "self"], 2, exclude={3})
    assert index.top(["backoff", "self"], 2) == [1, 3]  # the rare term and a common one beat the rare one alone
    assert index.top(["absent"], 4) == []
    assert index.score_with(["jitter"], ["jitter", "x"]) > index.score_with(["self"], ["self", "x"])


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "Ann", "GIT_AUTHOR_EMAIL": "ann@example.org", "GIT_COMMITTER_NAME": "Ann",
           "GIT_COMMITTER_EMAIL": "ann@example.org", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env).stdout


def _func(name: str, body_lines: int, marker: str = "value") -> str:
    lines = [f"def {name}(items, limit):", f'    """Handle {name.replace("_", " ")} for the items."""']
    lines += [f"    {marker}_{i} = items[{i}] * limit  # {name} step {i}" for i in range(body_lines)]
    return "\n".join(lines + [f"    return {marker}_0", "", ""])


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A repository of three source files and a test file, then one commit that changes one function of pool.py."""
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    pool_v1 = _func("connect_pool", 12) + _func("retry_request_timeout", 12) + _func("close_pool", 12)
    (work / "pkg").mkdir()
    (work / "tests").mkdir()
    (work / "pkg" / "pool.py").write_text(pool_v1)
    (work / "pkg" / "retry.py").write_text(_func("retry_backoff_timeout", 14) + _func("retry_jitter_timeout", 14))
    (work / "pkg" / "other.py").write_text(_func("parse_headers", 14) + _func("format_cookie", 14))
    (work / "tests" / "test_pool.py").write_text(_func("test_retry_request_timeout", 6))
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "Add the first version of the connection pool")
    parent = _git(work, "rev-parse", "HEAD").strip()
    pool_v2 = pool_v1.replace("value_5 = items[5] * limit  # retry_request_timeout step 5",
                              "value_5 = items[5] * limit * 2  # retry_request_timeout step 5, doubled")
    (work / "pkg" / "pool.py").write_text(pool_v2)
    (work / "tests" / "test_pool.py").write_text(_func("test_retry_request_timeout", 7))
    _git(work, "commit", "-q", "-am",
         "Double the retry request timeout for slow pools (#77)\n\nSlow pools gave up too early.\n\nSigned-off-by: Ann <ann@example.org>")
    child = _git(work, "rev-parse", "HEAD").strip()
    mirror = tmp_path / "mirror"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror / "me+pool" / "repo")], check=True)
    return mirror, {"parent": parent, "child": child, "pool_v1": pool_v1, "pool_v2": pool_v2}


def test_a_change_query_is_asked_of_the_parent_tree_with_its_changed_chunks_positive(history, tmp_path: Path) -> None:
    """The question is the cleaned message, the positives are the parent's chunks overlapping the changed lines, the negatives other files' chunks."""
    mirror, info = history
    out = tmp_path / "out"
    out.mkdir()
    stats = mine_repo({"repo": "me/pool", "commit": info["child"], "language": "python"}, mirror, out, 10, 10, 10)
    rows = [json.loads(line) for line in gzip.open(out / "me+pool.jsonl.gz", "rt")]
    (change,) = [r for r in rows if r["kind"] == "change"]
    assert change["query"] == "Double the retry request timeout for slow pools\n\nSlow pools gave up too early."
    assert change["parent"] == info["parent"] and change["commit"] == info["child"]
    assert [(p["path"]) for p in change["positives"]] == ["pkg/pool.py"]
    pos = change["positives"][0]
    # the parent's text (v1), not the commit's, and the chunk holding the changed line
    assert "value_5 = items[5] * limit  # retry_request_timeout step 5" in pos["text"]
    assert "doubled" not in pos["text"]
    lines = info["pool_v1"].split("\n")
    changed_line = next(i + 1 for i, ln in enumerate(lines) if "retry_request_timeout step 5" in ln)
    assert pos["start"] <= changed_line <= pos["end"]
    assert "connect_pool" not in pos["text"] or "close_pool" not in pos["text"]
    # negatives: other source files (never the test file, never the changed file), keyword-ranked
    assert change["negatives"] and all(n["path"] in ("pkg/retry.py", "pkg/other.py") for n in change["negatives"])
    assert change["negatives"][0]["path"] == "pkg/retry.py"
    assert stats["commits"] == 2 and stats["root"] == 1 and stats["change_queries"] == 1
    # docstring queries at the pinned commit, docstring removed from the passage
    docs = [r for r in rows if r["kind"] == "doc"]
    assert any(r["query"] == "Handle retry jitter timeout for the items." and '"""' not in r["positives"][0]["text"] for r in docs)
    assert not [r for r in docs if r["positives"][0]["path"].startswith("tests/")]


def test_only_messages_that_quote_a_traceback_are_mined_with_only_frames(history, tmp_path: Path) -> None:
    """With only_frames a message without a traceback is dropped, a traceback commit is kept, and max_docs 0 skips the docstrings."""
    mirror, info = history
    work = tmp_path / "work"
    pool = (work / "pkg" / "pool.py").read_text()
    (work / "pkg" / "pool.py").write_text(pool.replace("value_6 = items[6] * limit", "value_6 = items[6] * max(limit, 1)"))
    _git(work, "commit", "-q", "-am", "Fix the crash of connect pool on an empty limit\n\nTraceback (most recent call last):\n"
         '  File "/srv/app/pkg/pool.py", line 30, in connect_pool\n    value_6 = items[6] * limit\nZeroDivisionError: division by zero')
    crash = _git(work, "rev-parse", "HEAD").strip()
    _git(work, "push", "-q", str(mirror / "me+pool" / "repo"), "main")
    out = tmp_path / "tb"
    out.mkdir()
    stats = mine_repo({"repo": "me/pool", "commit": crash}, mirror, out, 10, 0, 10, only_frames=True)
    rows = [json.loads(line) for line in gzip.open(out / "me+pool.jsonl.gz", "rt")]
    assert [r["commit"] for r in rows] == [crash] and rows[0]["kind"] == "change"
    assert stats["no_traceback"] == 1 and stats["change_queries"] == 1 and stats["doc_queries"] == 0


def test_the_traceback_validation_repositories_are_neither_eval_nor_training_sources() -> None:
    """bench/traceback_repos.json pins each repository by commit, and none is an eval repository or in the training manifest."""
    training = {e["repo"] for e in json.loads((Path(manifest.__file__).parent / "manifest.json").read_text())["repositories"]}
    entries = json.loads((Path(__file__).resolve().parents[1] / "bench" / "traceback_repos.json").read_text())["repositories"]
    assert entries
    for e in entries:
        assert len(e["commit"]) == 40 and e["licence"] and e["split"] == "validation-traceback"
        assert not rules.is_eval_repo(e["repo"]) and e["repo"] not in training


def test_mining_twice_gives_the_same_bytes_and_a_finished_repository_is_skipped(history, tmp_path: Path) -> None:
    """The miner's output is deterministic, and a repository already mined is not mined again (a killed run resumes)."""
    mirror, info = history
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        out.mkdir()
        mine_repo({"repo": "me/pool", "commit": info["child"]}, mirror, out, 10, 10, 10)
        outs.append((out / "me+pool.jsonl.gz").read_bytes())
    assert outs[0] == outs[1]
    marker = tmp_path / "a" / "me+pool.stats.json"
    before = marker.stat().st_mtime_ns
    mine_repo({"repo": "me/pool", "commit": info["child"]}, mirror, tmp_path / "a", 10, 10, 10)
    assert marker.stat().st_mtime_ns == before


def test_blobs_and_missing_paths_read_through_one_batch_process(history) -> None:
    """Repo.blob reads commit:path through git cat-file --batch and answers None for a path the commit lacks."""
    mirror, info = history
    repo = Repo(mirror / "me+pool" / "repo")
    try:
        assert repo.text(f"{info['parent']}:pkg/pool.py") == info["pool_v1"]
        assert repo.text(f"{info['child']}:pkg/pool.py") == info["pool_v2"]
        assert repo.blob(f"{info['parent']}:pkg/none.py") is None
        assert [c.sha for c in repo.commits(info["child"])] == [info["child"], info["parent"]]
    finally:
        repo.close()


def _mined_row(commit: str, query: str, pos: list[str], neg: list[str]) -> dict:
    def p(text: str, i: int) -> dict:
        return {"path": f"pkg/m{i}.py", "start": 1 + i, "end": 5 + i, "text": text}

    return {"kind": "change", "commit": commit, "parent": "0" * 40, "query": query,
            "positives": [p(t, i) for i, t in enumerate(pos)], "negatives": [p(t, 10 + i) for i, t in enumerate(neg)]}


def test_the_pack_stores_each_passage_once_and_is_deterministic(tmp_path: Path) -> None:
    """Passages shared by queries are stored once, queries refer to them by id with provenance, and the same input gives the same bytes."""
    from training.corpus.pack import build, read_pack

    rows = {"a/x": [_mined_row("c1", "add retry to the pool", ["def retry(): ...", "def pool(): ..."], ["def other(): ..."]),
                    _mined_row("c2", "fix the pool size check", ["def pool(): ..."], ["def other(): ...", "def more(): ..."])],
            "b/y": [_mined_row("c3", "parse the header line", ["def parse(): ..."], ["def other(): ..."])]}
    split = {"a/x": "train", "b/y": "validation"}
    data, meta = build(rows, split, changes=10, docs=10, positives=3, negatives=4, manifest_digest="d")
    assert build(rows, split, 10, 10, 3, 4, "d")[0] == data
    path = tmp_path / "pack.jsonl.xz"
    path.write_bytes(data)
    meta2, passages, queries = read_pack(path)
    assert meta2["queries"] == {"train_change": 2, "validation_change": 1} and meta == meta2 | {"t": "meta"}
    assert sorted(passages) == sorted({"def retry(): ...", "def pool(): ...", "def other(): ...", "def more(): ...",
                                       "def parse(): ..."})
    by_query = {q["query"]: q for q in queries}
    q = by_query["fix the pool size check"]
    assert passages[q["pos"][0][0]] == "def pool(): ..." and q["pos"][0][1:] == ["pkg/m0.py", 1, 5]
    assert [passages[n[0]] for n in q["neg"]] == ["def other(): ...", "def more(): ..."]
    assert by_query["parse the header line"]["split"] == "validation" and q["commit"] == "c2" and q["repo"] == "a/x"
    # caps: one change query per repository, one negative each
    _, small = build(rows, split, changes=1, docs=1, positives=1, negatives=1, manifest_digest="d")
    assert small["queries"] == {"train_change": 1, "validation_change": 1}


def test_long_lists_keep_every_teachable_long_question_and_draw_as_many_short_ones(tmp_path: Path) -> None:
    """long_lists writes every teachable list whose question is issue-sized, then a seeded draw of as many short ones; lists without a gold and an other candidate are left out."""
    from training.corpus import long_lists

    def row(query: str, golds: list[bool]) -> dict:
        return {"query": query, "rerank_query": query[:50], "candidates": [{"path": f"f{i}.py", "text": "x", "gold": g} for i, g in enumerate(golds)]}

    src = tmp_path / "lists"
    src.mkdir()
    rows = [row("L" * 400, [True, False]), row("L" * 500, [True, True]), row("s1", [False, True]), row("s2", [True, False]),
            row("s3", [False, False]), row("L" * 301, [False, True, False])]
    with gzip.open(src / "a+b.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    assert long_lists.main(["--src", str(src), "--out", str(tmp_path / "out")]) == 0
    with gzip.open(tmp_path / "out" / "lists.jsonl.gz", "rt", encoding="utf-8") as fh:
        got = [json.loads(line)["query"] for line in fh]
    assert got[:2] == ["L" * 400, "L" * 301]
    assert sorted(got[2:]) == ["s1", "s2"]
    long, short = long_lists.split_lists(src, keep_all=True)
    assert (len(long), len(short)) == (3, 3)
