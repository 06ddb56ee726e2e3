"""Hostile input on every socket of the real daemons: each is answered (or, on a PULL socket, logged)
with the right error code, and the daemon is still alive and answering status afterwards.

Inputs: truncated frames, no marker, another major version, an oversized message (the codec's cap
``WSCTX_MAX_MESSAGE_BYTES`` is set small here) and one over the socket's own frame cap, invalid
UTF-8 in header and body, unknown message types, a type the socket does not serve, wrong-shaped
bodies; and paths outside the workspace (``../../etc/passwd``, absolute paths, symlinks pointing
out) in every field of ``ask_request`` that names a file, and in events pushed to the chunker and
the embedder. ``INPUTS_TRIED`` counts what one run sends (printed, for docs/reliability.md).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from daemons.lib import runtime
from protocol import envelope
from protocol.schema import AskRequest, ChunkBatch, ChunkRecord, ErrorReply, FileChanged, FileDeleted
from tests.support import Daemons, daemon_env, open_table, register, short_tmpdir, table_mismatches, wait_until

CAP = 65536  # WSCTX_MAX_MESSAGE_BYTES for these daemons; sockets drop frames over CAP + 64 KiB
ALL = ("watcher", "chunker", "embedder", "searcher", "reranker", "front")
#: (socket name, a request type it serves) for every ROUTER socket a client may reach.
ROUTERS = [
    ("front", "ask_request"),
    ("searcher", "search_request"),
    ("embedder.query", "embed_query_request"),
    ("reranker", "rerank_request"),
    *[(f"{d}.ctl", "status_request") for d in ALL],
]
OWNER = {"front": "front", "searcher": "searcher", "embedder.query": "embedder", "reranker": "reranker"}
INPUTS_TRIED: dict[str, int] = {}

_enc = msgspec.json.Encoder()


def header(msg_type: str, version: str = envelope.PROTOCOL_VERSION) -> bytes:
    return _enc.encode({"msg_id": envelope.new_id(), "msg_type": msg_type, "sender": "hostile", "sent_at": time.time(), "version": version})


def garbage(msg_type: str) -> list[tuple[str, list[bytes], str | None]]:
    """``(name, frames, expected error code or None for "no reply expected")`` for one socket."""
    M = envelope.MARKER
    big = b'{"question": "' + b"x" * (CAP + 100) + b'"}'
    huge = b"y" * (CAP + 70000)
    cases = [
        ("marker only", [M], "bad_message"),
        ("header without body", [M, header(msg_type)], "bad_message"),
        ("no marker", [b"hello", b"world"], "bad_message"),
        ("empty frame only", [b""], "bad_message"),
        ("header not json", [M, b"{not json", b"{}"], "bad_message"),
        ("header not an object", [M, b"[1, 2]", b"{}"], "bad_message"),
        ("header missing msg_type", [M, _enc.encode({"msg_id": "x"}), b"{}"], "bad_message"),
        ("header invalid utf-8", [M, b'{"msg_id": "\xff\xfe", "msg_type": "status_request"}', b"{}"], "bad_message"),
        ("major version 2", [M, header(msg_type, "2.0"), b"{}"], "version_mismatch"),
        ("version 0.9", [M, header(msg_type, "0.9"), b"{}"], "version_mismatch"),
        ("version not a number", [M, header(msg_type, "x.y"), b"{}"], "version_mismatch"),
        ("version superscript digit", [M, header(msg_type, "\u00b2.0"), b"{}"], "version_mismatch"),
        ("oversized body", [M, header(msg_type), big], "bad_message"),
        ("oversized blobs", [M, header(msg_type), b"{}", b"z" * (CAP // 2), b"z" * (CAP // 2)], "bad_message"),
        ("over the socket frame cap", [M, header(msg_type), huge], None),
        ("body invalid utf-8", [M, header(msg_type), b'{"question": "\xff\xfe", "text": "\xc3\x28", "query": "\xed\xa0\x80"}'], "bad_message"),
        ("body not json", [M, header(msg_type), b"\x00\x01\x02"], "bad_message"),
        ("body a list", [M, header(msg_type), b"[]"], "bad_message"),
        ("body wrong field types", [M, header(msg_type), b'{"question": 5, "text": [], "query": {}, "passages": "p", "workspace": 1}'], "bad_message"),
        ("unknown type", [M, header("bogus_request"), b"{}"], "bad_message"),
        ("type with NUL", [M, header("status_request\x00"), b"{}"], "bad_message"),
        ("a reply type", [M, header("status_reply"), b"{}"], "bad_message"),
        ("a type it does not serve", [M, header("ask_request" if msg_type != "ask_request" else "search_request"), b'{"question": "q", "workspace": "w"}'], "bad_message"),
        ("an event", [M, header("file.changed"), b'{"workspace": "w", "root": "/", "path": "etc/passwd"}'], "bad_message"),
    ]
    if msg_type == "status_request":  # no fields: any object is a valid status request (unknown fields are ignored)
        cases = [c for c in cases if c[0] != "body wrong field types"]
    return cases


@pytest.fixture(scope="module")
def stack():
    base = short_tmpdir("wh")
    env = daemon_env(base, max_message_bytes=CAP, reranker_dir="/nonexistent", reranker_idle_s="3")
    root = base / "w"
    root.mkdir()
    (root / "net.py").write_text("def fetch_with_retry(url, attempts=3):\n    return [url] * attempts\n\n\nclass RetryPolicy:\n    limit = 3\n")
    (root / "cfg.py").write_text("def parse_config(path):\n    return dict(line.split('=', 1) for line in open(path))\n")
    (root / "link_out").symlink_to("/etc")
    (root / "passwd_link.py").symlink_to("/etc/passwd")
    wid = register(base / "data", root)
    d = Daemons(ALL, env, base)
    try:
        d.start()
        wait_until(lambda: not table_mismatches(d.data_dir, root), 120, 0.3, message=lambda: d.log_tail())
        yield d, root, wid
    finally:
        try:
            d.stop_all()
        finally:
            shutil.rmtree(base, ignore_errors=True)


def send_raw(d: Daemons, socket_name: str, frames: list[bytes], timeout_ms: int = 5000) -> ErrorReply | None | object:
    """Send frames on a fresh DEALER; the decoded reply body, or None when nothing came back."""
    sock = runtime.make_socket(zmq.Context.instance(), zmq.DEALER, max_bytes=10 * CAP)
    sock.setsockopt(zmq.SNDHWM, 10)
    try:
        sock.connect(d.endpoint(socket_name))
        sock.send_multipart(frames)
        if not sock.poll(timeout_ms):
            return None
        return envelope.decode(sock.recv_multipart()).body
    finally:
        sock.close(0)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("socket_name,msg_type", ROUTERS, ids=[r[0] for r in ROUTERS])
def test_garbage_on_router_socket(stack, socket_name: str, msg_type: str) -> None:
    """Every malformed message gets an error reply with its stable code, and the daemon keeps answering."""
    d, root, wid = stack
    daemon = OWNER.get(socket_name, socket_name.removesuffix(".ctl"))
    pid = d.pid(daemon)
    wrong = []
    cases = garbage(msg_type)
    for name, frames, code in cases:
        reply = send_raw(d, socket_name, frames, timeout_ms=5000 if code else 1500)
        if code is None:
            if reply is not None and not isinstance(reply, ErrorReply):
                wrong.append(f"{name}: answered {reply!r}")
        elif not isinstance(reply, ErrorReply) or reply.code != code:
            wrong.append(f"{name}: wanted {code}, got {reply!r}")
    INPUTS_TRIED[socket_name] = len(cases)
    assert not wrong, "\n".join(wrong)
    assert d.running(daemon) and d.pid(daemon) == pid
    assert d.status(daemon).daemon == daemon
    if socket_name == "front":
        reply = runtime.Client(d.endpoint("front")).request(AskRequest(question="where is the retry logic?", workspace=wid), timeout_ms=30000).body
        assert reply.context_line


@pytest.mark.timeout(120)
def test_garbage_on_reranker_worker_socket(stack) -> None:
    """Junk from an unknown peer on the broker's worker socket is ignored; the broker keeps answering."""
    d, root, wid = stack
    ctx = zmq.Context.instance()
    for ident in (b"\xff\xfe\x00", b"w999", b"w1"):
        sock = runtime.make_socket(ctx, zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, ident)
        sock.connect(d.endpoint("reranker.workers"))
        for frames in ([b"junk"], [b"WSRW1"], [b"WSRW1", b"READY", b"\xff{"], [b"WSRW1", b"RESULT", b"job", b"[]"], [b"WSRW1", b"NOPE"], [b""]):
            sock.send_multipart(frames)
        time.sleep(0.3)
        sock.close(0)
    INPUTS_TRIED["reranker.workers"] = 18
    assert d.running("reranker")
    assert d.status("reranker").daemon == "reranker"


OUTSIDE = ["../../etc/passwd", "/etc/passwd", "link_out/passwd", "passwd_link.py", "sub/../../x.py", "net.py\x00.txt"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("field", ["active_file", "visible_files", "open_documents", "buffers"])
def test_paths_outside_workspace_in_ask(stack, field: str) -> None:
    """A path outside the workspace in any field of ask_request that names a file is refused with bad_message."""
    d, root, wid = stack
    client = runtime.Client(d.endpoint("front"), sender="hostile")
    wrong = []
    for path in OUTSIDE:
        value = {"active_file": path, "visible_files": [str(root / "net.py"), path], "open_documents": [path],
                 "buffers": {path: "root:x:0:0:root:/root:/bin/bash\n"}}[field]
        try:
            reply = client.request(AskRequest(question="where is the retry logic?", workspace=wid, **{field: value}), timeout_ms=30000)
            wrong.append(f"{path!r}: answered {reply.body.context_line!r}")
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "code", None) is None or exc.code.value != "bad_message":
                wrong.append(f"{path!r}: {type(exc).__name__} {exc}")
    client.close()
    INPUTS_TRIED[f"ask_request.{field}"] = len(OUTSIDE)
    assert not wrong, "\n".join(wrong)
    # inside paths (relative and absolute) still work, and nothing from /etc ever appears
    reply = runtime.Client(d.endpoint("front")).request(
        AskRequest(question="where is the retry logic?", workspace=wid, active_file=str(root / "net.py"), visible_files=["cfg.py"]), timeout_ms=30000).body
    assert "root:x:0:0" not in reply.prompt
    assert d.running("front")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("field", ["workspace", "active_file", "visible_files", "open_documents", "buffers"])
def test_nul_in_a_path_field_without_workspace_is_bad_message(stack, field: str) -> None:
    """A NUL byte or a 5,000-character path in any path field, with no workspace given, is bad_message, never internal."""
    d, root, wid = stack
    client = runtime.Client(d.endpoint("front"), sender="hostile")
    wrong = []
    for path in (f"{root}/net.py\x00", "\x00", f"{root}/\x00/net.py", f"{root}/" + "a" * 5000):
        value = {"workspace": path, "active_file": path, "visible_files": [path], "open_documents": [path], "buffers": {path: "x = 1\n"}}[field]
        try:
            client.request(AskRequest(question="where is the retry logic?", **{field: value}), timeout_ms=30000)
            wrong.append(f"{path[:40]!r}: answered")
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "code", None) is None or exc.code.value != "bad_message":
                wrong.append(f"{path[:40]!r}: {type(exc).__name__} {exc}")
    client.close()
    INPUTS_TRIED[f"ask_request.{field}.no_workspace"] = 4
    assert not wrong, "\n".join(wrong)
    assert d.running("front")


def _push(d: Daemons, name: str, frames_list: list[list[bytes]]) -> None:
    sock = runtime.make_socket(zmq.Context.instance(), zmq.PUSH, max_bytes=10 * CAP)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(d.endpoint(name))
    for frames in frames_list:
        sock.send_multipart(frames)
    time.sleep(0.5)
    sock.close(2000)


def _rows_paths(d: Daemons, root: Path) -> set[str]:
    store = open_table(d.data_dir, root)
    return set(store.table.search().select(["path"]).limit(None).to_arrow().column("path").to_pylist()) if store else set()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("target", ["chunker.in", "embedder.in"])
def test_garbage_pushed_into_pull_socket(stack, target: str) -> None:
    """Garbage and hostile events pushed into a PULL socket are logged and dropped; the daemon keeps indexing."""
    d, root, wid = stack
    daemon = target.split(".")[0]
    pid = d.pid(daemon)
    bad_before = d.counter(daemon, "messages.bad")
    rooted = str(root.resolve())
    junk = [frames for _, frames, _ in garbage("file.changed") if len(b"".join(frames)) < 2 * CAP]
    hostile = []
    for path in ["../../etc/passwd", "/etc/passwd", "link_out/passwd", "passwd_link.py"]:
        hostile.append(envelope.encode(FileChanged(workspace=wid, root=rooted, path=path)))
        hostile.append(envelope.encode(ChunkBatch(workspace=wid, root=rooted, path=path, content_hash="h", chunker_version="x",
                                                  chunks=[ChunkRecord(index=0, text="root:x:0:0", start_line=1, end_line=1)])))
    # a root or workspace that is not the registered one
    hostile.append(envelope.encode(FileChanged(workspace=wid, root="/etc", path="passwd")))
    hostile.append(envelope.encode(FileChanged(workspace="../../../tmp/evil", root="/etc", path="passwd")))
    hostile.append(envelope.encode(ChunkBatch(workspace="../../../tmp/evil", root="/etc", path="passwd", content_hash="h", chunker_version="x",
                                              chunks=[ChunkRecord(index=0, text="root:x:0:0", start_line=1, end_line=1)])))
    hostile.append(envelope.encode(ChunkBatch(workspace=wid, root="/etc", path="passwd", content_hash="h", chunker_version="x",
                                              chunks=[ChunkRecord(index=0, text="root:x:0:0", start_line=1, end_line=1)])))
    hostile.append(envelope.encode(FileDeleted(workspace=wid, root=rooted, path="../net.py")))
    _push(d, target, junk + hostile)
    INPUTS_TRIED[target] = len(junk) + len(hostile)
    wait_until(lambda: d.counter(daemon, "messages.bad") - bad_before >= len(junk), 30, 0.3, message=lambda: d.log(daemon)[-3000:])
    # still indexing: a real edit lands
    (root / "cfg.py").write_text(f"def parse_config(path):\n    return {{'edited': {time.time()!r}}}\n")
    wait_until(lambda: not table_mismatches(d.data_dir, root), 60, 0.3, message=lambda: table_mismatches(d.data_dir, root))
    assert d.running(daemon) and d.pid(daemon) == pid
    paths = _rows_paths(d, root)
    assert not any("passwd" in p or p.startswith(("/", "..")) for p in paths), paths
    assert "net.py" in paths
    assert not (Path(d.data_dir).parent.parent / "tmp" / "evil").exists() and not Path("/tmp/evil").exists()
    texts = open_table(d.data_dir, root).table.search().select(["text"]).limit(None).to_arrow().column("text").to_pylist()
    assert not any("root:x:0:0" in t for t in texts)


def test_inputs_tried_summary(stack) -> None:
    """Print how many hostile inputs this module sent (for docs/reliability.md)."""
    print(f"hostile inputs tried: {sum(INPUTS_TRIED.values())} over {len(INPUTS_TRIED)} sockets/fields: {INPUTS_TRIED}")
