"""The daemons a benchmark runs as plain processes (no supervisord): started, waited for, stopped."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable

from daemons.lib.config import Settings
from daemons.lib.runtime import memory_mb, wait_ready
from daemons.supervision import daemon_name, processes_for


def start_daemons(names: Iterable[str], env: dict[str, str], logs: Path, settings: Settings,
                  cwd: Path | None = None, ready_s: float = 90.0) -> dict[str, subprocess.Popen]:
    """``python -m daemons.<name>`` for each name, logging to ``logs/<name>.log``; returns once
    every one answers on its control socket (when one does not, every one is stopped before the
    error is raised). A SIGTERM to the benchmark from then on exits it
    through its ``finally`` (which stops them), instead of leaving them running."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    procs: dict[str, subprocess.Popen] = {}
    for name in names:
        procs[name] = subprocess.Popen([sys.executable, "-m", f"daemons.{name}"], env=env, cwd=cwd,
                                       stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT)
    try:
        for name in procs:
            wait_ready(settings.control_endpoint(name), timeout_s=ready_s)
    except BaseException:  # one never came up: stop the others, which the caller holds no handle to
        stop_daemons(procs.values())
        raise
    return procs


def stop_daemons(procs: Iterable[subprocess.Popen], timeout_s: float = 15.0) -> None:
    """SIGTERM each, then SIGKILL whichever is still up after *timeout_s*."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def daemon_memory_mb(runtime_dir: str) -> dict[str, float]:
    """Resident MB of each daemon (reranker workers summed as ``reranker.worker``) of this runtime dir."""
    out: dict[str, float] = {}
    for pid in processes_for(runtime_dir):
        name = daemon_name(pid)
        rss = memory_mb(pid) if name is not None else 0.0
        if rss:  # 0.0: gone since it was listed
            out[name] = round(out.get(name, 0.0) + rss, 1)
    return dict(sorted(out.items()))
