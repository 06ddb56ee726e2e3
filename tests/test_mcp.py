"""The MCP server (``python -m daemons.mcp_server``) driven by the official SDK's own stdio client,
against real daemons (watcher, chunker, embedder, searcher, front; no reranker) on a small workspace."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from daemons.lib.workspaces import Registry
from tests.support import daemon_env, short_tmpdir
from tests.test_front import FILES, Stack, file_lines

REPO = Path(__file__).resolve().parent.parent


async def _session(env: dict[str, str], fn: Callable[[ClientSession], Awaitable[Any]], args: tuple[str, ...] = (), cwd: Path = REPO) -> Any:
    params = StdioServerParameters(command=sys.executable, args=["-m", "daemons.mcp_server", *args], env=env, cwd=str(cwd))
    with open(Path(env["WSCTX_RUNTIME_DIR"]).parent / "mcp-stderr.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=60) as session:
                await session.initialize()
                return await fn(session)


def in_session(env: dict[str, str], fn: Callable[[ClientSession], Awaitable[Any]], *args: str, cwd: Path = REPO) -> Any:
    return anyio.run(_session, env, fn, args, cwd)


@pytest.fixture(scope="module")
def mstack():
    s = Stack(short_tmpdir("wm"), ("watcher", "chunker", "embedder", "searcher", "front"), FILES)
    try:
        s.start()
        yield s
    except BaseException:
        print(s.d.log_tail())
        raise
    finally:
        s.close()


@pytest.mark.timeout(300)
def test_tools_are_listed_with_their_schemas(mstack):
    """The server lists search_workspace (question required, optional workspace/active_file/max_snippets/deadline_ms) and workspace_status."""
    async def go(session: ClientSession):
        return (await session.list_tools()).tools

    tools = {t.name: t for t in in_session(mstack.env, go)}
    assert set(tools) == {"search_workspace", "workspace_status"}
    schema = tools["search_workspace"].input_schema
    assert schema["required"] == ["question"]
    assert set(schema["properties"]) == {"question", "workspace", "active_file", "max_snippets", "deadline_ms"}
    assert all(prop.get("description") for prop in schema["properties"].values()), schema["properties"]
    assert tools["search_workspace"].output_schema is not None
    assert tools["search_workspace"].description


@pytest.mark.timeout(180)
def test_search_workspace_returns_labelled_blocks_and_context_line(mstack):
    """search_workspace returns the prompt-ready text (labelled blocks, then the context line) and the same blocks as structured content."""
    async def go(session: ClientSession):
        first = await session.call_tool("search_workspace", {"question": "how is the config file parsed?", "workspace": str(mstack.root)})
        one = await session.call_tool("search_workspace", {"question": "how is the config file parsed?", "workspace": str(mstack.root), "max_snippets": 1,
                                                          "deadline_ms": 1})
        follow = await session.call_tool("search_workspace", {"question": "and how is it tested?", "workspace": str(mstack.root)})
        return first, one, follow

    first, one, follow = in_session(mstack.env, go)
    assert not first.is_error, first.content
    text = first.content[0].text
    data = first.structured_content
    assert data["blocks"] and data["blocks"][0]["path"] == "config_parser.py"
    for b in data["blocks"]:
        assert b["label"] == f"{b['path']}:{b['start_line']}-{b['end_line']}"
        assert b["text"] == file_lines(mstack.root, b["path"], b["start_line"], b["end_line"])
        assert b["label"] in text
        assert "probability" in b
    assert "cite its label" in text
    assert text.rstrip("\n").splitlines()[-1] == data["context_line"]
    assert data["context_line"].startswith('searched "how is the config file parsed?"')
    assert "fused order (reranker unavailable)" in data["degraded"]
    assert isinstance(data["near_misses"], list)
    assert data["workspace"] == mstack.wid
    assert not one.is_error and len([b for b in one.structured_content["blocks"] if b["kind"] == "code"]) == 1
    assert "blocks not widened (question deadline)" in one.structured_content["degraded"]  # its 1 ms budget was spent
    assert all(b["changed"] == "" for b in data["blocks"])
    # one server process is one conversation: the follow-up carries the previous question
    assert follow.structured_content["searched_query"] == "how is the config file parsed? and how is it tested?"


@pytest.mark.timeout(180)
def test_workspace_status_and_daemon_errors_become_tool_errors(mstack):
    """workspace_status reports each daemon; a daemon's error reply is a tool error with its code, and the server keeps serving."""
    async def go(session: ClientSession):
        status = await session.call_tool("workspace_status", {})
        bad = await session.call_tool("search_workspace", {"question": "config", "workspace": str(mstack.root), "active_file": "/etc/passwd"})
        unknown = await session.call_tool("search_workspace", {"question": "config", "workspace": "/nonexistent/elsewhere"})
        again = await session.call_tool("search_workspace", {"question": "how is the config file parsed?"}, )
        return status, bad, unknown, again

    status, bad, unknown, again = in_session(mstack.env, go, "--workspace", str(mstack.root))
    assert not status.is_error
    assert set(status.structured_content["up"]) == {"watcher", "chunker", "embedder", "searcher", "front"}
    assert status.structured_content["down"] == ["reranker"]
    assert "front: up" in status.content[0].text and "reranker: down" in status.content[0].text
    assert f"workspace {mstack.wid}: {len(FILES)} of {len(FILES)} files indexed" in status.content[0].text
    assert bad.is_error and bad.content[0].text.startswith("bad_message: ")
    assert bad.structured_content["error"]["code"] == "bad_message"
    assert unknown.is_error and unknown.structured_content["error"]["code"] == "unknown_workspace"
    assert not again.is_error and again.structured_content["blocks"][0]["path"] == "config_parser.py"


@pytest.mark.timeout(180)
def test_without_a_workspace_the_server_uses_the_one_it_was_started_in(mstack):
    """With two workspaces registered and none named, a server started inside one searches that one, and a server started elsewhere gets an error that lists both."""
    other = short_tmpdir("wo")
    registry = Registry(mstack.d.data_dir)
    other_id, _ = registry.add(other)
    try:
        async def go(session: ClientSession):
            return await session.call_tool("search_workspace", {"question": "how is the config file parsed?"})

        inside = in_session(mstack.env, go, cwd=mstack.root / "auth")
        elsewhere = in_session(mstack.env, go, cwd=other.parent)
    finally:
        registry.remove(other_id)
        shutil.rmtree(other, ignore_errors=True)
    assert not inside.is_error, inside.content
    assert inside.structured_content["workspace"] == mstack.wid
    assert inside.structured_content["blocks"][0]["path"] == "config_parser.py"
    assert elsewhere.is_error and elsewhere.structured_content["error"]["code"] == "unknown_workspace"
    assert str(mstack.root) in elsewhere.content[0].text and str(other) in elsewhere.content[0].text


@pytest.mark.timeout(300)
def test_the_data_dir_option_finds_the_workspace_of_the_working_folder(mstack):
    """A server started with a bare environment inside a workspace, given --runtime-dir and --data-dir, searches that workspace."""
    other = short_tmpdir("wo")
    registry = Registry(mstack.d.data_dir)
    other_id, _ = registry.add(other)  # two registered: the working folder must decide
    bare = {k: v for k, v in mstack.env.items() if k not in ("WSCTX_RUNTIME_DIR", "WSCTX_DATA_DIR")}
    bare["XDG_DATA_HOME"] = str(other / "nowhere")
    bare["XDG_RUNTIME_DIR"] = str(other / "nowhere-run")
    bare["WSCTX_RUNTIME_DIR"] = mstack.env["WSCTX_RUNTIME_DIR"]  # in_session keeps its stderr log beside it
    try:
        async def go(session: ClientSession):
            return await session.call_tool("search_workspace", {"question": "how is the config file parsed?"})

        without = in_session({**bare}, go, cwd=mstack.root / "auth")
        found = in_session(bare, go, "--runtime-dir", mstack.env["WSCTX_RUNTIME_DIR"], "--data-dir", mstack.env["WSCTX_DATA_DIR"],
                           cwd=mstack.root / "auth")
    finally:
        registry.remove(other_id)
        shutil.rmtree(other, ignore_errors=True)
    assert without.is_error  # the default data dir holds no registry
    assert not found.is_error, found.content
    assert found.structured_content["workspace"] == mstack.wid


@pytest.mark.timeout(120)
def test_front_down_is_a_tool_error_not_a_crash():
    """With no front running, search_workspace answers a tool error (unavailable) and the server still answers afterwards."""
    base = short_tmpdir("wn")
    try:
        env = daemon_env(base)
        (base / "run").mkdir()

        async def go(session: ClientSession):
            first = await session.call_tool("search_workspace", {"question": "where is the retry logic?"})
            status = await session.call_tool("workspace_status", {})
            tools = await session.list_tools()
            return first, status, tools

        first, status, tools = in_session(env, go)
        assert first.is_error
        assert first.content[0].text.startswith("unavailable: ")
        assert first.structured_content["error"]["code"] == "unavailable"
        # it says what to run and where it looked, so a client started with another environment can be pointed right
        text = first.content[0].text
        assert "wsctx up" in text and env["WSCTX_RUNTIME_DIR"] in text and env["WSCTX_DATA_DIR"] in text
        assert "WSCTX_RUNTIME_DIR" in text and "--data-dir" in text
        assert not status.is_error and status.structured_content["up"] == []
        assert len(tools.tools) == 2
    finally:
        shutil.rmtree(base, ignore_errors=True)
