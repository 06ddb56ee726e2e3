"""The single codec that owns framing, ids and checks for every socket.

Wire form of one message (ZeroMQ multipart)::

    [routing id frames ...] b"WSCTX" header body [blob ...]

``header`` is JSON: msg_id, msg_type, parent_id, session, sender, sent_at (unix seconds, float),
version ("MAJOR.MINOR"). ``body`` is the JSON of the Struct named by msg_type. ``blob`` frames are
raw bytes (float32 vectors). Everything before the marker frame is routing (ROUTER identities,
REQ's empty delimiter) and is handed back untouched so a reply can be routed.
A different MAJOR version is refused (``version_mismatch``); minor versions interoperate.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field

import msgspec

from protocol.errors import BadMessage, VersionMismatch
from protocol.schema import MESSAGE_TYPES, TYPE_NAMES, Body

MARKER = b"WSCTX"
PROTOCOL_VERSION = "1.0"
PROTOCOL_MAJOR = 1
#: A whole message larger than this is refused with ``bad_message`` (sockets also cap frames).
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def _message_cap(raw: str | None) -> int:
    """The cap ``WSCTX_MAX_MESSAGE_BYTES`` sets; the default for a value that is not a positive
    whole number (``config.load_settings`` then refuses the variable by name, so a daemon never
    starts on it)."""
    try:
        value = int(raw) if raw is not None else DEFAULT_MAX_MESSAGE_BYTES
    except ValueError:
        return DEFAULT_MAX_MESSAGE_BYTES
    return value if value > 0 else DEFAULT_MAX_MESSAGE_BYTES


MAX_MESSAGE_BYTES = _message_cap(os.environ.get("WSCTX_MAX_MESSAGE_BYTES"))


class Header(msgspec.Struct, kw_only=True):
    msg_id: str
    msg_type: str
    parent_id: str = ""
    session: str = ""
    sender: str = ""
    sent_at: float = 0.0
    version: str = PROTOCOL_VERSION


@dataclass
class Message:
    """A decoded message: routing frames, header, typed body and raw blobs."""

    header: Header
    body: Body
    routing: list[bytes] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)

    @property
    def msg_type(self) -> str:
        return self.header.msg_type


class DecodeError(BadMessage):
    """A ``bad_message`` that remembers the routing and header it could recover, to answer it."""

    def __init__(self, message: str, routing: list[bytes], header: Header | None) -> None:
        super().__init__(message)
        self.routing = routing
        self.header = header


class VersionError(VersionMismatch):
    def __init__(self, message: str, routing: list[bytes], header: Header | None) -> None:
        super().__init__(message)
        self.routing = routing
        self.header = header


_header_decoder = msgspec.json.Decoder(Header)
_decoders = {name: msgspec.json.Decoder(cls) for name, cls in MESSAGE_TYPES.items()}
_encoder = msgspec.json.Encoder()


def new_id() -> str:
    return uuid.uuid4().hex


def encode(
    body: Body,
    *,
    parent: Header | None = None,
    session: str = "",
    sender: str = "",
    routing: list[bytes] | None = None,
    blobs: list[bytes] | tuple[bytes, ...] = (),
) -> list[bytes]:
    """Frame ``body`` (its msg_type taken from the registry) ready for ``send_multipart``."""
    try:
        msg_type = TYPE_NAMES[type(body)]
    except KeyError:
        raise TypeError(f"{type(body).__name__} is not a registered message") from None
    header = Header(
        msg_id=new_id(),
        msg_type=msg_type,
        parent_id=parent.msg_id if parent else "",
        session=session or (parent.session if parent else ""),
        sender=sender,
        sent_at=time.time(),
    )
    return [*(routing or []), MARKER, _encoder.encode(header), _encoder.encode(body), *blobs]


def decode(frames: list[bytes]) -> Message:
    """Parse frames into a Message; raise DecodeError / VersionError carrying what was recoverable."""
    frames = [bytes(f) for f in frames]
    try:
        at = frames.index(MARKER)
    except ValueError:
        # No marker: treat a leading run of frames as routing if the last-but-one looks like REQ's delimiter.
        routing = frames[: frames.index(b"") + 1] if b"" in frames else frames[:1]
        raise DecodeError("no WSCTX marker frame: not a wsctx message", routing, None) from None
    routing, rest = frames[:at], frames[at + 1 :]
    total = sum(len(f) for f in rest)
    if total > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {total} bytes exceeds the {MAX_MESSAGE_BYTES}-byte cap", routing, None)
    if len(rest) < 2:
        raise DecodeError("truncated message: header and body frames required", routing, None)
    try:
        header = _header_decoder.decode(rest[0])
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DecodeError(f"undecodable header: {exc}", routing, None) from None
    major = header.version.split(".", 1)[0]
    # ASCII digits only: "²".isdigit() is True but int("²") raises.
    if not (major.isascii() and major.isdigit()) or int(major) != PROTOCOL_MAJOR:
        raise VersionError(
            f"protocol version {header.version!r} refused; this side speaks {PROTOCOL_VERSION}", routing, header
        )
    decoder = _decoders.get(header.msg_type)
    if decoder is None:
        raise DecodeError(f"unknown message type {header.msg_type!r}", routing, header)
    try:
        # msgspec skips unknown fields without looking at them: check the whole body is UTF-8 first.
        rest[1].decode("utf-8")
        body = decoder.decode(rest[1])
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise DecodeError(f"bad {header.msg_type} body: {exc}", routing, header) from None
    return Message(header=header, body=body, routing=routing, blobs=rest[2:])
