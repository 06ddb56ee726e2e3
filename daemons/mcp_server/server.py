"""The MCP server: the front daemon's answers as MCP tools, over stdio (official ``mcp`` SDK).

Run ``python -m daemons.mcp_server [--workspace PATH] [--runtime-dir DIR] [--data-dir DIR]`` from an MCP client's
configuration. Settings are loaded as the daemons load them (defaults, TOML file, ``WSCTX_*``);
``WSCTX_MCP_WORKSPACE`` (or ``--workspace``) is the default workspace of ``search_workspace``;
without it, the registered workspace that contains the server's working folder (where an MCP
client starts it), else the only one registered, else a tool error that lists them.

Tools:

- ``search_workspace(question, workspace=None, active_file=None, max_snippets=None)``: the
  text content is the prompt-ready answer (the instruction, the labelled blocks, then the
  context line); the structured content holds the blocks (label, path, lines, probability,
  text), the near misses, the context line, the searched query and the degraded modes.
  Successive questions of one server process form one conversation, so a follow-up
  ("and how is it tested?") is searched with the previous question in front.
- ``workspace_status()``: each daemon's status (``down`` with the reason when it does not answer).

An error reply from a daemon (or a daemon that is down) becomes a tool error (``is_error``) whose
text is ``<code>: <message>`` and whose structured content is ``{"error": {"code", "message"}}``;
the server itself keeps running.
"""
from __future__ import annotations

import argparse
import os
import sys
import uuid
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from daemons.client import DAEMONS, WorkspaceClient
from daemons.lib.workspaces import Registry
from daemons.lib.config import load_settings
from protocol.errors import ProtocolError, Timeout, Unavailable

SERVER_NAME = "wsctx"
INSTRUCTIONS = (
    "Search the user's code workspace with search_workspace before answering questions about "
    "their code. Cite the block labels (path:start-end) you use; ignore blocks that do not bear "
    "on the question."
)


class BlockOut(BaseModel):
    label: str
    path: str
    start_line: int
    end_line: int
    probability: float | None = None
    kind: str = "code"
    team: str | None = None
    retrievers: list[str] = []
    # "" or how the file differs from its indexed version (changed on disk, unsaved in the editor, deleted)
    changed: str = ""
    text: str


class NearMissOut(BaseModel):
    label: str
    path: str
    start_line: int
    end_line: int
    probability: float


class SearchResult(BaseModel):
    searched_query: str
    keyword_query: str
    context_line: str
    blocks: list[BlockOut]
    near_misses: list[NearMissOut] = []
    degraded: list[str] = []
    workspace: str | None = None


class StatusResult(BaseModel):
    daemons: dict[str, dict[str, Any]]
    up: list[str]
    down: list[str]


def _error_result(code: str, message: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=f"{code}: {message}")],
        structured_content={"error": {"code": code, "message": message}},
        is_error=True,
    )


def where_daemons(client: WorkspaceClient) -> str:
    """What to do when the daemons do not answer, and where this server looked for them."""
    s = client.settings
    return (f"Are the daemons running? Start them with `wsctx up`. This server looks for their sockets in {s.runtime_dir} "
            f"(WSCTX_RUNTIME_DIR or --runtime-dir) and for the registered workspaces in {s.data_dir} "
            "(WSCTX_DATA_DIR or --data-dir): give it the same as the shell that ran `wsctx up`")


def answer_text(prompt: str, context_line: str) -> str:
    """What the model reads: the prompt (instruction, labelled blocks) then the context line."""
    return prompt.rstrip("\n") + "\n\n" + context_line + "\n"


def cwd_workspace(client: WorkspaceClient) -> str | None:
    """The server's working folder when it is inside a registered workspace, else None (the front
    then takes the only registered workspace, or names them all). An MCP client starts its server
    in the project it works on, so this is the workspace the agent means; the roots capability
    that could say so otherwise is deprecated in the protocol (SEP-2577)."""
    try:
        Registry(client.settings.data_dir).resolve(os.getcwd())
    except (ProtocolError, OSError):
        return None
    return os.getcwd()


def search_result(reply: Any) -> SearchResult:
    """The tool's structured result for the front's ``AskReply``."""
    return SearchResult(
        searched_query=reply.searched_query,
        keyword_query=reply.keyword_query,
        context_line=reply.context_line,
        blocks=[
            BlockOut(label=b.label, path=b.path, start_line=b.start_line, end_line=b.end_line, probability=b.probability,
                     kind=b.kind, team=b.team, retrievers=list(b.retrievers), changed=b.changed, text=b.text)
            for b in reply.blocks
        ],
        near_misses=[
            NearMissOut(label=n.label, path=n.path, start_line=n.start_line, end_line=n.end_line, probability=n.probability)
            for n in reply.near_misses
        ],
        degraded=list(reply.degraded),
        workspace=str(reply.index.get("workspace")) if reply.index.get("workspace") else None,
    )


def status_text(statuses: dict[str, Any]) -> str:
    """One line per daemon (up with pid, uptime and queue, or down with the reason) and per workspace."""
    lines = []
    for name in DAEMONS:
        st = statuses.get(name) or {}
        if st.get("status") == "ok":
            lines.append(f"{name}: up (pid {st.get('pid')}, uptime {st.get('uptime_s', 0):.0f} s, queue {st.get('queue_depth', 0)})")
        else:
            lines.append(f"{name}: down ({st.get('code', '?')}: {st.get('message', '')})")
    workspaces = ((statuses.get("watcher") or {}).get("details") or {}).get("workspaces") or {}
    for wid, info in workspaces.items():
        if isinstance(info, dict):
            lines.append(
                f"workspace {wid}: {info.get('indexed_files', '?')} of {info.get('files', '?')} files indexed, "
                f"{info.get('pending', 0)} pending"
            )
    return "\n".join(lines) + "\n"


def build_server(client: WorkspaceClient, default_workspace: str | None = None) -> MCPServer:
    server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS)
    conversation = f"mcp-{uuid.uuid4().hex[:12]}"

    @server.tool(
        description=(
            "Find the code in the workspace that bears on a question (hybrid keyword + semantic "
            "search, reranked). Returns labelled code blocks (path:start-end) ready to cite, and "
            "a context line saying how they were found."
        )
    )
    def search_workspace(
        question: Annotated[str, Field(description=(
            "What to find, in plain words, or a whole issue text or traceback (up to 100,000 characters): "
            "'where is the retry logic?', 'why does parse_date fail on a trailing Z?'"))],
        workspace: Annotated[str | None, Field(description=(
            "A registered workspace: its id or any path inside it. Default: the workspace of the server's "
            "--workspace option, else the one containing the server's working folder, else the only one registered."))] = None,
        active_file: Annotated[str | None, Field(description=(
            "The file the user is looking at (absolute, or relative to the workspace): its code is "
            "searched with priority."))] = None,
        max_snippets: Annotated[int | None, Field(description=(
            "At most this many code blocks in the answer (at least 1; default: the daemons' snippet_count, 6)."))] = None,
        deadline_ms: Annotated[int | None, Field(description=(
            "Time budget for this question in milliseconds: a stage that cannot finish in it is skipped and "
            "named in the context line (0: wait for every stage; default: the daemons' question_deadline_ms, 2000)."))] = None,
    ) -> Annotated[CallToolResult, SearchResult]:
        ws = workspace or default_workspace or cwd_workspace(client)
        if active_file and not os.path.isabs(active_file) and not ws:
            active_file = os.path.abspath(active_file)
        if max_snippets is not None and max_snippets < 1:
            return _error_result("bad_message", "max_snippets must be at least 1")
        if deadline_ms is not None and deadline_ms < 0:
            return _error_result("bad_message", "deadline_ms must be at least 0")
        try:
            reply = client.ask(question, workspace=ws, active_file=active_file, conversation_id=conversation, snippet_count=max_snippets,
                               deadline_ms=deadline_ms)
        except (Timeout, Unavailable) as exc:
            return _error_result(exc.code.value, f"{exc.message}. {where_daemons(client)}")
        except ProtocolError as exc:
            return _error_result(exc.code.value, exc.message)
        except Exception as exc:  # noqa: BLE001 - a socket failure is still a tool error, not a crash
            return _error_result("internal", f"{type(exc).__name__}: {exc}")
        result = search_result(reply)
        return CallToolResult(
            content=[TextContent(type="text", text=answer_text(reply.prompt, reply.context_line))],
            structured_content=result.model_dump(mode="json"),
        )

    @server.tool(description="Status of each wsctx daemon (watcher, chunker, embedder, searcher, reranker, front) and of the indexing.")
    def workspace_status() -> Annotated[CallToolResult, StatusResult]:
        try:
            statuses = client.status()
        except Exception as exc:  # noqa: BLE001
            return _error_result("internal", f"{type(exc).__name__}: {exc}")
        up = [n for n in DAEMONS if statuses.get(n, {}).get("status") == "ok"]
        down = [n for n in DAEMONS if n not in up]
        result = StatusResult(daemons={k: v or {} for k, v in statuses.items()}, up=up, down=down)
        return CallToolResult(content=[TextContent(type="text", text=status_text(statuses))], structured_content=result.model_dump(mode="json"))

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m daemons.mcp_server", description="wsctx MCP server (stdio)")
    parser.add_argument("--workspace", default=os.environ.get("WSCTX_MCP_WORKSPACE") or None, help="default workspace (id or folder)")
    parser.add_argument("--runtime-dir", default=None, help="where the daemons' sockets are (default: from the settings)")
    parser.add_argument("--data-dir", default=None, help="where the daemons' registry and indexes are, to find the workspace "
                                                       "of the working folder (default: from the settings)")
    parser.add_argument("--timeout-ms", type=int, default=30000, help="deadline of one question")
    args = parser.parse_args(argv)
    workspace = os.path.abspath(args.workspace) if args.workspace and os.path.isdir(args.workspace) else args.workspace
    try:
        overrides = {k: os.path.abspath(v) for k, v in (("runtime_dir", args.runtime_dir), ("data_dir", args.data_dir)) if v}
        client = WorkspaceClient(timeout_ms=args.timeout_ms, settings=load_settings(**overrides))
    except ValueError as exc:
        print(f"wsctx mcp server: bad settings: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        build_server(client, workspace).run("stdio")
    finally:
        client.close()


if __name__ == "__main__":
    main()
