"""Access rules for sockets that leave the machine's ipc directory.

- ipc sockets live in an owner-only (0700) runtime directory and are created 0600.
- tcp is off by default. A tcp endpoint on loopback may run without keys; any other address
  requires CURVE (ZeroMQ's built-in authentication): the server's secret key file and a
  directory of authorised client public keys. A client whose key is not there is refused.
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


def secure_server_socket(ctx: zmq.Context, sock: zmq.Socket, settings: Settings) -> ThreadAuthenticator | None:
    """Configure ``sock`` for ``settings.front_tcp``; return the running authenticator, if any.

    Raises ValueError when a non-loopback endpoint is asked for without CURVE keys.
    """
    endpoint = settings.front_tcp
    if not settings.curve_secret_key_file:
        if not is_loopback(endpoint):
            raise ValueError(f"refusing tcp endpoint {endpoint} off loopback without CURVE keys (set curve_secret_key_file and curve_authorized_keys_dir)")
        return None
    if not settings.curve_authorized_keys_dir or not Path(settings.curve_authorized_keys_dir).is_dir():
        raise ValueError("curve_authorized_keys_dir must name a directory of client public keys")
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
