"""The stable error codes every reply may carry, and the exception tree that maps onto them.

    ProtocolError                  -> a reply with status "error" and one ErrorCode
    ├── BadMessage                 -> bad_message      (undecodable, wrong shape, too large)
    ├── VersionMismatch            -> version_mismatch (another major protocol version)
    ├── UnknownWorkspace           -> unknown_workspace
    ├── Timeout                    -> timeout
    ├── Unavailable                -> unavailable      (a model or a peer daemon is missing)
    └── Internal                   -> internal         (a bug; logged with its traceback)
"""
from __future__ import annotations

import enum


class ErrorCode(str, enum.Enum):
    """Codes carried by ``ErrorReply.code``; their strings never change."""

    BAD_MESSAGE = "bad_message"
    VERSION_MISMATCH = "version_mismatch"
    UNKNOWN_WORKSPACE = "unknown_workspace"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """Base of every error that becomes an error reply."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadMessage(ProtocolError):
    code = ErrorCode.BAD_MESSAGE


class VersionMismatch(ProtocolError):
    code = ErrorCode.VERSION_MISMATCH


class UnknownWorkspace(ProtocolError):
    code = ErrorCode.UNKNOWN_WORKSPACE


class Timeout(ProtocolError):
    code = ErrorCode.TIMEOUT


class Unavailable(ProtocolError):
    code = ErrorCode.UNAVAILABLE


class Internal(ProtocolError):
    code = ErrorCode.INTERNAL


_BY_CODE = {cls.code: cls for cls in (BadMessage, VersionMismatch, UnknownWorkspace, Timeout, Unavailable, Internal)}


def error_for(code: str, message: str) -> ProtocolError:
    """Rebuild the exception a remote error reply stands for (unknown codes become Internal)."""
    try:
        return _BY_CODE[ErrorCode(code)](message)
    except ValueError:
        return Internal(f"{code}: {message}")
