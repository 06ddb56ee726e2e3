"""The watcher's walks: a walk of a huge tree holds up neither another workspace's new files nor the
control socket, ends when its workspace is removed, and stops at its bounds without deleting what
it did not reach."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from daemons import cli
from tests.support import open_table, register, wait_until


def many_files(root: Path, folders: int, per_folder: int = 100) -> None:
    for i in range(folders):
        folder = root / f"pkg{i:04d}"
        folder.mkdir(parents=True)
        for j in range(per_folder):
            (folder / f"m{j:03d}.py").write_text(f"VALUE_{i}_{j} = {i * j}\n")


def workspace_status(d, wid: str) -> dict:
    return d.status("watcher").details["workspaces"].get(wid) or {}


@pytest.mark.timeout(300)
def test_a_long_walk_holds_up_no_other_workspace_and_ends_when_its_workspace_is_removed(daemons, env, short_tmp) -> None:
    """While the watcher walks 20,000 files of one workspace, a new file of another is seen first, and `wsctx remove` ends the walk at once."""
    big, small = short_tmp / "big", short_tmp / "small"
    many_files(big, 200)
    small.mkdir()
    (small / "first.py").write_text("FIRST = 1\n")
    big_id, small_id = register(env["WSCTX_DATA_DIR"], big), register(env["WSCTX_DATA_DIR"], small)
    d = daemons(["watcher"], env)
    d.start()
    wait_until(lambda: workspace_status(d, small_id).get("files") == 1, 60, 0.1, message=lambda: d.log_tail())
    assert workspace_status(d, big_id).get("walking_s") is not None, workspace_status(d, big_id)
    (small / "second.py").write_text("SECOND = 2\n")
    wait_until(lambda: workspace_status(d, small_id).get("files") == 2, 60, 0.1, message=lambda: d.log_tail())
    # the new file came through while the big walk still ran
    walking = workspace_status(d, big_id)
    assert walking.get("walking_s") is not None and walking.get("last_reconcile") == 0.0, walking
    assert cli.main(["--runtime-dir", d.runtime_dir, "--data-dir", d.data_dir, "remove", big_id]) == 0
    wait_until(lambda: d.log_events("watcher", "walk_abandoned"), 30, 0.1, message=lambda: d.log("watcher")[-3000:])
    assert big_id not in d.status("watcher").details["workspaces"]
    assert d.status("watcher").details["reconciling"] is None or d.status("watcher").details["reconciling"]["workspace"] != big_id
    assert not [e for e in d.log_events("watcher", "reconcile") if e["workspace"] == big_id]  # it never finished


@pytest.mark.timeout(300)
def test_a_walk_stopped_at_its_bound_indexes_what_it_saw_and_deletes_nothing(daemons, env, short_tmp) -> None:
    """With walk_max_entries below the tree's size, the walk stops with a logged reason and a status note, and the rows of files it did not reach stay."""
    root = short_tmp / "w"
    many_files(root, 4, 50)
    wid = register(env["WSCTX_DATA_DIR"], root)
    d = daemons(["watcher", "chunker", "embedder"], env)
    d.start()

    def indexed() -> int:
        store = open_table(d.data_dir, root)
        return len(store.catalog()) if store else 0

    wait_until(lambda: indexed() == 200 and workspace_status(d, wid).get("pending") == 0, 180, 0.3, message=lambda: d.log_tail())
    d.terminate("watcher")
    d.start("watcher", WSCTX_WALK_MAX_ENTRIES="60")
    wait_until(lambda: d.log_events("watcher", "walk_stopped"), 60, 0.2, message=lambda: d.log("watcher")[-3000:])
    reconciles = d.counter("watcher", "reconciles")
    wait_until(lambda: d.counter("watcher", "reconciles") >= reconciles + 2, 60, 0.2)
    ws = workspace_status(d, wid)
    assert "walk_max_entries (60)" in ws["walk_stopped"] and ws["files"] < 60, ws
    assert d.counter("watcher", "events.deleted") == 0
    time.sleep(1)  # anything sent would be written by now
    assert indexed() == 200
