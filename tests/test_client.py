"""``daemons.client.WorkspaceClient`` against a real front daemon (alone: no index, no searcher), and with nothing running."""
from __future__ import annotations

import shutil
import time

import pytest

from daemons.client import DAEMONS, WorkspaceClient
from protocol.errors import BadMessage, Unavailable, UnknownWorkspace
from protocol.schema import AskReply
from tests.support import Daemons, daemon_env, register, short_tmpdir


@pytest.fixture(scope="module")
def front_only():
    base = short_tmpdir("wc")
    root = base / "w"
    root.mkdir()
    (root / "app.py").write_text("def main():\n    print('hello')\n")
    env = daemon_env(base)
    d = Daemons(["front"], env, base)
    wid = register(d.data_dir, root)
    try:
        d.start()
        yield d, root, wid
    finally:
        d.stop_all()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(60)
def test_front_down_raises_unavailable_quickly():
    """Asking when no front runs raises Unavailable within a second, and status says every daemon is down."""
    base = short_tmpdir("wc")
    try:
        (base / "run").mkdir()
        with WorkspaceClient(runtime_dir=str(base / "run"), timeout_ms=10000) as c:
            t0 = time.monotonic()
            with pytest.raises(Unavailable) as info:
                c.ask("where is the retry logic?")
            assert time.monotonic() - t0 < 1.5
            assert info.value.code.value == "unavailable"
            status = c.status()
        assert list(status) == list(DAEMONS)
        assert all(s["status"] == "down" and s["code"] == "unavailable" for s in status.values())
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(120)
def test_ask_returns_an_ask_reply(front_only):
    """ask returns the front's AskReply; without a searcher or an index it is still answered, degraded."""
    d, root, wid = front_only
    with WorkspaceClient(runtime_dir=d.runtime_dir) as c:
        reply = c.ask("where is main defined?", workspace=str(root), active_file="app.py", conversation_id="c1",
                      threshold=0.5, snippet_count=2, budget_chars=500)
        by_id = c.ask("where is main defined?", workspace=wid)
    assert isinstance(reply, AskReply)
    assert reply.searched_query == "where is main defined?"
    assert reply.index["workspace"] == wid and by_id.index["workspace"] == wid
    assert any("searcher unavailable" in x for x in reply.degraded)
    assert reply.context_line.startswith('searched "where is main defined?"')


@pytest.mark.timeout(120)
def test_errors_are_raised_with_their_code(front_only):
    """A bad path raises BadMessage and an unknown workspace raises UnknownWorkspace, each with its stable code."""
    d, root, wid = front_only
    with WorkspaceClient(runtime_dir=d.runtime_dir) as c:
        with pytest.raises(BadMessage) as bad:
            c.ask("main", workspace=str(root), visible_files=["../../etc/passwd"])
        with pytest.raises(UnknownWorkspace) as unknown:
            c.ask("main", workspace="/nonexistent/ws")
        with pytest.raises(BadMessage):
            c.ask("   ", workspace=str(root))
    assert bad.value.code.value == "bad_message"
    assert unknown.value.code.value == "unknown_workspace"


@pytest.mark.timeout(60)
def test_status_reports_running_daemons(front_only):
    """status gives each daemon's status: the front's reply with its pid, and down for the others."""
    d, root, wid = front_only
    c = WorkspaceClient(runtime_dir=d.runtime_dir)
    try:
        status = c.status()
    finally:
        c.close()
    assert status["front"]["status"] == "ok" and status["front"]["daemon"] == "front"
    assert status["front"]["pid"] == d.pid("front")
    assert all(status[n]["status"] == "down" for n in DAEMONS if n != "front")
