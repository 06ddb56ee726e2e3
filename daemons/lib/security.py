"""Access rules for sockets that leave the machine's ipc directory.

- ipc sockets live in an owner-only (0700) runtime directory and are created 0600.
- tcp is off by default, and a tcp endpoint requires CURVE (ZeroMQ's built-in authentication):
  the server's secret key file and a directory of authorised client public keys. A client whose
  key is not there is refused. A tcp port on loopback is open to every local user, where the
  0700 runtime dir keeps them off the ipc sockets, so one without keys is refused too unless
  ``front_tcp_insecure`` says so (and status and log then warn); off loopback never.
- Each authorised key sees only the workspaces ``team_workspaces`` grants it (``granted``).
- Keys are ZeroMQ certificate files (``zmq.auth.create_certificates``); ``wsctx keys`` makes them.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from daemons.lib.config import Settings


def is_loopback(endpoint: str) -> bool:
    """True for ``tcp://127.x.x.x:port``, ``tcp://localhost:port`` and ``tcp://[::1]:port``."""
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


INSECURE_WARNING = ("front_tcp_insecure: the tcp front has no CURVE keys, so every local user "
                    "(any uid on this machine) can ask it about every workspace")


def tcp_problem(settings: Any) -> str:
    """Why ``settings.front_tcp`` cannot be served as set, naming the settings, or ''."""
    endpoint = settings.front_tcp
    if not endpoint.startswith("tcp://"):
        return f"front_tcp {endpoint!r} is not a tcp:// endpoint"
    if settings.curve_secret_key_file:
        if not settings.curve_authorized_keys_dir or not Path(settings.curve_authorized_keys_dir).is_dir():
            return "curve_authorized_keys_dir must name a directory of client public keys"
        return ""
    if not is_loopback(endpoint):
        return (f"refusing tcp endpoint {endpoint} off loopback without CURVE keys "
                "(set curve_secret_key_file and curve_authorized_keys_dir)")
    if not settings.front_tcp_insecure:
        return (f"refusing tcp endpoint {endpoint} without CURVE keys: any local user could ask it "
                "(set curve_secret_key_file and curve_authorized_keys_dir, or front_tcp_insecure = true to accept that)")
    return ""


def secure_server_socket(ctx: zmq.Context, sock: zmq.Socket, settings: Settings) -> ThreadAuthenticator | None:
    """Configure ``sock`` for ``settings.front_tcp``; return the running authenticator, if any
    (None for an insecure loopback front, which ``tcp_problem`` allowed).

    Raises ValueError for what ``tcp_problem`` refuses.
    """
    problem = tcp_problem(settings)
    if problem:
        raise ValueError(problem)
    if not settings.curve_secret_key_file:
        return None
    public, secret = zmq.auth.load_certificate(settings.curve_secret_key_file)
    if secret is None:
        raise ValueError(f"{settings.curve_secret_key_file} holds no secret key")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=settings.curve_authorized_keys_dir)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return auth


def key_names(folder: str | Path) -> dict[bytes, str]:
    """``{z85 public key: file stem}`` of the public keys in *folder* (the authorised clients)."""
    out: dict[bytes, str] = {}
    for path in sorted(Path(folder).glob("*.key")):
        try:
            public, _ = zmq.auth.load_certificate(str(path))
        except (OSError, ValueError):
            continue
        if public:
            out[public] = path.stem
    return out


def parse_grants(entries: list[str]) -> dict[str, list[str]]:
    """``team_workspaces``' ``KEY=WORKSPACE`` entries as ``{key name: [workspace refs]}``;
    ValueError names an entry without both halves."""
    grants: dict[str, list[str]] = {}
    for entry in entries:
        key, sep, workspace = entry.partition("=")
        if not sep or not key.strip() or not workspace.strip():
            raise ValueError(f"team_workspaces entry {entry!r}: write KEY=WORKSPACE (KEY a client key's name or *)")
        grants.setdefault(key.strip(), []).append(workspace.strip())
    return grants


def granted(grants: dict[str, list[str]], key_name: str | None) -> list[str]:
    """The workspace refs (ids or roots) client *key_name* may ask: its own and ``*``'s."""
    return [*grants.get("*", []), *(grants.get(key_name, []) if key_name else [])]


def curve_client_keys(settings: Settings) -> dict[str, bytes] | None:
    """The keys a front uses to reach a team front over CURVE, or None when none are configured."""
    if not settings.team_server_key_file or not settings.curve_secret_key_file:
        return None
    server_public, _ = zmq.auth.load_certificate(settings.team_server_key_file)
    public, secret = zmq.auth.load_certificate(settings.curve_secret_key_file)
    if secret is None:
        raise ValueError(f"{settings.curve_secret_key_file} holds no secret key")
    return {"server_public": server_public, "public": public, "secret": secret}


def make_keys(folder: str | Path, name: str) -> tuple[Path, Path]:
    """Create ``name.key`` (public) and ``name.key_secret`` in ``folder`` (0700)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    public, secret = zmq.auth.create_certificates(str(folder), name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)


def describe(endpoint: str) -> dict[str, Any]:
    return {"endpoint": endpoint, "loopback": is_loopback(endpoint)}
