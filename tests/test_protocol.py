"""The envelope codec, the schema, protocol/SPEC.md kept in step with them, and a daemon's answers to bad input."""
from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import envelope
from protocol.envelope import MARKER, DecodeError, VersionError, decode, encode
from protocol.errors import ErrorCode, ProtocolError
from protocol.schema import (
    AskRequest,
    ChunkBatch,
    ChunkRecord,
    EmbedQueryReply,
    ErrorReply,
    FileChanged,
    MESSAGE_TYPES,
    PingRequest,
    SearchRequest,
    StatusReply,
    StatusRequest,
    reply_type,
)

SPEC = Path(__file__).resolve().parent.parent / "protocol" / "SPEC.md"
_json = msgspec.json.Encoder()


def frames_with(header: dict, body: dict | bytes, routing: list[bytes] = (), blobs: list[bytes] = ()) -> list[bytes]:
    base = {"msg_id": "m1", "msg_type": "status_request", "version": envelope.PROTOCOL_VERSION}
    base.update(header)
    raw = body if isinstance(body, bytes) else _json.encode(body)
    return [*routing, MARKER, _json.encode(base), raw, *blobs]


# --------------------------------------------------------------------------- SPEC.md in step


def spec_sections() -> dict[str, str]:
    """``{message type: its section text}`` from the ``### `name` `` headings of SPEC.md."""
    text = SPEC.read_text()
    out = {}
    for m in re.finditer(r"^### `([^`]+)`\s*$", text, re.M):
        end = re.compile(r"^#", re.M).search(text, m.end())
        out[m.group(1)] = text[m.end() : end.start() if end else len(text)]
    return out


def nested_structs(cls: type, seen: set[type]) -> set[type]:
    for f in msgspec.structs.fields(cls):
        for t in re.findall(r"protocol\.schema\.(\w+)", repr(f.type)) + ([f.type.__name__] if isinstance(f.type, type) else []):
            import protocol.schema as schema

            sub = getattr(schema, t, None)
            if isinstance(sub, type) and issubclass(sub, msgspec.Struct) and sub not in seen and sub.__name__ not in {c.__name__ for c in MESSAGE_TYPES.values()}:
                seen.add(sub)
                nested_structs(sub, seen)
    return seen


def test_spec_names_every_message_type_and_no_other():
    """SPEC.md has one section per message type of the schema, and none for a type the schema lacks."""
    sections = spec_sections()
    assert set(sections) == set(MESSAGE_TYPES), {"missing": set(MESSAGE_TYPES) - set(sections), "extra": set(sections) - set(MESSAGE_TYPES)}
    text = SPEC.read_text()
    named = set(re.findall(r"`([a-z_]+_(?:request|reply)|(?:file|chunks)\.[a-z]+)`", text))
    assert named <= set(MESSAGE_TYPES), named - set(MESSAGE_TYPES)


def test_spec_lists_every_field_of_every_body():
    """Every field of every body (and of the structs nested in them) appears in its SPEC.md table with its type."""
    sections = spec_sections()
    text = SPEC.read_text()
    for name, cls in MESSAGE_TYPES.items():
        assert f"Struct `{cls.__name__}`" in sections[name], name
        for f in msgspec.structs.fields(cls):
            assert re.search(rf"^\| `{f.name}` \|", sections[name], re.M), f"{name}.{f.name} missing from SPEC.md"
        if not msgspec.structs.fields(cls):
            assert "No fields" in sections[name]
    for sub in nested_structs_all():
        m = re.search(rf"^#### Struct `{sub.__name__}`\s*$(.*?)(?=^#|\Z)", text, re.M | re.S)
        assert m, f"nested struct {sub.__name__} missing from SPEC.md"
        for f in msgspec.structs.fields(sub):
            assert re.search(rf"^\| `{f.name}` \|", m.group(1), re.M), f"{sub.__name__}.{f.name} missing from SPEC.md"


def nested_structs_all() -> set[type]:
    seen: set[type] = set()
    for cls in MESSAGE_TYPES.values():
        nested_structs(cls, seen)
    return seen


def test_spec_lists_every_error_code_and_header_field():
    """Every ErrorCode and every header field is documented."""
    text = SPEC.read_text()
    for code in ErrorCode:
        assert re.search(rf"^\| `{code.value}` \|", text, re.M), code
    for f in msgspec.structs.fields(envelope.Header):
        assert re.search(rf"^\| `{f.name}` \|", text, re.M), f.name
    assert f"version {envelope.PROTOCOL_VERSION}" in text.splitlines()[0]


# --------------------------------------------------------------------------- codec


def test_round_trip_every_kind_of_body():
    """encode then decode gives back the same body, routing, blobs and reply linkage."""
    batch = ChunkBatch(workspace="w", root="/r", path="a.py", content_hash="h", chunker_version="1",
                       chunks=[ChunkRecord(index=0, text="def f(): pass", start_line=1, end_line=1, language="python")])
    ask = AskRequest(question="where is the retry logic?", visible_files=["a.py"], buffers={"a.py": "x = 1\n"})
    for body in (batch, ask, SearchRequest(workspace="w", question="q"), StatusRequest(), FileChanged(workspace="w", root="/r", path="é/ü.py")):
        frames = encode(body, routing=[b"id-1", b""], session="s1", sender="t")
        msg = decode(frames)
        assert msg.body == body and type(msg.body) is type(body)
        assert msg.routing == [b"id-1", b""] and msg.blobs == []
        assert msg.header.session == "s1" and msg.header.sender == "t" and msg.header.version == envelope.PROTOCOL_VERSION
    vec = b"\x00\x00\x80?" * 4
    req = decode(encode(PingRequest()))
    rep = decode(encode(EmbedQueryReply(model_id="m", dim=4), parent=req.header, blobs=[vec]))
    assert rep.blobs == [vec] and rep.header.parent_id == req.header.msg_id
    assert all(reply_type(n) in MESSAGE_TYPES for n in MESSAGE_TYPES if n.endswith("_request"))


def test_encode_refuses_unregistered_body():
    """Only registered bodies can be framed."""

    class Stray(msgspec.Struct):
        x: int = 0

    with pytest.raises(TypeError):
        encode(Stray())


def test_unknown_fields_are_ignored():
    """A newer peer's extra fields, in header and body, are ignored."""
    msg = decode(frames_with({"msg_type": "file.changed", "future_header": 1}, {"workspace": "w", "root": "/r", "path": "a", "new_field": [1, 2]}))
    assert msg.body == FileChanged(workspace="w", root="/r", path="a")


def test_minor_version_accepted_major_refused():
    """1.x interoperates; 2.0, 0.9 and a non-numeric major are refused with version_mismatch and routing kept."""
    assert isinstance(decode(frames_with({"version": "1.7"}, {})).body, StatusRequest)
    assert isinstance(decode(frames_with({"version": "1"}, {})).body, StatusRequest)
    for bad in ("2.0", "0.9", "x.1", "", "².0", "١.0"):
        with pytest.raises(VersionError) as ei:
            decode(frames_with({"version": bad}, {}, routing=[b"peer"]))
        assert ei.value.code is ErrorCode.VERSION_MISMATCH and ei.value.routing == [b"peer"]
        assert ei.value.header is not None and ei.value.header.msg_id == "m1"


@pytest.mark.parametrize(
    "frames, routing",
    [
        pytest.param([b"peer", b"garbage"], [b"peer"], id="no-marker"),
        pytest.param([b"peer", b"", b"x", b"y"], [b"peer", b""], id="no-marker-req-delimiter"),
        pytest.param([b"peer", MARKER], [b"peer"], id="truncated-nothing"),
        pytest.param([b"peer", MARKER, b'{"msg_id":"a","msg_type":"status_request"}'], [b"peer"], id="truncated-no-body"),
        pytest.param([b"peer", MARKER, b"{not json", b"{}"], [b"peer"], id="garbage-header"),
        pytest.param([b"peer", MARKER, b'{"msg_type":"status_request"}', b"{}"], [b"peer"], id="header-missing-msg-id"),
        pytest.param([b"peer", MARKER, b'{"msg_id":1,"msg_type":"status_request"}', b"{}"], [b"peer"], id="header-wrong-type"),
        pytest.param([b"peer", MARKER, b'{"msg_id":"\xff\xfe","msg_type":"status_request"}', b"{}"], [b"peer"], id="header-invalid-utf8"),
        pytest.param(frames_with({"msg_type": "no_such_request"}, {}, routing=[b"peer"]), [b"peer"], id="unknown-type"),
        pytest.param(frames_with({"msg_type": "file.changed"}, {"workspace": "w"}, routing=[b"peer"]), [b"peer"], id="missing-field"),
        pytest.param(frames_with({"msg_type": "file.changed"}, {"workspace": 1, "root": "/", "path": "a"}, routing=[b"peer"]), [b"peer"], id="wrong-field-type"),
        pytest.param(frames_with({}, b"[1, 2", routing=[b"peer"]), [b"peer"], id="garbage-body"),
        pytest.param(frames_with({"msg_type": "embed_query_request"}, b'{"text":"\xc3\x28"}', routing=[b"peer"]), [b"peer"], id="body-invalid-utf8"),
        pytest.param(frames_with({}, [], routing=[b"peer"]), [b"peer"], id="body-not-object"),
    ],
)
def test_bad_frames_raise_decode_error_with_routing(frames, routing):
    """Truncated, garbage, invalid-UTF-8, unknown-type and mis-shaped messages raise DecodeError (bad_message) keeping the routing."""
    with pytest.raises(DecodeError) as ei:
        decode(frames)
    assert ei.value.code is ErrorCode.BAD_MESSAGE and ei.value.routing == routing


def test_oversize_message_is_refused(monkeypatch):
    """A message over the size cap is a bad_message, routing kept."""
    monkeypatch.setattr(envelope, "MAX_MESSAGE_BYTES", 1000)
    ok = frames_with({"msg_type": "embed_query_request"}, {"text": "x" * 100}, routing=[b"peer"])
    assert decode(ok).body.text == "x" * 100
    with pytest.raises(DecodeError) as ei:
        decode(frames_with({"msg_type": "embed_query_request"}, {"text": "x" * 2000}, routing=[b"peer"]))
    assert "cap" in str(ei.value) and ei.value.routing == [b"peer"]
    with pytest.raises(DecodeError):
        decode(frames_with({}, {}, blobs=[b"\0" * 1001]))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_header_like = st.fixed_dictionaries(
    {},
    optional={
        "msg_id": st.one_of(st.text(max_size=8), _json_values),
        "msg_type": st.one_of(st.sampled_from(sorted(MESSAGE_TYPES)), st.text(max_size=12), _json_values),
        "version": st.one_of(st.sampled_from(["1.0", "1.9", "2.0", "1", "", "²", "1.x"]), st.text(max_size=5), _json_values),
        "parent_id": _json_values,
        "sent_at": _json_values,
    },
).map(lambda d: _json.encode(d))
_frame = st.one_of(st.binary(max_size=64), st.just(MARKER), st.just(b""), _header_like, _json_values.map(lambda v: _json.encode(v)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_frame, max_size=6))
def test_fuzz_decode_only_raises_protocol_errors(frames):
    """decode() on arbitrary frame lists returns a Message or raises a ProtocolError subclass, never anything else."""
    try:
        msg = decode(frames)
    except (DecodeError, VersionError) as exc:
        assert isinstance(exc, ProtocolError) and exc.code in (ErrorCode.BAD_MESSAGE, ErrorCode.VERSION_MISMATCH)
        assert all(isinstance(f, bytes) for f in exc.routing)
    else:
        assert type(msg.body) is MESSAGE_TYPES[msg.msg_type]


# --------------------------------------------------------------------------- a real daemon


@pytest.mark.timeout(60)
def test_daemon_control_socket_answers_bad_input_and_stays_alive(daemons):
    """Garbage frames, a wrong-version message and an unknown type sent to a real daemon's control socket get error replies with the right codes, and it still answers status."""
    d = daemons(["chunker"])
    d.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.control_endpoint("chunker"))

    def ask(frames: list[bytes]) -> envelope.Message:
        sock.send_multipart(frames)
        assert sock.poll(5000), "no reply"
        return decode(sock.recv_multipart())

    try:
        cases = [
            ([b"garbage"], ErrorCode.BAD_MESSAGE),
            ([b"\xff\xfe\x00"], ErrorCode.BAD_MESSAGE),
            ([MARKER, b"{not json", b"{}"], ErrorCode.BAD_MESSAGE),
            ([MARKER], ErrorCode.BAD_MESSAGE),
            (frames_with({"version": "2.0", "msg_id": "v2"}, {}), ErrorCode.VERSION_MISMATCH),
            (frames_with({"msg_type": "no_such_request", "msg_id": "u1"}, {}), ErrorCode.BAD_MESSAGE),
            (frames_with({"msg_type": "search_request", "msg_id": "s1"}, {"workspace": "w", "question": "q"}), ErrorCode.BAD_MESSAGE),
        ]
        for frames, code in cases:
            reply = ask(frames)
            assert isinstance(reply.body, ErrorReply), (frames, reply.body)
            assert reply.body.code == code.value, (frames, reply.body)
            assert reply.body.message
        # Where the header could be read, the error reply names the request it answers.
        assert ask(frames_with({"version": "2.0", "msg_id": "v2"}, {})).header.parent_id == "v2"
        assert ask(frames_with({"msg_type": "no_such_request", "msg_id": "u1"}, {})).header.parent_id == "u1"
        status = d.status("chunker")
        assert isinstance(status, StatusReply) and status.daemon == "chunker" and d.running("chunker")
        assert status.counters.get("requests.?.bad_message", 0) >= 3
        assert status.counters.get("requests.?.version_mismatch", 0) >= 1 or status.counters.get("requests.status_request.version_mismatch", 0) >= 1
    finally:
        sock.close(0)


def test_no_daemon_imports_another():
    """Each daemon package imports only itself, daemons.lib, protocol and models: shared logic lives in daemons/lib (DESIGN)."""
    import ast

    repo = SPEC.parent.parent
    daemons_dir = repo / "daemons"
    packages = {p.name for p in daemons_dir.iterdir() if p.is_dir() and (p / "__init__.py").exists() and p.name != "lib"}
    offences = []
    for pkg in sorted(packages):
        for path in (daemons_dir / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names] if isinstance(node, ast.Import) else []
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "daemons" and len(parts) > 1 and parts[1] in packages and parts[1] != pkg:
                        offences.append(f"{path.relative_to(repo)} imports {name}")
    assert offences == []
