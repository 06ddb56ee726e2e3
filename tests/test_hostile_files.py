"""Hostile files: every file a workspace holds ends indexed or skipped with a reason the log names,
whatever its depth, its links or what its grammar makes of it; none is dropped in silence."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from daemons.lib.chunking import ChunkSettings, chunk_text, file_chunks
from daemons.lib.filtering import OUTSIDE_TARGET, WorkspaceFilter
from daemons.lib.languages import GrammarTimeLimit, parse
from tests.support import open_table, register, wait_until

PIPELINE = ("watcher", "chunker", "embedder")
DEEP_NAME = "level_{:03d}_of_a_deep_tree"  # 200 of them make a path of over 5,000 bytes, past PATH_MAX


def make_deep_file(root: Path, levels: int = 200) -> str:
    """A file *levels* folders down, made through folder descriptors since its path is too long to open."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for i in range(levels):
            os.mkdir(DEEP_NAME.format(i), dir_fd=fd)
            nfd = os.open(DEEP_NAME.format(i), os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        wfd = os.open("deep.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, b"def deep_down():\n    return 'found'\n")
        os.close(wfd)
    finally:
        os.close(fd)
    return "/".join([*(DEEP_NAME.format(i) for i in range(levels)), "deep.py"])


def files_on_disk(root: Path) -> set[str]:
    """Every regular file and link under *root*, walked through folder descriptors (no path limit)."""
    found: set[str] = set()

    def walk(fd: int, rel: str) -> None:
        with os.scandir(fd) as it:
            for entry in it:
                path = f"{rel}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    try:
                        sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                    except PermissionError:
                        found.add(path + "/")
                        continue
                    try:
                        walk(sub, path + "/")
                    finally:
                        os.close(sub)
                else:
                    found.add(path)

    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk(top, "")
    finally:
        os.close(top)
    return found


def hostile_tree(root: Path, outside: Path) -> dict[str, str]:
    """Fill *root* with files of every hostile kind; ``{path: what should become of it}``."""
    root.mkdir(parents=True)
    (root / "ok.py").write_text("def ok():\n    return 1\n")
    deep = make_deep_file(root)
    outside.write_text("secret = 1\n")
    (root / "out.py").symlink_to(outside)
    (root / "loop_a.py").symlink_to("loop_b.py")
    (root / "loop_b.py").symlink_to("loop_a.py")
    (root / "dangling.py").symlink_to("nowhere.py")
    (root / "minified.js").write_text("var x = " + "(" * 30000 + ")" * 30000 + ";\n")
    # a grammar that needs long for it: split as plain text once the (small, here) time limit is spent
    (root / "pages.html").write_text("<div>\n" * 4000 + "</div>\n" * 4000)
    return {"ok.py": "indexed", deep: "skipped", "out.py": "skipped", "loop_a.py": "skipped", "loop_b.py": "skipped",
            "dangling.py": "skipped", "minified.js": "skipped", "pages.html": "indexed"}


def test_a_grammar_past_its_time_limit_is_cancelled() -> None:
    """languages.parse raises GrammarTimeLimit once the grammar has used its CPU time on one file, and parses it without a limit."""
    text = "<div>\n" * 20000 + "</div>\n" * 20000
    with pytest.raises(GrammarTimeLimit):
        parse(text, "html", time_limit_ms=1)
    assert parse(text, "html").root_node.child_count > 0


def test_a_file_past_its_grammars_time_limit_is_split_as_plain_text_and_says_why() -> None:
    """chunk_text and file_chunks split such a file as plain text, covering all of it, and tell on_plain the time limit was the reason."""
    text = "<div>\n" * 20000 + "</div>\n" * 20000
    reasons: list[str] = []
    chunks = file_chunks(text, "pages.html", ChunkSettings(parse_time_limit_ms=1), on_plain=reasons.append)
    assert chunks and chunks[0].start_line == 1 and chunks[-1].end_line == text.count("\n")
    assert len(reasons) == 1 and "time limit (1 ms)" in reasons[0]
    heard: list[str] = []
    assert chunk_text("def f():\n    return 1\n", "f.py", ChunkSettings(parse_time_limit_ms=2000), heard.append)
    assert heard == []  # an ordinary file is cut by its grammar, silently


def test_the_walk_names_what_it_passes_by(tmp_path: Path) -> None:
    """iter_files tells on_skip of a folder it cannot list, a link out, a link loop and a dangling link, and yields the rest."""
    root = tmp_path / "w"
    expected = hostile_tree(root, tmp_path / "secret.py")
    skips: dict[str, str] = {}
    files = set(WorkspaceFilter(root).iter_files(on_skip=skips.__setitem__))
    assert {"ok.py", "minified.js", "pages.html"} == files
    assert skips["out.py"] == OUTSIDE_TARGET
    assert skips["loop_a.py"] == skips["loop_b.py"] == "a link loop"
    assert skips["dangling.py"].startswith("a link to nothing")
    deep = next(p for p in expected if p.endswith("deep.py"))
    unlisted = [p for p in skips if p.endswith("/") and deep.startswith(p)]
    assert len(unlisted) == 1 and "File name too long" in skips[unlisted[0]], skips


@pytest.mark.timeout(240)
def test_every_hostile_file_ends_indexed_or_skipped_with_a_logged_reason(daemons, env, short_tmp) -> None:
    """Against the real pipeline, each file of a hostile tree is in the table or named (itself or its folder) in a file_skipped line, and nothing stays pending."""
    root = short_tmp / "w"
    expected = hostile_tree(root, short_tmp / "secret.py")
    unreadable = root / "private.py"
    unreadable.write_text("def private():\n    return 0\n")
    unreadable.chmod(0)
    root_user = os.geteuid() == 0  # root reads it anyway: then it is indexed
    expected["private.py"] = "indexed" if root_user else "skipped"
    wid = register(env["WSCTX_DATA_DIR"], root)
    d = daemons(PIPELINE, {**env, "WSCTX_PARSE_TIME_LIMIT_MS": "1"})
    d.start()
    try:
        def settled() -> bool:
            ws = d.status("watcher").details["workspaces"].get(wid) or {}
            return ws.get("pending") == 0 and ws.get("files", 0) >= 1 and ws.get("skipped", 0) >= 6

        wait_until(settled, 180, 0.3, message=lambda: f"{d.status('watcher').details} {d.log_tail()}")
        store = open_table(d.data_dir, root)
        assert store is not None
        indexed = set(store.table.search().select(["path"]).limit(None).to_arrow().column("path").to_pylist())
        skipped = {e["path"]: e["reason"] for e in d.log_events("watcher", "file_skipped")}
        on_disk = files_on_disk(root)
        assert set(expected) <= on_disk
        for path in on_disk:
            named = path in skipped or any(p.endswith("/") and path.startswith(p) for p in skipped)
            assert (path in indexed) != named, (path, path in indexed, named)
            assert (path in indexed) == (expected[path] == "indexed"), (path, skipped.get(path))
        plain = d.log_events("chunker", "chunked_as_plain_text")
        assert {e["path"] for e in plain} == {"pages.html"} and "time limit" in plain[0]["reason"]
        # two more reconciles (2 s apart here): the skipped files are not sent again, nothing is pending
        reconciles, chunked = d.counter("watcher", "reconciles"), d.counter("chunker", "files.chunked")
        wait_until(lambda: d.counter("watcher", "reconciles") >= reconciles + 2, 60, 0.3)
        assert d.status("watcher").details["workspaces"][wid]["pending"] == 0
        assert d.counter("chunker", "files.chunked") == chunked
    finally:
        unreadable.chmod(stat.S_IRUSR | stat.S_IWUSR)
