"""A small Python client for the front daemon (and the daemons' status), for editors and tools.

    from daemons.client import WorkspaceClient

    with WorkspaceClient() as wc:                      # settings as the daemons load them
        reply = wc.ask("where is the retry logic?", workspace="/path/to/repo",
                       active_file="/path/to/repo/src/net.py")
        print(reply.prompt)                            # labelled blocks, ready for a model
        print(reply.context_line)                      # how they were found
        print(wc.status())                             # {daemon: status dict or None when down}

``ask`` returns the front's ``AskReply``. A daemon's error reply is raised as the matching
``protocol.errors.ProtocolError`` subclass (``BadMessage``, ``UnknownWorkspace``, ``Timeout``,
``Unavailable`` ...), whose ``code`` is the stable error code and ``message`` the daemon's text;
a front that is down raises ``Unavailable`` within a fraction of a second, a front that does not
answer in ``timeout_ms`` raises ``Timeout``.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from daemons import DAEMONS
from daemons.lib import runtime
from daemons.lib.config import Settings, load_settings
from protocol.errors import ProtocolError
from protocol.schema import AskReply, AskRequest, AskSettings, StatusRequest

STATUS_TIMEOUT_MS = 1000


class WorkspaceClient:
    """Ask the front daemon questions; read the status of every daemon.

    ``runtime_dir`` (default: the settings' runtime directory, ``WSCTX_RUNTIME_DIR`` and the TOML
    file included) says where the ipc sockets are; ``endpoint`` overrides the front's endpoint
    (``ipc://...`` or ``tcp://host:port``); ``curve`` (``{"server_public", "public", "secret"}``
    as bytes) is used for a CURVE-protected tcp front. ``timeout_ms`` is the deadline of one ask.
    """

    def __init__(
        self,
        runtime_dir: str | None = None,
        endpoint: str | None = None,
        timeout_ms: int = 30000,
        *,
        settings: Settings | None = None,
        curve: dict[str, bytes] | None = None,
    ) -> None:
        if settings is None:
            overrides = {"runtime_dir": os.path.abspath(runtime_dir)} if runtime_dir else {}
            settings = load_settings(**overrides)
        elif runtime_dir:
            settings = _with_runtime(settings, runtime_dir)
        self.settings = settings
        self.endpoint = endpoint or settings.endpoint("front")
        self.timeout_ms = timeout_ms
        self._front = runtime.Client(self.endpoint, sender="client", curve=curve)

    # ------------------------------------------------------------------ asking

    def ask(
        self,
        question: str,
        workspace: str | None = None,
        active_file: str | None = None,
        visible_files: Iterable[str] = (),
        open_documents: Iterable[str] = (),
        buffers: Mapping[str, str] | None = None,
        conversation_id: str = "",
        threshold: float | None = None,
        snippet_count: int | None = None,
        budget_chars: int | None = None,
        *,
        include_team: bool = True,
        rerank: bool = True,
        deadline_ms: int | None = None,
        overrides: Mapping[str, str | int | float | bool] | None = None,
        timeout_ms: int | None = None,
    ) -> AskReply:
        """Ask one question; return the ``AskReply`` (blocks, prompt, context line, stages).

        ``workspace`` is a workspace id or a folder inside a registered workspace (a relative
        folder is made absolute here); when it is None the front picks it from the active file
        (or the only registered workspace). File fields are absolute or workspace-relative paths;
        ``buffers`` maps a path to the editor's unsaved text of that file. ``threshold``,
        ``snippet_count`` and ``budget_chars`` override the front's settings for this question, and
        ``deadline_ms`` its time budget (0: none): a stage that cannot finish in it is skipped and named.
        ``overrides`` are the question's own ranking settings (``config.QUESTION_SETTINGS``).
        """
        request = AskRequest(
            question=question,
            workspace=_workspace_ref(workspace),
            conversation_id=conversation_id,
            active_file=active_file,
            visible_files=list(visible_files),
            open_documents=list(open_documents),
            buffers=dict(buffers or {}),
            settings=AskSettings(threshold=threshold, snippet_count=snippet_count, budget_chars=budget_chars, rerank=rerank,
                                  deadline_ms=deadline_ms, overrides=dict(overrides or {})),
            include_team=include_team,
        )
        reply = self._front.request(request, timeout_ms=timeout_ms or self.timeout_ms)
        return reply.body

    # ------------------------------------------------------------------ status

    def status(self, daemons: Iterable[str] = DAEMONS, timeout_ms: int = STATUS_TIMEOUT_MS) -> dict[str, dict[str, Any] | None]:
        """``{daemon: its StatusReply as a dict}``; a daemon that is down or silent maps to
        ``{"status": "down", "code": ..., "message": ...}`` so callers see why."""
        out: dict[str, dict[str, Any] | None] = {}
        for name in daemons:
            try:
                reply = runtime.control_request(self.settings.control_endpoint(name), StatusRequest(), timeout_ms=timeout_ms)
                out[name] = msgspec.to_builtins(reply.body)
            except ProtocolError as exc:
                out[name] = {"status": "down", "code": exc.code.value, "message": exc.message}
        return out

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._front.close()

    def __enter__(self) -> WorkspaceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_runtime(settings: Settings, runtime_dir: str) -> Settings:
    import dataclasses

    return dataclasses.replace(settings, runtime_dir=os.path.abspath(runtime_dir))


def _workspace_ref(workspace: str | None) -> str:
    """An id stays as is; an existing folder given relative to our cwd becomes absolute."""
    if not workspace:
        return ""
    if not os.path.isabs(workspace) and os.path.isdir(workspace):
        return os.path.abspath(workspace)
    return workspace


__all__ = ["WorkspaceClient", "DAEMONS"]
