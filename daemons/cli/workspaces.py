"""``wsctx status``, ``add``, ``rebuild``, ``remove`` and ``gc``: the registered workspaces and their indexes."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from daemons.status_report import (
    NOT_RUNNING, PROGRESS_EVERY_S, format_daemons, format_workspaces, indexing_done, progress_line, still_indexing,
)
from daemons.cli.common import CLIError, settings_of, control, gather_status, is_up, resolve_workspace


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    data = gather_status(settings)
    if args.wait:
        started = time.monotonic()
        deadline = started + args.timeout
        first_indexed = sum(e["indexed_files"] or 0 for e in still_indexing(data["workspaces"]).values())
        tty = sys.stderr.isatty()
        last_print, last_line = 0.0, ""
        try:
            while not indexing_done(data["workspaces"]):
                line = progress_line(data["workspaces"], first_indexed, time.monotonic() - started)
                if tty:  # one line, rewritten in place
                    print(f"\r{line:<{max(len(last_line), len(line))}}", end="", file=sys.stderr, flush=True)
                    last_line = line
                elif line != last_line and time.monotonic() - last_print >= PROGRESS_EVERY_S:
                    print(line, file=sys.stderr, flush=True)
                    last_print, last_line = time.monotonic(), line
                for needed in ("watcher", "chunker", "embedder"):
                    if data["daemons"][needed]["state"] == "down" and time.monotonic() > started + 10:
                        _print_status(data, args.json)
                        raise CLIError(f"{needed} is not running, so indexing cannot finish: start it with `wsctx up`")
                blocked = [p for e in data["workspaces"].values() for p in e["problems"] if p.startswith("rebuild needed")]
                if blocked:
                    raise CLIError(blocked[0])
                if time.monotonic() > deadline:
                    left = {w: e["pending"] for w, e in still_indexing(data["workspaces"]).items()}
                    _print_status(data, args.json)
                    raise CLIError(f"indexing not done after {args.timeout:g} s (pending: {left})")
                time.sleep(1.0)
                data = gather_status(settings)
        finally:
            if tty and last_line:  # end the rewritten line before anything else is printed
                print(file=sys.stderr)
    _print_status(data, args.json)
    return 0


def _print_status(data: dict[str, Any], as_json: bool) -> None:
    statuses = data.pop("_statuses", None) or {}
    slow = data.pop("_slow", None) or {}
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
        return
    print(format_daemons(statuses, slow))
    print()
    if statuses and all(st is None for st in statuses.values()) and not slow and not data["workspaces"]:
        print(NOT_RUNNING)  # with workspaces, each one's problems say so
    print(format_workspaces(data["workspaces"]))


def cmd_add(args: argparse.Namespace) -> int:
    from daemons.lib.workspaces import Registry, broad_root_problem, root_problem
    from protocol.errors import ProtocolError
    from protocol.schema import ReconcileRequest, WorkspaceAddRequest

    settings = settings_of(args)
    problem = root_problem(args.path)
    if problem:
        raise CLIError(problem)
    broad = broad_root_problem(args.path)
    if broad and not args.force:
        raise CLIError(f"refusing to add {args.path}: {broad}, and the watcher would index all of it "
                       "(add the project folder instead, or pass --force)")
    try:
        wid, root = Registry(settings.data_dir).add(args.path)
    except ProtocolError as exc:
        raise CLIError(exc.message) from None
    except OSError as exc:  # a full disk, a read-only data dir
        raise CLIError(f"cannot register {args.path}: {exc.strerror or exc} (writing {Registry(settings.data_dir).path})") from None
    if is_up(settings, "watcher"):
        control(settings, "watcher", WorkspaceAddRequest(path=root))
        control(settings, "watcher", ReconcileRequest(workspace=wid))
    else:
        print("watcher is not running: the workspace is indexed once `wsctx up` has started it", file=sys.stderr)
    print(wid)
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from protocol.schema import RebuildRequest

    settings = settings_of(args)
    wid, root = resolve_workspace(settings, args.workspace)
    control(settings, "embedder", RebuildRequest(workspace=wid), timeout_ms=60_000, what="the rebuild request")
    print(f"rebuilding {wid} ({root}): follow it with `wsctx status`")
    return 0


def _drop_workspace(settings, wid: str) -> int:
    """Unregister *wid* and delete its index folder (by the embedder when it runs, since it writes
    the index folders; else here); the bytes freed."""
    from daemons.lib.workspaces import Registry, remove_index
    from protocol.schema import ReconcileRequest, WorkspaceRemoveRequest

    Registry(settings.data_dir).remove(wid)
    if is_up(settings, "watcher"):
        control(settings, "watcher", ReconcileRequest(workspace=""))  # it drops workspaces no longer registered
    if is_up(settings, "embedder"):
        return control(settings, "embedder", WorkspaceRemoveRequest(workspace=wid), timeout_ms=60_000, what="the remove request").freed_bytes
    return remove_index(settings.data_dir, wid)


def cmd_remove(args: argparse.Namespace) -> int:
    """Unregister a workspace: the watcher stops watching it and its index folder is deleted."""
    settings = settings_of(args)
    wid, root = resolve_workspace(settings, args.workspace)
    freed = _drop_workspace(settings, wid)
    print(f"removed {wid} ({root}): its index is deleted, {freed / 1e6:.1f} MB freed; the folder itself is untouched")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """Drop the indexes nothing needs: of registered workspaces whose folder no longer exists, and
    index folders of no registered workspace. Lists them and asks first, unless --yes."""
    from daemons.lib.workspaces import Registry, folder_bytes, index_dir, is_workspace_id

    settings = settings_of(args)
    entries = Registry(settings.data_dir).load()
    gone = {wid: root for wid, root in entries.items() if not Path(root).is_dir()}
    indexes = Path(settings.data_dir) / "indexes"
    orphans = sorted(p.name for p in indexes.iterdir() if p.is_dir() and p.name not in entries and is_workspace_id(p.name)) if indexes.is_dir() else []
    if not gone and not orphans:
        print("nothing to collect: every index belongs to a registered workspace whose folder exists")
        return 0
    for wid, root in sorted(gone.items()):
        print(f"  {wid}: folder {root} no longer exists ({folder_bytes(index_dir(settings.data_dir, wid)) / 1e6:.1f} MB)")
    for wid in orphans:
        print(f"  {wid}: index of no registered workspace ({folder_bytes(index_dir(settings.data_dir, wid)) / 1e6:.1f} MB)")
    if not args.yes:
        answer = input(f"delete these {len(gone) + len(orphans)} indexes? [y/N] ") if sys.stdin.isatty() else ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted (pass --yes to delete without asking)")
            return 1
    freed = sum(_drop_workspace(settings, wid) for wid in sorted(gone) + orphans)
    print(f"deleted {len(gone) + len(orphans)} indexes, {freed / 1e6:.1f} MB freed")
    return 0
