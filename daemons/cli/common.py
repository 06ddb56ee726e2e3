"""What every ``wsctx`` command shares: the settings it runs under, its one error type, and the
daemons' control sockets (status, control requests)."""
from __future__ import annotations

import argparse
import concurrent.futures
import os
from pathlib import Path
from typing import Any, Sequence

from daemons import DAEMONS
from daemons.supervision import supervisor_state
from daemons.status_report import workspace_report


STATUS_TIMEOUT_MS = 700


class CLIError(Exception):
    """An error the user can act on: printed as one line, exit code 1."""


def settings_of(args: argparse.Namespace):
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


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None


def daemon_status(settings, daemon: str, timeout_ms: int = STATUS_TIMEOUT_MS) -> dict[str, Any] | None:
    """The daemon's StatusReply as a dict, or None when it does not answer."""
    import msgspec

    from daemons.lib import runtime
    from protocol.errors import ProtocolError
    from protocol.schema import StatusRequest

    endpoint = settings.control_endpoint(daemon)
    path = ipc_path(endpoint)
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


def gather_status(settings) -> dict[str, Any]:
    """Every daemon's status and the workspaces'. A daemon that missed its probe but whose process
    is alive is "slow" (busy: at load 10 a working embedder can take longer than the probe), and
    only one with no process is "down"."""
    from daemons.supervision import running_daemons

    statuses = all_status(settings)
    alive = running_daemons(settings.runtime_dir) if any(st is None for st in statuses.values()) else {}
    slow = {d: alive[d] for d, st in statuses.items() if st is None and d in alive}
    return {
        "runtime_dir": settings.runtime_dir,
        "data_dir": settings.data_dir,
        "supervisord": supervisor_state(settings),
        "daemons": {
            d: ({"state": "slow", "pid": slow[d]} if st is None and d in slow else {"state": "down"} if st is None else {
                "state": "up", "pid": st.get("pid"), "uptime_s": st.get("uptime_s"),
                "queue_depth": st.get("queue_depth", 0), "version": st.get("version"),
                "counters": st.get("counters", {}), "details": st.get("details", {}),
            })
            for d, st in statuses.items()
        },
        "workspaces": workspace_report(settings, statuses),
        "_statuses": statuses,
        "_slow": slow,
    }


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
