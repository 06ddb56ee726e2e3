"""``wsctx up``, ``down`` and ``logs``: the daemons under supervisord, and their log files."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from daemons import DAEMONS
from daemons.supervision import (
    REPO_ROOT, _alive, _supervisor_pid, daemon_processes, log_dir, supervisor_conf, supervisor_env, supervisor_processes, supervisor_state, supervisord_is_ours,
    write_supervisor_conf,
)
from daemons.status_report import format_daemons
from daemons.cli.common import CLIError, settings_of, all_status, config_path, selected_daemons


def cmd_up(args: argparse.Namespace) -> int:
    settings = settings_of(args)
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
    settings = settings_of(args)
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
        if sup_pid and supervisord_is_ours(sup_pid, settings.runtime_dir):
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


def cmd_logs(args: argparse.Namespace) -> int:
    settings = settings_of(args)
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
