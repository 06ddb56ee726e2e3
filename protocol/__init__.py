"""The wsctx wire protocol: one versioned envelope, msgspec bodies, stable error codes."""
from protocol.envelope import MARKER, MAX_MESSAGE_BYTES, PROTOCOL_VERSION, Header, Message, decode, encode
from protocol.errors import ErrorCode, ProtocolError

__all__ = ["MARKER", "MAX_MESSAGE_BYTES", "PROTOCOL_VERSION", "Header", "Message", "decode", "encode", "ErrorCode", "ProtocolError"]
