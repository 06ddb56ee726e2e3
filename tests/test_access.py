"""Access rules with real daemons: a private runtime dir with owner-only ipc sockets, no tcp by default,
tcp off loopback only with CURVE keys (a client without an authorised key is refused), and the
team-index link over the same CURVE keys (degrading, not failing, without them)."""
from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest
import zmq

from daemons.lib.security import make_keys
from protocol.schema import AskRequest
from tests.support import daemon_env, register, table_mismatches, wait_until
from tests.test_faults import ask_once

ALL = ("watcher", "chunker", "embedder", "searcher", "reranker", "front")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_tcp_ports(pid: int) -> list[int]:
    """TCP ports in LISTEN state held by ``pid`` (its socket inodes matched against /proc/net/tcp{,6})."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.append(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def curve_keys(folder: Path) -> dict[str, Path]:
    server_pub, server_sec = make_keys(folder / "server", "server")
    client_pub, client_sec = make_keys(folder / "client", "client")
    _, stranger_sec = make_keys(folder / "stranger", "stranger")
    authorized = folder / "authorized"
    authorized.mkdir(mode=0o700)
    (authorized / "client.key").write_bytes(client_pub.read_bytes())
    return {"server_pub": server_pub, "server_sec": server_sec, "client_sec": client_sec, "stranger_sec": stranger_sec, "authorized": authorized}


def curve_of(server_pub: Path, secret: Path) -> dict[str, bytes]:
    import zmq.auth

    server_public, _ = zmq.auth.load_certificate(str(server_pub))
    public, sec = zmq.auth.load_certificate(str(secret))
    return {"server_public": server_public, "public": public, "secret": sec}


@pytest.mark.timeout(180)
def test_ipc_sockets_private_and_no_tcp_by_default(daemons, env, workspace) -> None:
    """The runtime dir is 0700, every ipc socket file 0600, and no daemon listens on tcp unless told to."""
    (workspace / "a.py").write_text("def alpha():\n    return 1\n")
    register(env["WSCTX_DATA_DIR"], workspace)
    d = daemons(ALL)
    d.start()
    rt = Path(d.runtime_dir)
    assert stat.S_IMODE(rt.stat().st_mode) == 0o700
    assert rt.stat().st_uid == os.getuid()
    wanted = ["front.sock", "searcher.sock", "embedder.query.sock", "embedder.in.sock", "chunker.in.sock", "reranker.sock",
              "reranker.workers.sock", *[f"{n}.ctl.sock" for n in ALL]]
    def sockets() -> list[Path]:
        return [p for p in rt.iterdir() if stat.S_ISSOCK(p.stat().st_mode)]

    # a daemon answers on its control socket before it has bound the rest (the embedder loads its model first)
    wait_until(lambda: set(wanted) <= {p.name for p in sockets()}, timeout=60,
               message=lambda: f"sockets so far: {sorted(p.name for p in sockets())}")
    socks = sockets()
    names = {p.name for p in socks}
    for want in wanted:
        assert want in names, f"{want} missing from {sorted(names)}"
    loose = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in socks if stat.S_IMODE(p.stat().st_mode) != 0o600}
    assert not loose, f"ipc sockets not 0600: {loose}"
    listening = {n: listening_tcp_ports(d.pid(n)) for n in ALL}
    assert not any(listening.values()), f"tcp listeners without front_tcp: {listening}"
    # a runtime dir that others can enter is tightened on start
    d.stop_all()
    rt.chmod(0o755)
    d.start("watcher")
    assert stat.S_IMODE(rt.stat().st_mode) == 0o700


@pytest.mark.timeout(120)
def test_a_runtime_dir_that_is_a_symlink_is_refused(daemons, env, short_tmp) -> None:
    """A runtime dir given as a symbolic link, even to an owner-only folder of ours, is refused by the daemon and by `wsctx up`, naming the link."""
    import subprocess
    import sys

    target = short_tmp / "real-run"
    target.mkdir(mode=0o700)
    link = short_tmp / "run-link"
    link.symlink_to(target)
    env_link = {**env, "WSCTX_RUNTIME_DIR": str(link)}
    d = daemons(["watcher"], env_link)
    d.start("watcher", wait=False)
    assert d.procs["watcher"].wait(60) != 0
    assert "is a symbolic link" in d.log("watcher")
    assert not any(target.iterdir()), "a socket was made through the link"
    up = subprocess.run([sys.executable, "-m", "daemons.cli", "up", "--timeout", "20"], env=env_link, capture_output=True, text=True, timeout=120)
    assert up.returncode != 0 and "is a symbolic link" in up.stderr, up.stdout + up.stderr
    assert not any(target.iterdir())


@pytest.mark.timeout(120)
def test_tcp_off_loopback_without_keys_refused(daemons, env, workspace) -> None:
    """A front asked to listen on tcp://0.0.0.0 without CURVE keys refuses to start and says why."""
    register(env["WSCTX_DATA_DIR"], workspace)
    port = free_port()
    d = daemons(["front"])
    d.start("front", wait=False, WSCTX_FRONT_TCP=f"tcp://0.0.0.0:{port}")
    rc = d.procs["front"].wait(60)
    assert rc != 0
    assert "refusing tcp endpoint" in d.log("front") and "CURVE" in d.log("front")
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.timeout(120)
def test_tcp_on_loopback_without_keys_needs_front_tcp_insecure(daemons, env, workspace) -> None:
    """A loopback tcp front without CURVE keys refuses to start, naming front_tcp_insecure; with it set, it serves and its status and log warn."""
    (workspace / "a.py").write_text("def alpha():\n    return 1\n")
    wid = register(env["WSCTX_DATA_DIR"], workspace)
    port = free_port()
    d = daemons(["front"])
    d.start("front", wait=False, WSCTX_FRONT_TCP=f"tcp://127.0.0.1:{port}")
    assert d.procs["front"].wait(60) != 0
    assert "front_tcp_insecure" in d.log("front") and "any local user" in d.log("front")
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    d.start("front", WSCTX_FRONT_TCP=f"tcp://127.0.0.1:{port}", WSCTX_FRONT_TCP_INSECURE="true")
    wait_until(lambda: port in listening_tcp_ports(d.pid("front")), 30)
    kind, reply = ask_once(zmq.Context.instance(), f"tcp://127.0.0.1:{port}", AskRequest(question="where is alpha?", workspace=wid), 30000)
    assert kind == "ok", reply
    status = d.status("front")
    assert status.details["tcp_insecure"] is True and "every local user" in status.details["warning"]
    assert "tcp_insecure" in d.log("front")


@pytest.mark.timeout(240)
def test_each_client_key_sees_only_its_granted_workspaces(daemons, env, short_tmp) -> None:
    """With two workspaces and two keys, each key is answered about the workspace team_workspaces grants it and refused the other as unknown."""
    roots, wids = [], []
    for name in ("alpha", "beta"):
        root = short_tmp / name
        root.mkdir()
        (root / f"{name}.py").write_text(f"def {name}_total(xs):\n    return sum(xs)\n")
        roots.append(root)
        wids.append(register(env["WSCTX_DATA_DIR"], root))
    folder = short_tmp / "keys"
    server_pub, server_sec = make_keys(folder / "server", "server")
    authorized = folder / "authorized"
    authorized.mkdir(mode=0o700)
    secrets = {}
    for name in ("alice", "bob", "carol"):
        pub, secrets[name] = make_keys(folder / name, name)
        (authorized / f"{name}.key").write_bytes(pub.read_bytes())
    port = free_port()
    d = daemons(["front"])
    d.start("front", WSCTX_FRONT_TCP=f"tcp://127.0.0.1:{port}", WSCTX_CURVE_SECRET_KEY_FILE=str(server_sec),
            WSCTX_CURVE_AUTHORIZED_KEYS_DIR=str(authorized), WSCTX_TEAM_WORKSPACES=f"alice={wids[0]},bob={roots[1]}")
    wait_until(lambda: port in listening_tcp_ports(d.pid("front")), 30)
    ctx, ep = zmq.Context.instance(), f"tcp://127.0.0.1:{port}"
    for who, mine, other in (("alice", 0, 1), ("bob", 1, 0)):
        curve = curve_of(server_pub, secrets[who])
        kind, reply = ask_once(ctx, ep, AskRequest(question="total", workspace=wids[mine]), 30000, curve=curve)
        assert kind == "ok", (who, reply)
        for ref in (wids[other], str(roots[other] / f"{('alpha', 'beta')[other]}.py")):
            field = {"workspace": ref} if ref == wids[other] else {"active_file": ref}
            kind, reply = ask_once(ctx, ep, AskRequest(question="total", **field), 30000, curve=curve)
            assert kind == "error" and reply.code == "unknown_workspace", (who, ref, reply)
    # a key with no grant sees nothing, not even with no workspace named
    kind, reply = ask_once(ctx, ep, AskRequest(question="total", workspace=wids[0]), 30000, curve=curve_of(server_pub, secrets["carol"]))
    assert kind == "error" and reply.code == "unknown_workspace", reply
    assert "workspace_not_granted" in d.log("front")
    # the local ipc front is not limited by the grants
    kind, reply = ask_once(ctx, d.endpoint("front"), AskRequest(question="total", workspace=wids[1]), 30000)
    assert kind == "ok", reply


@pytest.mark.timeout(180)
def test_curve_front_refuses_clients_without_the_key(daemons, env, workspace, short_tmp) -> None:
    """A CURVE tcp front answers an authorised client and refuses one with no key or an unknown key."""
    (workspace / "a.py").write_text("def alpha():\n    return 1\n")
    wid = register(env["WSCTX_DATA_DIR"], workspace)
    keys = curve_keys(short_tmp / "keys")
    port = free_port()
    d = daemons(["front"])
    d.start("front", WSCTX_FRONT_TCP=f"tcp://0.0.0.0:{port}", WSCTX_CURVE_SECRET_KEY_FILE=str(keys["server_sec"]),
            WSCTX_CURVE_AUTHORIZED_KEYS_DIR=str(keys["authorized"]), WSCTX_TEAM_WORKSPACES=f"client={wid}")
    wait_until(lambda: port in listening_tcp_ports(d.pid("front")), 30)
    ctx = zmq.Context.instance()
    ep = f"tcp://127.0.0.1:{port}"
    req = AskRequest(question="where is alpha?", workspace=wid)
    kind, reply = ask_once(ctx, ep, req, 20000, curve=curve_of(keys["server_pub"], keys["client_sec"]))
    assert kind == "ok", reply
    kind, reply = ask_once(ctx, ep, req, 3000)
    assert kind == "down", f"a client without CURVE was answered: {reply}"
    kind, reply = ask_once(ctx, ep, req, 3000, curve=curve_of(keys["server_pub"], keys["stranger_sec"]))
    assert kind == "down", f"a client with an unknown key was answered: {reply}"
    kind, reply = ask_once(ctx, ep, req, 20000, curve=curve_of(keys["server_pub"], keys["client_sec"]))
    assert kind == "ok", reply
    assert d.running("front")


@pytest.mark.timeout(300)
def test_team_link_over_curve(daemons, short_tmp) -> None:
    """Front A gets front B's blocks as team blocks over CURVE; without the keys it says the team index is unavailable and still answers."""
    keys = curve_keys(short_tmp / "keys")
    # B: a team index on tcp + CURVE, with an indexed workspace
    base_b = short_tmp / "b"
    env_b = daemon_env(base_b)
    root_b = base_b / "team"
    root_b.mkdir(parents=True)
    (root_b / "billing.py").write_text("def compute_invoice_total(lines):\n    \"\"\"Sum the invoice lines with tax.\"\"\"\n"
                                      "    return sum(line.amount * (1 + line.tax_rate) for line in lines)\n")
    wid_b = register(base_b / "data", root_b)
    port = free_port()
    b = daemons(["watcher", "chunker", "embedder", "front"], env_b)
    b.start("watcher", "chunker", "embedder")
    b.start("front", WSCTX_FRONT_TCP=f"tcp://0.0.0.0:{port}", WSCTX_CURVE_SECRET_KEY_FILE=str(keys["server_sec"]),
            WSCTX_CURVE_AUTHORIZED_KEYS_DIR=str(keys["authorized"]), WSCTX_TEAM_WORKSPACES=f"client={wid_b}")
    wait_until(lambda: not table_mismatches(b.data_dir, root_b), 120, 0.3)
    # B has no searcher: its first question loads the table library for a search of its own (seconds
    # on a loaded machine), which is not what this test times, so B answers one question first
    warm = AskRequest(question="invoice total", workspace=wid_b)
    assert ask_once(zmq.Context.instance(), b.endpoint("front"), warm, 30000)[0] == "ok"
    # A: a local front (its own empty workspace) linked to B
    base_a = short_tmp / "a"
    env_a = daemon_env(base_a, team_fronts=f"tcp://127.0.0.1:{port}#{wid_b}", team_timeout_ms="8000")
    root_a = base_a / "mine"
    root_a.mkdir(parents=True)
    (root_a / "readme.md").write_text("# mine\n")
    wid_a = register(base_a / "data", root_a)
    a = daemons(["front"], env_a)
    a.start("front", WSCTX_TEAM_SERVER_KEY_FILE=str(keys["server_pub"]), WSCTX_CURVE_SECRET_KEY_FILE=str(keys["client_sec"]))
    ctx = zmq.Context.instance()
    req = AskRequest(question="how is the invoice total computed?", workspace=wid_a)
    kind, reply = ask_once(ctx, a.endpoint("front"), req, 30000)
    assert kind == "ok", reply
    team = [blk for blk in reply.blocks if blk.team]
    assert team and team[0].path == "billing.py", (reply.blocks, reply.degraded)
    assert not any("team index" in x for x in reply.degraded)
    # the same link without the keys: refused by B, so A degrades but answers
    a.kill("front")
    a.start("front")
    t0 = time.monotonic()
    kind, reply = ask_once(ctx, a.endpoint("front"), req, 30000)
    assert kind == "ok", reply
    assert not any(blk.team for blk in reply.blocks)
    assert any("team index" in x and "unavailable" in x for x in reply.degraded), reply.degraded
    assert "team index" in reply.context_line
    assert time.monotonic() - t0 < 25
