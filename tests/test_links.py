"""Links, ignore files and the product's own folders: a link inside the workspace is indexed under
its own path (never pending for good), an ignore file or a file read through a link that leads out
is never read, and the data and runtime dirs inside a workspace are never indexed."""
from __future__ import annotations

from pathlib import Path

import pytest

from daemons.lib.filtering import OUTSIDE_TARGET, WorkspaceFilter, read_file
from daemons.lib.workspaces import read_inside, safe_relpath
from protocol.errors import BadMessage
from tests.support import open_table, register, table_mismatches, wait_until

PIPELINE = ("watcher", "chunker", "embedder")


def table_paths(data_dir: str, root: Path) -> set[str]:
    store = open_table(data_dir, root)
    if store is None:
        return set()
    return set(store.table.search().select(["path"]).limit(None).to_arrow().column("path").to_pylist())


def test_a_link_inside_keeps_its_own_path_and_one_out_is_refused(tmp_path: Path) -> None:
    """safe_relpath gives an in-tree link its own path, a path through a link out BadMessage, and '..' the resolved path."""
    root = tmp_path / "w"
    (root / "crate").mkdir(parents=True)
    (root / "crate" / "README.md").write_text("# crate\n")
    (root / "README.md").symlink_to("crate/README.md")
    (tmp_path / "secret.txt").write_text("secret\n")
    (root / "out.txt").symlink_to(tmp_path / "secret.txt")
    assert safe_relpath(root, "README.md") == "README.md"
    assert safe_relpath(root, str(root / "README.md")) == "README.md"
    assert safe_relpath(root, "crate/../README.md") == "crate/README.md"  # the link's target: ".." is not lexical after a link
    for bad in ("out.txt", "../secret.txt", str(tmp_path / "secret.txt")):
        with pytest.raises(BadMessage):
            safe_relpath(root, bad)


def test_a_file_is_read_only_if_what_is_opened_lies_inside(tmp_path: Path) -> None:
    """read_inside and read_file(root=) refuse a link that points out at the moment of reading, and read it again once it points in."""
    root = tmp_path / "w"
    root.mkdir()
    (root / "inner.py").write_text("x = 1\n")
    (tmp_path / "secret.py").write_text("password = 'hunter2'\n")
    link = root / "swap.py"
    link.symlink_to(root / "inner.py")
    assert read_inside(root, "swap.py") == b"x = 1\n"
    # swapped after any check a caller made: the read itself refuses
    link.unlink()
    link.symlink_to(tmp_path / "secret.py")
    with pytest.raises(PermissionError):
        read_inside(root, "swap.py")
    verdict, data = read_file(link, 1000, root=root)
    assert data is None and verdict.reason == OUTSIDE_TARGET
    assert read_file(link, 1000)[1] is not None  # without a root nothing is checked (the caller's own files)


def test_an_ignore_file_that_links_out_is_not_read(tmp_path: Path) -> None:
    """A .gitignore (and .git/info/exclude) that is a link to a file outside the workspace is never read, so its lines neither apply nor reach the log."""
    root = tmp_path / "w"
    (root / ".git" / "info").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.write_text("secret-line-*.py\n[z-a]\n")
    (root / ".gitignore").symlink_to(outside)
    (root / ".git" / "info" / "exclude").symlink_to(outside)
    (root / "secret-line-1.py").write_text("x = 1\n")
    heard: list[tuple[str, list[str]]] = []
    filt = WorkspaceFilter(root, on_bad_lines=lambda name, lines: heard.append((name, lines)))
    assert "secret-line-1.py" in set(filt.iter_files())
    assert heard == []
    # an in-tree link to an in-tree ignore file is read as before
    (root / "ignores").write_text("secret-line-*.py\n")
    (root / ".gitignore").unlink()
    (root / ".gitignore").symlink_to("ignores")
    assert "secret-line-1.py" not in set(WorkspaceFilter(root).iter_files())


@pytest.mark.timeout(180)
def test_links_inside_the_workspace_are_indexed_under_their_own_paths_and_nothing_stays_pending(daemons, env, workspace) -> None:
    """README.md -> crate/README.md and LICENSE -> ../LICENSE links are indexed under their own names; the workspace reaches zero pending."""
    (workspace / "crate" / "src").mkdir(parents=True)
    (workspace / "crate" / "README.md").write_text("# The crate\n\nParses invoices.\n")
    (workspace / "crate" / "src" / "lib.rs").write_text("pub fn parse_invoice(text: &str) -> usize {\n    text.len()\n}\n")
    (workspace / "LICENSE").write_text("MIT License\n\nPermission is hereby granted.\n")
    (workspace / "README.md").symlink_to("crate/README.md")
    (workspace / "crate" / "LICENSE").symlink_to("../LICENSE")
    wid = register(env["WSCTX_DATA_DIR"], workspace)
    d = daemons(PIPELINE)
    d.start()

    def settled() -> bool:
        ws = d.status("watcher").details["workspaces"].get(wid) or {}
        return ws.get("files") == 5 and ws.get("pending") == 0

    wait_until(settled, 120, 0.3, message=lambda: f"{d.status('watcher').details} {d.log_tail()}")
    assert {"README.md", "crate/LICENSE", "crate/README.md", "LICENSE", "crate/src/lib.rs"} == table_paths(d.data_dir, workspace)
    assert not table_mismatches(d.data_dir, workspace)


@pytest.mark.timeout(180)
def test_the_data_and_runtime_dirs_inside_a_workspace_are_never_indexed(daemons, env, short_tmp) -> None:
    """A workspace holding the data and runtime dirs (a workspace at $HOME with the defaults) indexes its own files only, and idle reconciles write nothing."""
    root = short_tmp / "home"
    root.mkdir()
    env = {**env, "WSCTX_DATA_DIR": str(root / ".local" / "share" / "wsctx"), "WSCTX_RUNTIME_DIR": str(root / "run")}
    (root / "app.py").write_text("def main():\n    return 'hello'\n")
    wid = register(env["WSCTX_DATA_DIR"], root)
    # what the daemons write there, as supervisord's logs would be, looks like a source file
    logs = Path(env["WSCTX_DATA_DIR"]) / "logs"
    logs.mkdir(parents=True)
    (logs / "notes.py").write_text("def logged():\n    return 1\n")
    d = daemons(PIPELINE, env)
    d.start()
    wait_until(lambda: "app.py" in table_paths(d.data_dir, root), 120, 0.3, message=lambda: d.log_tail())
    wait_until(lambda: (d.status("watcher").details["workspaces"][wid] or {}).get("pending") == 0, 60, 0.3)
    indexed = d.counter("embedder", "files.indexed")
    reconciles = d.counter("watcher", "reconciles")
    # three more reconciles (2 s apart here) while the daemons write their logs and tables
    wait_until(lambda: d.counter("watcher", "reconciles") >= reconciles + 3, 60, 0.3)
    assert d.counter("embedder", "files.indexed") == indexed
    paths = table_paths(d.data_dir, root)
    assert paths == {"app.py"}, paths


@pytest.mark.timeout(180)
def test_a_workspace_folder_deleted_and_made_again_at_once_is_watched_again(daemons, env, workspace) -> None:
    """The root folder removed and made again within a second (often the same inode): new files and edits in it are indexed from the watch, long before the periodic reconcile."""
    import shutil

    (workspace / "a.py").write_text("def alpha():\n    return 1\n")
    register(env["WSCTX_DATA_DIR"], workspace)
    d = daemons(PIPELINE, {**env, "WSCTX_RECONCILE_INTERVAL_S": "300"})
    d.start()
    wait_until(lambda: table_paths(d.data_dir, workspace) == {"a.py"}, 120, 0.3, message=lambda: d.log_tail())
    shutil.rmtree(workspace)
    workspace.mkdir()
    (workspace / "b.py").write_text("def beta():\n    return 2\n")
    wait_until(lambda: table_paths(d.data_dir, workspace) == {"b.py"}, 30, 0.3, message=lambda: d.log("watcher")[-3000:])
    (workspace / "c.py").write_text("def gamma():\n    return 3\n")
    wait_until(lambda: table_paths(d.data_dir, workspace) == {"b.py", "c.py"}, 30, 0.3, message=lambda: d.log("watcher")[-3000:])
    assert not table_mismatches(d.data_dir, workspace)
