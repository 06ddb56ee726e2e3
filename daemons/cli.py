"""``wsctx``: start and stop the daemons, register workspaces, ask questions, inspect models.

Every command talks to the daemons over their ipc sockets under the runtime directory (the
same ``Settings`` the daemons load: defaults, the TOML file, ``WSCTX_*`` variables, then the
global ``--runtime-dir`` / ``--data-dir`` / ``--config`` options). ``up`` and ``down`` drive
supervisord with a config generated from the repository's ``supervisord.conf``.

Exit codes: 0 ok, 1 an error (one line on stderr saying what to do), 2 a usage error.
``WSCTX_DAEMONS`` (a comma list) limits ``up`` to some of the daemons (tests, debugging).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from daemons import DAEMONS
from daemons.supervision import (
    REPO_ROOT, _alive, _supervisor_pid, daemon_processes, log_dir, supervisor_conf, supervisor_env, supervisor_processes,
    supervisor_state, write_supervisor_conf,
)

ARTIFACTS = REPO_ROOT / "models" / "artifacts"
STATUS_TIMEOUT_MS = 700


class CLIError(Exception):
    """An error the user can act on: printed as one line, exit code 1."""


# --------------------------------------------------------------------------- settings and paths


def _settings(args: argparse.Namespace):
    from daemons.lib.config import load_settings

    overrides = {}
    if getattr(args, "runtime_dir", None):
        overrides["runtime_dir"] = os.path.abspath(args.runtime_dir)
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = os.path.abspath(args.data_dir)
    config = getattr(args, "config", None)
    if config and not Path(config).is_file():
        raise CLIError(f"config file {config} does not exist")
    try:
        return load_settings(config_file=config, **overrides)
    except (ValueError, OSError) as exc:
        raise CLIError(f"bad settings: {exc}") from None


def config_path(args: argparse.Namespace) -> str:
    """The TOML file the daemons should read (the same rule as ``load_settings``; it need not exist)."""
    from daemons.lib.config import APP

    chosen = getattr(args, "config", None) or os.environ.get("WSCTX_CONFIG")
    return os.path.abspath(chosen) if chosen else str(Path.home() / ".config" / APP / "config.toml")


def selected_daemons(env: dict[str, str] | None = None) -> list[str]:
    """The daemons ``up`` manages: all of them, or those named in ``WSCTX_DAEMONS``."""
    env = os.environ if env is None else env
    raw = env.get("WSCTX_DAEMONS", "").strip()
    if not raw:
        return list(DAEMONS)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in DAEMONS]
    if unknown:
        raise CLIError(f"WSCTX_DAEMONS names unknown daemons: {', '.join(unknown)} (known: {', '.join(DAEMONS)})")
    return [d for d in DAEMONS if d in names]


def _ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None


# --------------------------------------------------------------------------- talking to daemons


def daemon_status(settings, daemon: str, timeout_ms: int = STATUS_TIMEOUT_MS) -> dict[str, Any] | None:
    """The daemon's StatusReply as a dict, or None when it does not answer."""
    import msgspec

    from daemons.lib import runtime
    from protocol.errors import ProtocolError
    from protocol.schema import StatusRequest

    endpoint = settings.control_endpoint(daemon)
    path = _ipc_path(endpoint)
    if path is not None and not path.exists():
        return None
    try:
        reply = runtime.control_request(endpoint, StatusRequest(), timeout_ms=timeout_ms)
    except ProtocolError:
        return None
    return msgspec.to_builtins(reply.body)


def all_status(settings, daemons: Sequence[str] = DAEMONS) -> dict[str, dict[str, Any] | None]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(daemons)) as pool:
        futures = {d: pool.submit(daemon_status, settings, d) for d in daemons}
        return {d: f.result() for d, f in futures.items()}


def control(settings, daemon: str, body: Any, timeout_ms: int = 5000, what: str = "") -> Any:
    """Send a control request; raise CLIError with a clear message when the daemon is not there."""
    from daemons.lib import runtime
    from protocol.errors import ProtocolError, Timeout

    endpoint = settings.control_endpoint(daemon)
    if not is_up(settings, daemon):
        raise CLIError(f"{daemon} is not running: start it with `wsctx up`")
    try:
        return runtime.control_request(endpoint, body, timeout_ms=timeout_ms).body
    except Timeout:
        raise CLIError(f"{daemon} did not answer{' ' + what if what else ''} within {timeout_ms / 1000:g} s: is it running? (`wsctx status`)") from None
    except ProtocolError as exc:
        raise CLIError(f"{daemon}: {exc.code.value}: {exc.message}") from None


def is_up(settings, daemon: str) -> bool:
    return daemon_status(settings, daemon, timeout_ms=300) is not None


# --------------------------------------------------------------------------- formatting


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_age(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "never"
    return fmt_duration(max(0.0, (now or time.time()) - float(ts))) + " ago"


def fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def daemon_rows(statuses: dict[str, dict[str, Any] | None]) -> list[list[Any]]:
    rows = []
    for name, st in statuses.items():
        if st is None:
            rows.append([name, "down", "-", "-", "-"])
        else:
            rows.append([name, "up", st.get("pid"), fmt_duration(st.get("uptime_s")), st.get("queue_depth", 0)])
    return rows


def format_daemons(statuses: dict[str, dict[str, Any] | None]) -> str:
    return table(["daemon", "state", "pid", "uptime", "queue"], daemon_rows(statuses))


NOT_RUNNING = "wsctx is not running: start it with `wsctx up`"


def workspace_report(settings, statuses: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """Per registered workspace: files on disk, indexed files, chunks, rows, pending, last update, problems."""
    from daemons.lib.store import table_mtime
    from daemons.lib.workspaces import Registry, folder_bytes, index_dir

    watcher = ((statuses.get("watcher") or {}).get("details") or {}).get("workspaces") or {}
    emb_status = statuses.get("embedder")
    emb_details = (emb_status or {}).get("details") or {}
    embedder = emb_details.get("workspaces") or {}
    model_error = emb_details.get("model_error") or ""
    write_error = emb_details.get("write_error") or ""
    writes_failed = emb_details.get("writes_failed") or 0
    out: dict[str, dict[str, Any]] = {}
    # with every daemon down, one plain problem says so, not what each missing daemon would degrade
    all_down = bool(statuses) and all(st is None for st in statuses.values())
    for wid, root in sorted(Registry(settings.data_dir).load().items()):
        w, e = watcher.get(wid), embedder.get(wid)
        problems: list[str] = [NOT_RUNNING] if all_down else []
        entry: dict[str, Any] = {
            "root": root, "files": None, "indexed_files": None, "chunks": None, "rows": None,
            "pending": None, "vectors_pending": None, "skipped": None, "last_update": None, "last_reconcile": None, "problems": problems,
        }
        entry["index_bytes"] = folder_bytes(index_dir(settings.data_dir, wid))
        if not Path(root).is_dir():
            problems.append(f"workspace folder {root} does not exist: `wsctx remove {wid}` or `wsctx gc` drops its index")
        if write_error:
            problems.append(f"writes failing: {_write_reason(write_error)} ({writes_failed} failed); indexing resumes by itself when they succeed")
        if w is not None:
            entry.update(files=w.get("files"), indexed_files=w.get("indexed_files"), pending=w.get("pending"), vectors_pending=w.get("vectors_pending"),
                         skipped=w.get("skipped"), last_reconcile=w.get("last_reconcile") or None)
        elif statuses.get("watcher") is None:
            if not all_down:
                problems.append("watcher is down: files on disk and pending work unknown")
        else:
            busy = ((statuses.get("watcher") or {}).get("details") or {}).get("reconciling")
            problems.append(f"watcher is walking workspace {busy['workspace']} ({busy['for_s']:g} s so far)" if busy
                            else "watcher has not picked this workspace up yet")
        if e is not None:
            if e.get("problem"):
                problems.append(str(e["problem"]) + f" (run `wsctx rebuild {wid}`)")
            entry.update(chunks=e.get("chunks"), rows=e.get("rows"), last_update=e.get("last_update") or None)
            if entry["indexed_files"] is None:
                entry["indexed_files"] = e.get("files")
        else:
            if emb_status is None:
                if not all_down:
                    problems.append("embedder is down: indexing paused, search is keywords-only")
            elif model_error:
                problems.append(f"embedder has no model: {model_error}")
            folder = index_dir(settings.data_dir, wid)
            counts = _table_counts(folder, settings, problems)
            if counts:
                entry.update(chunks=counts["chunks"], rows=counts["rows"], last_update=table_mtime(folder))
                if entry["indexed_files"] is None:
                    entry["indexed_files"] = counts["files"]
        out[wid] = entry
    return out


def _write_reason(error: str) -> str:
    """A failed write's error as a user reads it: ``no space left on device`` rather than the errno dump."""
    low = error.lower()
    for needle, reason in (("no space left", "no space left on device"), ("disk quota", "disk quota exceeded"),
                           ("read-only file system", "read-only file system"), ("permission denied", "permission denied")):
        if needle in low:
            return reason
    return error[:200]


def _table_counts(folder: Path, settings, problems: list[str]) -> dict[str, int] | None:
    try:
        from daemons.lib.store import IndexStore

        store = IndexStore.open_reader(folder)
        if store is None:
            return {"files": 0, "chunks": 0, "rows": 0}
        have = store.meta
        diff = [f"{k} is {have.get(k)!r} in the index but {v!r} now" for k, v in settings.index_shape().items() if k in have and have.get(k) != v]
        if diff:
            problems.append("rebuild needed: " + "; ".join(diff))
        return store.counts()
    except Exception as exc:  # noqa: BLE001 - a table being rebuilt or written right now
        problems.append(f"cannot read the table: {exc}")
        return None


def format_workspaces(report: dict[str, dict[str, Any]], now: float | None = None) -> str:
    if not report:
        return "no workspaces registered (run `wsctx add PATH`)"
    rows = [
        [wid, e["files"], e["indexed_files"], e["chunks"], e["rows"], e["pending"], fmt_age(e["last_update"], now),
         f"{e['index_bytes'] / 1e6:.1f} MB" if e.get("index_bytes") is not None else None]
        for wid, e in report.items()
    ]
    lines = [table(["workspace", "files", "indexed", "chunks", "rows", "pending", "last update", "index"], rows)]
    for wid, e in report.items():
        lines.append(f"  {wid}: {e['root']}")
        if e.get("vectors_pending"):
            lines.append(f"    {e['vectors_pending']} of the pending files are searched by keywords only until their vectors are built")
        for p in e["problems"]:
            lines.append(f"    ! {p}")
    return "\n".join(lines)


def format_ask(reply: dict[str, Any]) -> str:
    """An AskReply (as builtins) for a terminal: blocks, near misses, then the context line."""
    out: list[str] = []
    for block in reply.get("blocks", []):
        head = [f"== {block['label']}"]
        if block.get("probability") is not None:
            head.append(f"p={block['probability']:.2f}")
        if block.get("retrievers"):
            head.append("[" + ", ".join(block["retrievers"]) + "]")
        if block.get("team"):
            head.append(f"(team {block['team']})")
        if block.get("kind") and block["kind"] != "code":
            head.append(f"({block['kind']})")
        if block.get("changed"):
            head.append(f"({block['changed']})")
        out.append("  ".join(head))
        out.append(block.get("text", "").rstrip("\n"))
        out.append("")
    if not reply.get("blocks"):
        out.append("(no code above the threshold)")
        out.append("")
    misses = reply.get("near_misses") or []
    if misses:
        out.append("near misses:")
        for m in misses:
            out.append(f"  {m['label']}  p={m['probability']:.2f}")
        out.append("")
    out.append(reply.get("context_line", ""))
    return "\n".join(out)


# --------------------------------------------------------------------------- commands


def cmd_up(args: argparse.Namespace) -> int:
    settings = _settings(args)
    daemons = selected_daemons()
    if supervisor_state(settings) is not None:
        print(f"wsctx is already up (supervisord in {settings.runtime_dir})")
        print(format_daemons(all_status(settings, daemons)))
        return 0
    try:
        conf = write_supervisor_conf(settings, config_path(args), daemons)
    except OSError as exc:
        raise CLIError(f"cannot prepare {settings.runtime_dir} / {log_dir(settings)}: {exc}") from None
    env = dict(os.environ, **supervisor_env(settings, config_path(args)))
    cmd = [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)]
    if args.foreground:
        cmd.append("--nodaemon")
        child = subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT))
        forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
        signal.signal(signal.SIGINT, forward)
        signal.signal(signal.SIGTERM, forward)
        code = _wait_up(settings, daemons, args.timeout, child)
        if code != 0:
            child.terminate()
        return child.wait() or code
    started = subprocess.run(cmd, env=env, cwd=str(REPO_ROOT), capture_output=True, text=True)
    if started.returncode != 0:
        raise CLIError(f"supervisord did not start: {(started.stderr or started.stdout).strip().splitlines()[-1:] or started.returncode}")
    return _wait_up(settings, daemons, args.timeout)


def _wait_up(settings, daemons: Sequence[str], timeout_s: float, child: subprocess.Popen | None = None) -> int:
    from daemons.lib import runtime
    from protocol.errors import Timeout

    deadline = time.monotonic() + timeout_s
    pending, failed = list(daemons), {}
    while pending and time.monotonic() < deadline:
        if child is not None and child.poll() is not None:
            raise CLIError(f"supervisord exited with code {child.returncode}")
        procs = supervisor_processes(settings)
        for d in list(pending):
            state = procs.get(d, {}).get("statename")
            if state in ("FATAL", "EXITED"):
                failed[d] = state
                pending.remove(d)
                continue
            try:
                runtime.wait_ready(settings.control_endpoint(d), timeout_s=0.2)
                pending.remove(d)
            except Timeout:
                pass
        if pending:
            time.sleep(0.2)
    statuses = all_status(settings, daemons)
    print(format_daemons(statuses))
    for d in pending:
        failed[d] = "not ready"
    if failed:
        names = ", ".join(f"{d} ({why})" for d, why in failed.items())
        raise CLIError(f"not every daemon came up after {timeout_s:g} s: {names}; see `wsctx logs {next(iter(failed))}`")
    print(f"wsctx is up (runtime {settings.runtime_dir}, data {settings.data_dir})")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    settings = _settings(args)
    conf = supervisor_conf(settings)
    sup_pid = _supervisor_pid(settings)
    pids = set(daemon_processes(settings.runtime_dir, sup_pid))
    if supervisor_state(settings) is None:
        left = [p for p in pids if _alive(p)]
        if not left:
            _remove_socket_files(settings)
            print("wsctx is not running")
            return 0
        print(f"supervisord does not answer; stopping {len(left)} leftover process(es)", file=sys.stderr)
    else:
        for info in supervisor_processes(settings).values():
            if info.get("pid"):
                pids.add(int(info["pid"]))
        if sup_pid:
            pids.add(sup_pid)
        done = subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(conf), "shutdown"],
                              capture_output=True, text=True, cwd=str(REPO_ROOT))
        if done.returncode != 0 and supervisor_state(settings) is not None:
            raise CLIError(f"supervisorctl shutdown failed: {(done.stderr or done.stdout).strip()}")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        pids |= set(daemon_processes(settings.runtime_dir, sup_pid))
        left = sorted(p for p in pids if _alive(p))
        if not left:
            _remove_socket_files(settings)
            print("wsctx is down")
            return 0
        time.sleep(0.2)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    raise CLIError(f"processes still running after {args.timeout:g} s were killed: {' '.join(map(str, left))}")


def _remove_socket_files(settings) -> None:
    """With every process gone, the ipc socket files and supervisord's pid file left in the
    runtime dir (owner-only, ours alone) are stale: remove them."""
    rt = Path(settings.runtime_dir)
    for f in [*rt.glob("*.sock"), rt / "supervisord.pid"]:
        try:
            f.unlink()
        except OSError:
            pass


def gather_status(settings) -> dict[str, Any]:
    statuses = all_status(settings)
    return {
        "runtime_dir": settings.runtime_dir,
        "data_dir": settings.data_dir,
        "supervisord": supervisor_state(settings),
        "daemons": {
            d: ({"state": "down"} if st is None else {
                "state": "up", "pid": st.get("pid"), "uptime_s": st.get("uptime_s"),
                "queue_depth": st.get("queue_depth", 0), "version": st.get("version"),
                "counters": st.get("counters", {}), "details": st.get("details", {}),
            })
            for d, st in statuses.items()
        },
        "workspaces": workspace_report(settings, statuses),
        "_statuses": statuses,
    }


def still_indexing(report: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The workspaces not reconciled yet or with files pending."""
    return {w: e for w, e in report.items() if e["pending"] != 0 or not e["last_reconcile"]}


def indexing_done(report: dict[str, dict[str, Any]]) -> bool:
    """True when every workspace has been reconciled and nothing is pending."""
    return not still_indexing(report)


#: Without a terminal, ``status --wait`` prints its progress at most this often.
PROGRESS_EVERY_S = 5.0


def progress_line(report: dict[str, dict[str, Any]], first_indexed: int, elapsed_s: float) -> str:
    """One line of indexing progress over the workspaces not done yet: files indexed of all,
    rows, the rate since waiting began (*first_indexed* files were indexed then) and the time left."""
    busy = list(still_indexing(report).values())
    files = sum(e["files"] or 0 for e in busy)
    done = sum(e["indexed_files"] or 0 for e in busy)
    pending = sum(e["pending"] or 0 for e in busy)
    rows = sum(e["rows"] or 0 for e in busy)
    keyword_only = sum(e.get("vectors_pending") or 0 for e in busy)
    line = f"indexing: {done:,} of {files:,} files" + (f" ({100 * done // files}%)" if files else "") + f", {rows:,} rows"
    if keyword_only:
        line += f" ({keyword_only:,} files keyword-only, vectors to come)"
    rate = (done - first_indexed) / elapsed_s if elapsed_s > 0 else 0.0
    if rate > 0:
        line += f", {rate:.1f} files/s, about {_duration(pending / rate)} left"
    elif pending:
        line += f", {pending:,} pending"
    return line


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds} s" if seconds < 90 else f"{seconds // 60} min {seconds % 60:02d} s"


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings(args)
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
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
        return
    print(format_daemons(statuses))
    print()
    if statuses and all(st is None for st in statuses.values()) and not data["workspaces"]:
        print(NOT_RUNNING)  # with workspaces, each one's problems say so
    print(format_workspaces(data["workspaces"]))


def cmd_add(args: argparse.Namespace) -> int:
    from daemons.lib.workspaces import Registry
    from protocol.errors import ProtocolError
    from protocol.schema import ReconcileRequest, WorkspaceAddRequest

    settings = _settings(args)
    try:
        wid, root = Registry(settings.data_dir).add(args.path)
    except ProtocolError as exc:
        raise CLIError(exc.message) from None
    if is_up(settings, "watcher"):
        control(settings, "watcher", WorkspaceAddRequest(path=root))
        control(settings, "watcher", ReconcileRequest(workspace=wid))
    else:
        print("watcher is not running: the workspace is indexed once `wsctx up` has started it", file=sys.stderr)
    print(wid)
    return 0


def resolve_workspace(settings, ref: str | None) -> tuple[str, str]:
    """By id or a path inside it; default: the workspace containing cwd, else the only one."""
    from daemons.lib.workspaces import Registry
    from protocol.errors import UnknownWorkspace

    reg = Registry(settings.data_dir)
    try:
        if ref:
            return reg.resolve(ref)
        try:
            return reg.resolve(os.getcwd())
        except UnknownWorkspace:
            return reg.resolve("")
    except UnknownWorkspace as exc:  # its message lists the registered workspaces
        raise CLIError(exc.message) from None


def cmd_rebuild(args: argparse.Namespace) -> int:
    from protocol.schema import RebuildRequest

    settings = _settings(args)
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
    settings = _settings(args)
    wid, root = resolve_workspace(settings, args.workspace)
    freed = _drop_workspace(settings, wid)
    print(f"removed {wid} ({root}): its index is deleted, {freed / 1e6:.1f} MB freed; the folder itself is untouched")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """Drop the indexes nothing needs: of registered workspaces whose folder no longer exists, and
    index folders of no registered workspace. Lists them and asks first, unless --yes."""
    from daemons.lib.workspaces import Registry, folder_bytes, index_dir, is_workspace_id

    settings = _settings(args)
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


def cmd_logs(args: argparse.Namespace) -> int:
    settings = _settings(args)
    names = [args.daemon] if args.daemon else list(DAEMONS)
    files = {n: log_dir(settings) / f"{n}.log" for n in names}
    existing = {n: p for n, p in files.items() if p.exists()}
    if not existing:
        raise CLIError(f"no log files in {log_dir(settings)} (has `wsctx up` run with this data dir?)")
    prefix = len(existing) > 1
    for name, path in existing.items():
        for line in _tail(path, args.lines):
            print(f"{name:<9} {line}" if prefix else line)
    if not args.follow:
        return 0
    handles = {}
    for name, path in existing.items():
        fh = path.open("r", errors="replace")
        fh.seek(0, os.SEEK_END)
        handles[name] = (path, fh)
    try:
        while True:
            quiet = True
            for name, (path, fh) in list(handles.items()):
                line = fh.readline()
                if line:
                    quiet = False
                    print(f"{name:<9} {line.rstrip()}" if prefix else line.rstrip(), flush=True)
                elif path.exists() and path.stat().st_size < fh.tell():  # rotated
                    fh.close()
                    handles[name] = (path, path.open("r", errors="replace"))
            if quiet:
                time.sleep(0.25)
    except KeyboardInterrupt:
        return 0


def _tail(path: Path, n: int) -> list[str]:
    if n <= 0:
        return []
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size, block, data = fh.tell(), 8192, b""
        while size > 0 and data.count(b"\n") <= n:
            step = min(block, size)
            size -= step
            fh.seek(size)
            data = fh.read(step) + data
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-n:]]


def question_overrides(settings, pairs: Sequence[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` flags as a question's overrides, checked here so that a bad one is one
    clear line before anything is asked."""
    from daemons.lib.config import with_overrides

    out: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise CLIError(f"--set {pair!r}: use NAME=VALUE (e.g. --set rrf_k=60)")
        out[name.strip()] = value.strip()
    try:
        with_overrides(settings, out, "--set")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return out


def build_ask_request(args: argparse.Namespace, workspace: str, overrides: dict[str, str] | None = None):
    from protocol.schema import AskRequest, AskSettings

    def absolute(p: str) -> str:
        return os.path.abspath(p)

    return AskRequest(
        question=args.question,
        workspace=workspace,
        conversation_id=args.conversation or "",
        active_file=absolute(args.file) if args.file else None,
        visible_files=[absolute(p) for p in args.visible],
        open_documents=[absolute(p) for p in args.open],
        settings=AskSettings(threshold=args.threshold, snippet_count=args.snippets, budget_chars=args.budget, rerank=not args.no_rerank,
                              deadline_ms=args.deadline, overrides=overrides or {}),
        include_team=not args.no_team,
    )


def front_endpoint(settings) -> str:
    """The running front's endpoint; CLIError when the front is not up."""
    endpoint = settings.endpoint("front")
    path = _ipc_path(endpoint)
    if (path is not None and not path.exists()) or not is_up(settings, "front"):
        raise CLIError("front is not running: start it with `wsctx up`")
    return endpoint


def ask_front(client, request, timeout_s: float):
    """The front's reply body to *request*; CLIError naming a timeout or the front's error."""
    from protocol.errors import ProtocolError, Timeout

    try:
        return client.request(request, timeout_ms=int(timeout_s * 1000)).body
    except Timeout:
        raise CLIError(f"front did not answer within {timeout_s:g} s: see `wsctx status` and `wsctx logs front`") from None
    except ProtocolError as exc:
        raise CLIError(f"front: {exc.code.value}: {exc.message}") from None


def cmd_ask(args: argparse.Namespace) -> int:
    import msgspec

    from daemons.lib import runtime
    from daemons.lib.config import question_settings_problem

    settings = _settings(args)
    name, problem = question_settings_problem(args.threshold, args.snippets, args.budget, args.deadline)
    if problem:
        flag = {"rerank_threshold": "--threshold", "snippet_count": "--snippets", "budget_chars": "--budget",
                "question_deadline_ms": "--deadline"}[name]
        raise CLIError(f"{flag}: {problem}")
    overrides = question_overrides(settings, args.set)
    if args.question == "-":  # a long issue text: an argument that size fails with "Argument list too long"
        args.question = sys.stdin.read()
    if not args.question.strip():
        raise CLIError("the question is empty")
    wid = ""
    if args.workspace:
        wid = resolve_workspace(settings, args.workspace)[0]
    else:
        try:
            wid = resolve_workspace(settings, None)[0]
        except CLIError:
            wid = ""  # let the front say which workspace it wants
    client = runtime.Client(front_endpoint(settings), sender="cli")
    try:
        body = ask_front(client, build_ask_request(args, wid, overrides), args.timeout)
    finally:
        client.close()
    data = msgspec.to_builtins(body)
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(format_ask(data))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from daemons.lib import evaluation, runtime
    from daemons.lib.history import NotAGitRepository
    from protocol.schema import AskRequest, AskSettings

    from daemons.lib.config import with_overrides

    settings = _settings(args)
    cases = evaluation.DEFAULT_CASES if args.cases is None else args.cases
    if cases < 1:
        raise CLIError(f"--cases must be at least 1, not {cases}")
    overrides = question_overrides(settings, args.set)
    wid, root = resolve_workspace(settings, args.workspace)
    endpoint = front_endpoint(settings)
    report = gather_status(settings)["workspaces"].get(wid)
    if report is not None and (still_indexing({wid: report}) or report.get("vectors_pending")):
        raise CLIError(f"{wid} is still being indexed: wait for it with `wsctx status --wait`, then run eval")
    try:
        ev = evaluation.build(root, settings.include_globs, settings.exclude_globs, settings.max_file_bytes, cases)
    except NotAGitRepository as exc:
        raise CLIError(f"eval asks the questions of the workspace's git history: {exc}") from None
    print(evaluation.skipped_line(ev.history), file=sys.stderr)
    if not ev.history.cases:
        raise CLIError("no commit in the history makes a question (see the skipped counts above)")
    client = runtime.Client(endpoint, sender="cli-eval")

    def product(changes: dict[str, str]) -> evaluation.Ask:
        # every candidate kept and fitted (threshold 0, any size), no deadline: the product's whole order
        ask_settings = AskSettings(threshold=0.0, snippet_count=with_overrides(settings, changes).rerank_top,
                                   budget_chars=evaluation.ANY_SIZE, deadline_ms=0, overrides=changes)

        def ask(question: str) -> list[str]:
            request = AskRequest(question=question, workspace=wid, include_team=False, settings=ask_settings)
            body = ask_front(client, request, args.timeout)
            return evaluation.files_in_order(b.path for b in body.blocks if not b.team)
        return ask

    methods: list[tuple[str, evaluation.Ask]] = [("wsctx", product({}))]
    if overrides:
        methods.append(("wsctx " + " ".join(f"{k}={v}" for k, v in overrides.items()), product(overrides)))
    methods.append((evaluation.BM25, ev.floor))
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if tty:
            print(f"\rasked {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif done % 10 == 0 or done == total:
            print(f"asked {done}/{total}", file=sys.stderr, flush=True)

    try:
        ev.run(methods, progress)
    finally:
        client.close()
    doc = ev.report(wid, {"overrides": overrides})
    print(ev.table())
    out = Path(args.out or f"wsctx-eval-{wid}.json")
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    png = out.with_suffix(".png")
    why = evaluation.plot(doc, png)
    print(f"wrote {out}" + (f" and {png}" if not why else f" (no plot: {why})"))
    return 0


def installed_models(root: Path | None = None) -> list[tuple[Path, dict[str, Any] | None, str]]:
    """``[(folder, manifest or None, error)]`` for every folder under models/artifacts."""
    from models.manifest import MANIFEST_NAME, read_manifest

    root = ARTIFACTS if root is None else root
    out = []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (folder / MANIFEST_NAME).exists():
            out.append((folder, None, "no manifest.json"))
            continue
        try:
            out.append((folder, read_manifest(folder), ""))
        except (OSError, ValueError) as exc:
            out.append((folder, None, str(exc)))
    return out


def format_models(models: list[tuple[Path, dict[str, Any] | None, str]]) -> str:
    if not models:
        return f"no models under {ARTIFACTS}"
    lines = []
    for folder, m, err in models:
        if m is None:
            lines.append(f"{folder.name}: {err}")
            continue
        prefixes = m.get("prefixes") or {}
        pre = ", ".join(f"{k}={v!r}" for k, v in prefixes.items()) or "none"
        lines.append(f"{m.get('name', folder.name)}  ({folder})")
        lines.append(f"  dim {m.get('dim', '-')}, max tokens {m.get('max_tokens', '-')}, prefixes {pre}")
        for name, info in (m.get("files") or {}).items():
            size = info.get("bytes") if isinstance(info, dict) else None
            sha = info.get("sha256", "") if isinstance(info, dict) else str(info)
            lines.append(f"  {name:<24} {fmt_bytes(size) if size is not None else '?':>10}  sha256 {sha[:16]}")
    return "\n".join(lines)


def cmd_models(args: argparse.Namespace) -> int:
    models = installed_models()
    if args.action in (None, "list"):
        print(format_models(models))
        return 0
    if args.action == "verify":
        from models.manifest import verify

        if not models:
            raise CLIError(f"no models under {ARTIFACTS}")
        bad = 0
        for folder, _m, _err in models:
            problems = verify(folder)
            if problems:
                bad += 1
                print(f"{folder.name}: FAILED")
                for p in problems:
                    print(f"  {p}")
            else:
                print(f"{folder.name}: ok")
        if bad:
            raise CLIError(f"{bad} model folder(s) failed verification (rebuild them, see README \"Models\")")
        return 0
    # score
    settings = _settings(args)
    try:
        from models import cross_encoder
    except ImportError as exc:
        raise CLIError(f"the cross-encoder module is not available ({exc})") from None
    try:
        model = cross_encoder.load_cross_encoder(settings.reranker_dir or None)
    except cross_encoder.ModelUnavailable as exc:
        raise CLIError(f"cross-encoder unavailable: {exc}") from None
    score = model.score(args.query, [args.passage])[0]
    print(f"{score:.4f}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Make a CURVE key pair (for ``front_tcp`` off loopback, and team fronts)."""
    from daemons.lib.security import make_keys

    folder = Path(args.dir)
    if (folder / f"{args.name}.key").exists() or (folder / f"{args.name}.key_secret").exists():
        raise CLIError(f"{folder / args.name}.key already exists: pick another --name or folder")
    public, secret = make_keys(folder, args.name)
    print(f"public key: {public}   (give it to the peer: a server's goes in team_server_key_file, a client's in the server's curve_authorized_keys_dir)")
    print(f"secret key: {secret}   (keep it: curve_secret_key_file)")
    return 0


# --------------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # same as argparse's, kept for a stable exit code 2
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _ask_arguments(sp: argparse.ArgumentParser) -> None:
    """The arguments of ``wsctx ask``."""
    sp.add_argument("question", help="the question; - reads it from standard input")
    sp.add_argument("--workspace", "-w", default=None, help="id or a path inside it (default: the one containing cwd, or the only one)")
    sp.add_argument("--file", default=None, help="the active editor's file")
    sp.add_argument("--visible", nargs="+", action="extend", default=[], metavar="F", help="files in visible editors")
    sp.add_argument("--open", nargs="+", action="extend", default=[], metavar="F", help="other open documents")
    sp.add_argument("--conversation", default="", help="conversation id (follow-up questions)")
    sp.add_argument("--threshold", type=float, default=None, help="rerank threshold for this question")
    sp.add_argument("--snippets", type=int, default=None, help="snippet count for this question")
    sp.add_argument("--budget", type=int, default=None, help="character budget for this question")
    sp.add_argument("--no-rerank", action="store_true", default=False, help="skip the cross-encoder (fused order)")
    sp.add_argument("--deadline", type=int, default=None, metavar="MS",
                    help="time budget for this question in ms (0: none; default: question_deadline_ms)")
    sp.add_argument("--no-team", action="store_true", default=False, help="do not ask the team index")
    sp.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a ranking setting for this question only (rrf_k, list_weight_vector, ranking=spec, ...); repeatable")
    sp.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer (default 30)")
    sp.add_argument("--json", action="store_true", default=False, help="print the AskReply as JSON")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--runtime-dir", help="folder of the ipc sockets (default: settings' runtime_dir)")
    common.add_argument("--data-dir", help="folder of the indexes, registry and logs (default: settings' data_dir)")
    common.add_argument("--config", help="settings TOML file (default: $WSCTX_CONFIG or ~/.config/wsctx/config.toml)")

    p = _Parser(prog="wsctx", description="Workspace context daemons: index a code workspace, answer questions with its code.", parents=[common])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_, parents=[common], argument_default=argparse.SUPPRESS)
        sp.set_defaults(func=fn)
        return sp

    sp = add("up", cmd_up, "start the daemons under supervisord and wait until they answer")
    sp.add_argument("--foreground", action="store_true", default=False, help="keep supervisord in the foreground (Ctrl-C stops everything)")
    sp.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the daemons (default 120)")

    sp = add("down", cmd_down, "stop every daemon and supervisord")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the processes to exit (default 60)")

    sp = add("status", cmd_status, "daemons (up/down, pid, uptime, queue) and workspaces (files, rows, pending, problems)")
    sp.add_argument("--json", action="store_true", default=False, help="print JSON")
    sp.add_argument("--wait", action="store_true", default=False, help="block until no workspace has pending work")
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")

    sp = add("add", cmd_add, "register a workspace folder and start indexing it")
    sp.add_argument("path")

    sp = add("rebuild", cmd_rebuild, "drop a workspace's index and rebuild it with the current settings")
    sp.add_argument("workspace", nargs="?", default=None, help="id or a path inside it (default: the one containing cwd, or the only one)")

    sp = add("remove", cmd_remove, "unregister a workspace and delete its index (the folder itself is untouched)")
    sp.add_argument("workspace", help="id or a path inside it")

    sp = add("gc", cmd_gc, "delete the indexes of workspaces whose folder is gone, and of no registered workspace (asks first)")
    sp.add_argument("--yes", action="store_true", default=False, help="delete without asking")

    sp = add("logs", cmd_logs, "show the daemons' log files (JSON lines)")
    sp.add_argument("daemon", nargs="?", default=None, choices=DAEMONS)
    sp.add_argument("-f", "--follow", action="store_true", default=False)
    sp.add_argument("-n", "--lines", type=int, default=20, help="lines per file (default 20)")

    sp = add("ask", cmd_ask, "ask the front a question and print the code blocks and the context line")
    _ask_arguments(sp)

    sp = add("eval", cmd_eval, "measure retrieval on the workspace's own git history: its commits asked as questions, "
                               "the files they changed as answers, beside whole-file BM25")
    sp.add_argument("workspace", nargs="?", default=None, help="id or a path inside it (default: the one containing cwd, or the only one)")
    sp.add_argument("--cases", type=int, default=None, metavar="N", help="questions asked, newest commits first (default 50)")  # evaluation.DEFAULT_CASES
    sp.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a ranking setting to compare side by side with the current ones (rrf_k, ranking=spec, ...); repeatable")
    sp.add_argument("--out", default=None, help="the JSON report (default wsctx-eval-WORKSPACE.json; the plot goes beside it as .png)")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one answer (default 60)")

    sp = add("keys", cmd_keys, "make a CURVE key pair for tcp access (front_tcp, team fronts)")
    sp.add_argument("dir", help="folder to write NAME.key and NAME.key_secret into")
    sp.add_argument("--name", default="wsctx", help="file name stem (default wsctx)")

    sp = add("models", cmd_models, "show, verify or try the installed models")
    sp.add_argument("action", nargs="?", default=None, choices=["list", "verify", "score"])
    sp.add_argument("query", nargs="?", default=None)
    sp.add_argument("passage", nargs="?", default=None)
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "models":
        if args.action == "score" and (args.query is None or args.passage is None):
            parser.exit(2, "wsctx models: error: `score` needs QUERY and PASSAGE\n")
        if args.action != "score" and (args.query is not None or args.passage is not None):
            parser.exit(2, "wsctx models: error: only `score` takes QUERY and PASSAGE\n")
    if getattr(args, "lines", 0) < 0:
        parser.exit(2, "wsctx logs: error: -n must be >= 0\n")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except CLIError as exc:
        print(f"wsctx: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
