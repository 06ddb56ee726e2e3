"""Faults with real processes under supervisord: kill -9, an embedder outage, a missing reranker model,
a read-only index, a deleted workspace, a branch switch, and hostile files on disk.

One supervisord (from the repository's ``supervisord.conf``, rendered the way ``wsctx up`` does)
runs all six daemons for the whole module; each test registers its own small workspace. After
every fault: the table matches the disk (every file's hash and rows, ``tests.support``), every
question asked meanwhile by a background client got an answer (degraded where it had to be:
``errors == 0``), and no daemon stayed dead (status answers, with a new pid where one was killed).

Durations that the issue names are constants overridable by environment variables:
``WSCTX_FAULT_EMBEDDER_OUTAGE_S`` (60), ``WSCTX_FAULT_BRANCH_FILES`` (1000),
``WSCTX_FAULT_BIG_FILE_MB`` (50).
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from daemons import supervision
from daemons.supervision import processes_for
from daemons.lib import runtime
from daemons.lib.config import load_settings
from protocol import envelope
from protocol.schema import AskReply, AskRequest, ErrorReply, PingRequest, StatusRequest, WorkspaceAddRequest
from tests.support import REPO, daemon_env, open_table, short_tmpdir, standin_cross_encoder, table_mismatches, wait_until

DAEMONS = ("watcher", "chunker", "embedder", "searcher", "reranker", "front")
EMBEDDER_OUTAGE_S = float(os.environ.get("WSCTX_FAULT_EMBEDDER_OUTAGE_S", "60"))
BRANCH_FILES = int(os.environ.get("WSCTX_FAULT_BRANCH_FILES", "1000"))
BIG_FILE_MB = int(os.environ.get("WSCTX_FAULT_BIG_FILE_MB", "50"))
INDEX_TIMEOUT = 180
REAL_CE = REPO / "models" / "artifacts" / "cross-encoder"
FUSED_ORDER = "fused order (reranker unavailable)"


# ---------------------------------------------------------------------------- a workspace


def module_text(i: int, rev: int = 0) -> str:
    """A small Python module about one made-up topic (so questions find something)."""
    topic = ["retry", "config", "cache", "parser", "socket", "auth", "backoff", "logging"][i % 8]
    return (
        f'"""The {topic} helpers, module {i} (revision {rev})."""\n'
        "import time\n\n\n"
        f"def {topic}_step_{i}(value: int, attempts: int = {3 + rev}) -> int:\n"
        f'    """Run one {topic} step on ``value``, trying ``attempts`` times."""\n'
        "    for n in range(attempts):\n"
        "        if value % (n + 2) == 0:\n"
        "            return value + n\n"
        "        time.sleep(0)\n"
        f"    return value * {i + 1}\n\n\n"
        f"class {topic.capitalize()}Policy{i}:\n"
        f"    limit = {10 + rev}\n\n"
        "    def allowed(self, count: int) -> bool:\n"
        "        return count < self.limit\n"
    )


def make_workspace(root: Path, n: int = 12) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        sub = root / ("pkg" if i % 2 else "lib")
        sub.mkdir(exist_ok=True)
        (sub / f"mod{i}.py").write_text(module_text(i))
    (root / "README.md").write_text("# Demo\n\nA demo workspace with retry and config helpers.\n")
    return root


# ---------------------------------------------------------------------------- a reranker model


def fixture_cross_encoder(folder: Path) -> Path:
    """The shipped cross-encoder when it is built, else a tiny ONNX stand-in with a real tokenizer."""
    if (REAL_CE / "manifest.json").is_file():
        shutil.copytree(REAL_CE, folder)
        return folder
    return standin_cross_encoder(folder)


# ---------------------------------------------------------------------------- asking like an editor


def ask_once(ctx: zmq.Context, endpoint: str, req: AskRequest, timeout_ms: int, curve: dict[str, bytes] | None = None) -> tuple[str, Any]:
    """One try: ``("ok", AskReply)``, ``("error", ErrorReply)`` or ``("down", reason)`` (no reply in time / not there)."""
    sock = runtime.make_socket(ctx, zmq.DEALER)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    if curve:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = curve["server_public"], curve["public"], curve["secret"]
    try:
        sock.connect(endpoint)
        if not sock.poll(500, zmq.POLLOUT):
            return "down", "not connected"
        sock.send_multipart(envelope.encode(req, sender="fault-client"))
        if not sock.poll(timeout_ms):
            return "down", f"no reply in {timeout_ms} ms"
        msg = envelope.decode(sock.recv_multipart())
        if isinstance(msg.body, ErrorReply):
            return "error", msg.body
        return "ok", msg.body
    finally:
        sock.close(0)


def ask(endpoint: str, req: AskRequest, deadline_s: float = 90.0, timeout_ms: int = 30000, ctx: zmq.Context | None = None) -> tuple[str, Any]:
    """Ask until answered (Lazy Pirate: a front that is down or silent is tried again), up to ``deadline_s``."""
    ctx = ctx or zmq.Context.instance()
    end = time.monotonic() + deadline_s
    while True:
        kind, value = ask_once(ctx, endpoint, req, timeout_ms)
        if kind != "down" or time.monotonic() > end:
            return kind, value
        time.sleep(0.2)


QUESTIONS = ["where is the retry logic?", "how is the config parsed?", "cache policy limit", "which function does backoff",
             "socket step attempts", "auth policy allowed count"]


class Asker(threading.Thread):
    """Asks questions in a loop until stopped; records answers, degraded answers and errors. With
    ``fresh`` every question is new (numbered), so no answer can come from the reranker's pair cache."""

    def __init__(self, endpoint: str, workspace: str, pause_s: float = 0.2, fresh: bool = False) -> None:
        super().__init__(daemon=True, name="asker")
        self.endpoint, self.workspace, self.pause_s, self.fresh = endpoint, workspace, pause_s, fresh
        self.stop_event = threading.Event()
        self.in_flight = threading.Event()
        self.answered = 0
        self.degraded = 0
        self.degraded_kinds: set[str] = set()
        self.errors: list[str] = []
        self.latencies: list[float] = []

    def run(self) -> None:
        ctx = zmq.Context.instance()
        i = 0
        while not self.stop_event.is_set():
            q = QUESTIONS[i % len(QUESTIONS)] + (f" (question {i})" if self.fresh else "")
            i += 1
            t0 = time.monotonic()
            self.in_flight.set()
            try:
                kind, value = ask(self.endpoint, AskRequest(question=q, workspace=self.workspace), ctx=ctx)
            except Exception as exc:  # noqa: BLE001 - a decode error is an error too
                kind, value = "error", exc
            self.in_flight.clear()
            if kind == "ok":
                self.answered += 1
                self.latencies.append(time.monotonic() - t0)
                if value.degraded:
                    self.degraded += 1
                    self.degraded_kinds.update(value.degraded)
            else:
                self.errors.append(f"{q!r}: {kind}: {value}")
            self.stop_event.wait(self.pause_s)

    def finish(self) -> "Asker":
        self.stop_event.set()
        self.join(120)
        return self


# ---------------------------------------------------------------------------- the supervised stack


def _pids_with_runtime_dir(rt: str) -> list[int]:
    """Processes (any parent) whose environment names this test's runtime dir."""
    return processes_for(rt)


class Supervised:
    """supervisord running the six daemons from the repository's supervisord.conf, in a short temp dir.

    As root, supervisord (and so every daemon) runs without CAP_DAC_OVERRIDE, so that file modes
    bind it as they would bind a normal user (the read-only index test needs that).
    """

    def __init__(self, base: Path, **settings: Any) -> None:
        self.base = base
        self.env = daemon_env(base, **settings)
        self.settings = load_settings(env=self.env)
        runtime.prepare_runtime_dir(self.settings.runtime_dir)
        logs = Path(self.settings.data_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        values = {"WSCTX_PYTHON": sys.executable, "WSCTX_RUNTIME_DIR": self.settings.runtime_dir,
                  "WSCTX_DATA_DIR": self.settings.data_dir, "WSCTX_CONFIG": self.env["WSCTX_CONFIG"]}
        conf = supervision.render_supervisor_conf(supervision.TEMPLATE.read_text(), values, DAEMONS, str(REPO))
        self.conf = Path(self.settings.runtime_dir) / "supervisord.conf"
        self.conf.write_text(conf)
        prefix: list[str] = []
        self.dropped_root = False
        if os.geteuid() == 0 and shutil.which("setpriv"):
            prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
            self.dropped_root = True
        self.log_path = base / "supervisord.out"
        self._out = open(self.log_path, "wb")
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf), "--nodaemon"],
                                     env=self.env, cwd=str(REPO), stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.ctx = zmq.Context.instance()

    # -------------------------------------------------------------- talking

    def endpoint(self, name: str) -> str:
        return self.settings.endpoint(name)

    def status(self, name: str, timeout_ms: int = 3000):
        return runtime.control_request(self.settings.control_endpoint(name), StatusRequest(), timeout_ms=timeout_ms).body

    def pid(self, name: str) -> int:
        return int(self.status(name).pid)

    def alive(self, name: str) -> bool:
        try:
            runtime.control_request(self.settings.control_endpoint(name), PingRequest(), timeout_ms=1000)
            return True
        except Exception:  # noqa: BLE001
            return False

    def wait_all(self, timeout: float = 120.0) -> dict[str, int]:
        wait_until(lambda: all(self.alive(d) for d in DAEMONS), timeout, 0.3, message=lambda: f"daemons not all up: {self.tail()}")
        return {d: self.pid(d) for d in DAEMONS}

    def supervisor_states(self) -> dict[str, str]:

        try:
            return {p["name"]: p["statename"] for p in supervision.supervisor_rpc(self.settings).supervisor.getAllProcessInfo()}
        except Exception as exc:  # noqa: BLE001
            return {"?": repr(exc)}

    def kill9(self, name: str, timeout: float = 90.0) -> tuple[int, int]:
        """kill -9 the daemon's pid (from its status reply) and wait until supervisord has restarted it."""
        old = self.pid(name)
        os.kill(old, signal.SIGKILL)

        def restarted() -> int:
            new = self.pid(name)
            return new if new != old else 0

        new = wait_until(restarted, timeout, 0.3, message=lambda: f"{name} not restarted by supervisord: {self.supervisor_states()}")
        return old, new

    def add_workspace(self, root: Path) -> str:
        reply = runtime.control_request(self.settings.control_endpoint("watcher"), WorkspaceAddRequest(path=str(root)), timeout_ms=5000)
        return reply.body.workspace

    def question(self, workspace: str, q: str = "where is the retry logic?") -> AskReply:
        kind, value = ask(self.endpoint("front"), AskRequest(question=q, workspace=workspace))
        assert kind == "ok", f"{kind}: {value}"
        return value

    def wait_indexed(self, root: Path, timeout: float = INDEX_TIMEOUT) -> None:
        wait_until(lambda: not table_mismatches(self.settings.data_dir, root), timeout, 0.5,
                   message=lambda: f"table differs from disk: {table_mismatches(self.settings.data_dir, root)[:10]}\n{self.tail()}")

    def tail(self, chars: int = 2500) -> str:
        out = []
        for p in sorted((Path(self.settings.data_dir) / "logs").glob("*.log")):
            out.append(f"==== {p.name}\n{p.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)

    def log_text(self, name: str) -> str:
        p = Path(self.settings.data_dir) / "logs" / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    # -------------------------------------------------------------- ending

    def stop(self, timeout: float = 40.0) -> list[int]:
        """Shut supervisord down; return the pids of our processes still alive afterwards (then killed)."""

        try:
            supervision.supervisor_rpc(self.settings).supervisor.shutdown()
        except Exception:  # noqa: BLE001
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        deadline = time.monotonic() + 15
        left = _pids_with_runtime_dir(self.settings.runtime_dir)
        while left and time.monotonic() < deadline:
            time.sleep(0.3)
            left = _pids_with_runtime_dir(self.settings.runtime_dir)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self._out.close()
        return left


@pytest.fixture(scope="module")
def stack():
    base = short_tmpdir("wf")
    model = fixture_cross_encoder(base / "ce")
    sup = Supervised(base, reranker_dir=str(model), reranker_idle_s="3", reranker_pool_size="1", embed_timeout_ms="1500")
    try:
        sup.wait_all(180)
        yield sup
    finally:
        failed = sup.proc.poll() is not None
        left = sup.stop()
        if failed or left:
            print(sup.tail())
        shutil.rmtree(base, ignore_errors=True)
    assert not left, f"processes left running after supervisord shut down: {left}"


@pytest.fixture
def ws(stack: Supervised, request: pytest.FixtureRequest):
    """A fresh small workspace registered with the stack and fully indexed: ``(root, workspace id)``."""
    root = make_workspace(stack.base / "w" / request.node.name[:20].replace("[", "_").replace("]", ""))
    wid = stack.add_workspace(root)
    stack.wait_indexed(root)
    return root, wid


def assert_all_answered(asker: Asker) -> None:
    assert asker.answered > 0, "no question was answered during the fault"
    assert not asker.errors, f"{len(asker.errors)} questions got no answer: {asker.errors[:5]}"


# ---------------------------------------------------------------------------- the faults


@pytest.mark.timeout(600)
def test_kill9_each_daemon_while_indexing_and_answering(stack: Supervised, ws) -> None:
    """kill -9 of every daemon in turn, mid-indexing and mid-question: supervisord restarts it, nothing is lost."""
    root, wid = ws
    asker = Asker(stack.endpoint("front"), wid, pause_s=0.05)
    asker.start()
    restarts = {}
    try:
        for rnd, name in enumerate(DAEMONS, start=1):
            # a burst of edits, so the index path has work in hand when the kill lands
            for i in range(12):
                (root / ("pkg" if i % 2 else "lib") / f"mod{i}.py").write_text(module_text(i, rev=rnd))
            (root / f"new_{name}.py").write_text(module_text(100 + rnd, rev=rnd))
            if rnd <= 2:
                (root / "lib" / f"mod{2 * (rnd - 1)}.py").unlink(missing_ok=True)
            time.sleep(0.3)
            asker.in_flight.wait(10)
            restarts[name] = stack.kill9(name)
            stack.wait_indexed(root)
    finally:
        asker.finish()
    assert set(restarts) == set(DAEMONS)
    assert_all_answered(asker)
    stack.wait_all()


@pytest.mark.timeout(600)
def test_embedder_outage_while_files_change(stack: Supervised, ws) -> None:
    """The embedder hung (SIGSTOP) then stopped for EMBEDDER_OUTAGE_S while files change: answers degrade to keywords, indexing catches up."""

    root, wid = ws
    rpc = supervision.supervisor_rpc(stack.settings)
    pid = stack.pid("embedder")
    asker = Asker(stack.endpoint("front"), wid, pause_s=0.3)
    asker.start()
    try:
        os.kill(pid, signal.SIGSTOP)  # first half: hung (alive to supervisord, silent on its sockets)
        end_hang = time.monotonic() + EMBEDDER_OUTAGE_S / 2
        k = 0
        while time.monotonic() < end_hang:
            (root / "lib" / f"mod{k % 12}.py").write_text(module_text(k % 12, rev=50 + k))
            k += 1
            time.sleep(1.0)
        os.kill(pid, signal.SIGCONT)
        rpc.supervisor.stopProcess("embedder", True)  # second half: stopped
        end_stop = time.monotonic() + EMBEDDER_OUTAGE_S / 2
        while time.monotonic() < end_stop:
            (root / "pkg" / f"out{k}.py").write_text(module_text(k, rev=k))
            k += 1
            time.sleep(1.0)
        assert not stack.alive("embedder")
        rpc.supervisor.startProcess("embedder", True)
        stack.wait_indexed(root)
        time.sleep(1.0)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
        asker.finish()
        if not stack.alive("embedder"):
            rpc.supervisor.startProcess("embedder", True)
    assert_all_answered(asker)
    assert asker.degraded > 0 and any("keywords only" in d for d in asker.degraded_kinds), asker.degraded_kinds
    wait_until(lambda: "keywords only" not in " ".join(stack.question(wid).degraded), 60, 1.0)
    stack.wait_all()


@pytest.mark.timeout(300)
def test_reranker_model_removed(stack: Supervised, ws) -> None:
    """The cross-encoder file removed: answers fall back to fused order and say so; back to reranked once it returns."""
    root, wid = ws
    model = Path(stack.settings.reranker_dir) / "model.int8.onnx"
    saved = stack.base / "model.saved"
    assert FUSED_ORDER not in stack.question(wid).degraded
    shutil.move(model, saved)
    # the loaded workers keep their copy; once idle (reranker_idle_s) they exit, and the next
    # question spawns one that cannot load the model
    wait_until(lambda: not stack.status("reranker").details.get("workers"), 60, 0.5,
               message=lambda: str(stack.status("reranker").details))
    # scores of questions asked before still come from the broker's pair cache: ask new ones
    fresh = (f"where is the retry logic? (try {n})" for n in itertools.count())
    asker = Asker(stack.endpoint("front"), wid, pause_s=0.5, fresh=True)
    asker.start()
    try:
        wait_until(lambda: FUSED_ORDER in stack.question(wid, next(fresh)).degraded, 60, 1.0)
        reply = stack.question(wid, next(fresh))
        assert "fused order" in reply.context_line
        (root / "lib" / "mod1.py").write_text(module_text(1, rev=77))
        stack.wait_indexed(root)
    finally:
        shutil.move(saved, model)
    wait_until(lambda: FUSED_ORDER not in stack.question(wid, next(fresh)).degraded, 90, 1.0)
    asker.finish()
    assert_all_answered(asker)
    assert FUSED_ORDER in asker.degraded_kinds
    stack.wait_all()


@pytest.mark.timeout(300)
def test_index_directory_read_only(stack: Supervised, ws) -> None:
    """The index folder made read-only: writes fail and are logged, the embedder stays up, questions are answered, indexing resumes after."""
    if os.geteuid() == 0 and not stack.dropped_root:
        pytest.skip("running as root without setpriv: file modes do not bind the daemons")
    from daemons.lib.workspaces import index_dir

    root, wid = ws
    folder = index_dir(stack.settings.data_dir, wid)
    pid = stack.pid("embedder")
    modes = {}
    for p in [folder, *folder.rglob("*")]:
        if p.is_dir():
            modes[p] = p.stat().st_mode
            p.chmod(0o555)
    asker = Asker(stack.endpoint("front"), wid, pause_s=0.3)
    asker.start()
    try:
        (root / "lib" / "mod0.py").write_text(module_text(0, rev=99))
        (root / "ro_new.py").write_text(module_text(55))
        wait_until(lambda: stack.status("embedder").counters.get("writes.failed", 0) > 0, 60, 0.5,
                   message=lambda: stack.log_text("embedder")[-3000:])
        time.sleep(3)
        assert stack.pid("embedder") == pid, "the embedder died on a read-only table"
        assert table_mismatches(stack.settings.data_dir, root), "a write went through a read-only folder?"
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    stack.wait_indexed(root, 90)
    asker.finish()
    assert_all_answered(asker)
    assert stack.pid("embedder") == pid
    assert "write_failed" in stack.log_text("embedder")


@pytest.mark.timeout(300)
def test_table_that_cannot_be_created_is_a_failed_write_and_indexing_resumes(stack: Supervised) -> None:
    """A new workspace's table that cannot be made (indexes folder read-only, as on a full disk) is a failed write: the embedder stays up, status says writes are failing, and the workspace is indexed once writes work again."""
    if os.geteuid() == 0 and not stack.dropped_root:
        pytest.skip("running as root without setpriv: file modes do not bind the daemons")
    from daemons import cli, status_report

    indexes = Path(stack.settings.data_dir) / "indexes"
    indexes.mkdir(parents=True, exist_ok=True)
    pid = stack.pid("embedder")
    before = stack.status("embedder").counters.get("writes.failed", 0)
    mode = indexes.stat().st_mode
    indexes.chmod(0o555)
    try:
        root = make_workspace(stack.base / "w" / "nospace", n=6)
        wid = stack.add_workspace(root)
        wait_until(lambda: stack.status("embedder").counters.get("writes.failed", 0) > before, 60, 0.5,
                   message=lambda: stack.log_text("embedder")[-3000:])
        time.sleep(3)
        assert stack.pid("embedder") == pid, "the embedder died on a table it could not create"
        report = status_report.workspace_report(stack.settings, cli.all_status(stack.settings))[wid]
        assert any(p.startswith("writes failing: permission denied (") for p in report["problems"]), report["problems"]
    finally:
        indexes.chmod(mode)
    stack.wait_indexed(root, 120)
    assert stack.pid("embedder") == pid
    assert "table_create_failed" in stack.log_text("embedder")
    report = status_report.workspace_report(stack.settings, cli.all_status(stack.settings))[wid]
    assert not any(p.startswith("writes failing") for p in report["problems"]), report["problems"]


@pytest.mark.timeout(300)
def test_half_created_table_is_made_again(stack: Supervised) -> None:
    """A table folder left with no committed version (creation cut short) is made again by the embedder at its next start, and the workspace indexed."""
    from daemons.lib.workspaces import index_dir

    root = make_workspace(stack.base / "w" / "halfmade", n=6)
    wid = stack.add_workspace(root)
    stack.wait_indexed(root)
    folder = index_dir(stack.settings.data_dir, wid)
    old = stack.pid("embedder")
    os.kill(old, signal.SIGSTOP)  # hold it while its table is replaced by a half-made one
    try:
        shutil.rmtree(folder / "chunks.lance")
        (folder / "chunks.lance" / "_versions").mkdir(parents=True)
        (folder / "chunks.lance" / "_transactions").mkdir()
    finally:
        os.kill(old, signal.SIGKILL)
    wait_until(lambda: stack.alive("embedder") and stack.pid("embedder") != old, 90, 0.3)
    stack.wait_indexed(root, 120)
    kind, value = ask(stack.endpoint("front"), AskRequest(question="where is the retry logic?", workspace=wid))
    assert kind == "ok", value


@pytest.mark.timeout(300)
def test_workspace_deleted_while_indexing(stack: Supervised) -> None:
    """A workspace deleted in the middle of its first indexing: its rows go, every daemon stays up, questions are answered."""
    root = make_workspace(stack.base / "w" / "gone", n=150)
    pids = {d: stack.pid(d) for d in DAEMONS if d != "reranker"}
    wid = stack.add_workspace(root)

    def some_rows() -> bool:
        store = open_table(stack.settings.data_dir, root)
        return store is not None and store.table.count_rows() > 0

    wait_until(some_rows, 120, 0.2)
    asker = Asker(stack.endpoint("front"), wid, pause_s=0.2)
    asker.start()
    try:
        shutil.rmtree(root)

        def no_rows() -> bool:
            store = open_table(stack.settings.data_dir, root)
            return store is None or store.table.count_rows() == 0

        wait_until(no_rows, 120, 0.5, message=lambda: stack.tail())
        time.sleep(3)  # a few reconciles of a folder that is not there
    finally:
        asker.finish()
    assert_all_answered(asker)
    assert {d: stack.pid(d) for d in pids} == pids, "a daemon restarted after the workspace vanished"
    assert not table_mismatches(stack.settings.data_dir, root)


@pytest.mark.timeout(600)
def test_branch_switch_many_files_at_once(stack: Supervised, ws) -> None:
    """BRANCH_FILES files written (and some deleted) at once, as by a branch switch: the table catches up exactly."""
    root, wid = ws
    asker = Asker(stack.endpoint("front"), wid, pause_s=0.5)
    asker.start()
    started = time.monotonic()
    try:
        (root / "lib" / "mod0.py").unlink()
        (root / "pkg" / "mod1.py").unlink()
        for i in range(BRANCH_FILES):
            d = root / "branch" / f"d{i % 20}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i}.py").write_text(f"def branch_fn_{i}(x):\n    return x + {i}\n")
        for i in range(2, 12):
            (root / ("pkg" if i % 2 else "lib") / f"mod{i}.py").write_text(module_text(i, rev=3))
        stack.wait_indexed(root, 540)
    finally:
        asker.finish()
    print(f"branch switch of {BRANCH_FILES} files indexed in {time.monotonic() - started:.1f} s")
    assert_all_answered(asker)
    stack.wait_all()


@pytest.mark.timeout(300)
def test_hostile_files_on_disk(stack: Supervised, ws) -> None:
    """A BIG_FILE_MB MB generated file, invalid UTF-8, NUL bytes, symlink loops and a file that fails to parse: skipped or indexed, nothing dies."""
    root, wid = ws
    pids = {d: stack.pid(d) for d in DAEMONS if d != "reranker"}
    asker = Asker(stack.endpoint("front"), wid, pause_s=0.3)
    asker.start()
    try:
        with open(root / "generated.py", "w") as fh:
            line = "GENERATED_CONSTANT_%07d = %d  # generated\n"
            n = BIG_FILE_MB * 1024 * 1024 // len(line % (0, 0))
            for i in range(0, n, 10000):
                fh.write("".join(line % (j, j) for j in range(i, min(n, i + 10000))))
        (root / "latin1.py").write_bytes(b"# caf\xe9 \xff\xfe\n" + b"def f():\n    return '\xe9t\xe9'\n" * 20)
        (root / "nul.py").write_bytes(b"def g():\n    return 1\n\x00\x00\x00 binary tail\n")
        (root / "lib" / "mod2.py").write_bytes(module_text(2).encode() + b"\xff\xfe invalid now\n")  # indexed before, not now
        (root / "loop_a").symlink_to("loop_b")
        (root / "loop_b").symlink_to("loop_a")
        (root / "self_loop").symlink_to("self_loop")
        (root / "pkg" / "up").symlink_to("..")  # a directory loop
        (root / "outside.py").symlink_to("/etc/passwd")
        (root / "broken.py").write_text("def broken(:\n    return ]]] (\nclass \n" + module_text(3, rev=9))
        (root / "broken.ts").write_text("export function parse(path: string { return {{{ ;\n" * 30)
        (root / "broken.json").write_text('{"a": [1, 2, \n' * 50)
        stack.wait_indexed(root)
        time.sleep(2 * float(stack.settings.reconcile_interval_s) + 1)  # periodic reconciles over the loops and the big file
        stack.wait_indexed(root, 30)
    finally:
        asker.finish()
    assert_all_answered(asker)
    assert {d: stack.pid(d) for d in pids} == pids, "a daemon restarted on a hostile file"
    store = open_table(stack.settings.data_dir, root)
    paths = set(store.table.search().select(["path"]).limit(None).to_arrow().column("path").to_pylist())
    assert {"generated.py", "latin1.py", "nul.py", "lib/mod2.py", "outside.py", "loop_a", "self_loop"}.isdisjoint(paths)
    assert {"broken.py", "broken.ts", "broken.json"} <= paths
    assert "file_skipped" in stack.log_text("watcher")


@pytest.mark.timeout(180)
def test_short_load(stack: Supervised, ws) -> None:
    """A short load run (bench/load.py's loop: LOAD_CLIENTS clients for LOAD_S while files are edited): zero errors."""
    sys.path.insert(0, str(REPO))
    from bench.load import run_load

    root, wid = ws
    clients = int(os.environ.get("WSCTX_FAULT_LOAD_CLIENTS", "5"))
    seconds = float(os.environ.get("WSCTX_FAULT_LOAD_S", "10"))
    result = run_load(stack.endpoint("front"), wid, root, clients=clients, seconds=seconds, edit_files=10)
    print(json.dumps(result, indent=1))
    assert result["errors"] == 0, result["error_samples"]
    assert result["answered"] > 0
    stack.wait_indexed(root)


@pytest.mark.timeout(300)
def test_a_file_name_that_is_not_utf8_is_skipped_and_other_workspaces_go_on(stack: Supervised, ws) -> None:
    """A file named with a non-UTF-8 byte is skipped with its reason; the watcher keeps its pid and another workspace's new file is indexed."""
    root, wid = ws
    pid = stack.pid("watcher")
    with open(os.fsencode(root) + b"/bad\xff.py", "wb") as fh:
        fh.write(module_text(5).encode())
    (root / "after_bad.py").write_text(module_text(6))
    other = make_workspace(stack.base / "w" / "utf8_other", n=2)
    stack.add_workspace(other)
    (other / "fresh.py").write_text(module_text(7))
    stack.wait_indexed(other)
    wait_until(lambda: "after_bad.py" in table_paths(stack, root), 60, 0.5, message=stack.tail)
    assert stack.pid("watcher") == pid, "the watcher restarted on a file name"
    assert "fresh.py" in table_paths(stack, other)
    assert not [p for p in table_paths(stack, root) if p.startswith("bad")]
    log = stack.log_text("watcher")
    assert "file_skipped" in log and "not valid UTF-8" in log
    os.unlink(os.fsencode(root) + b"/bad\xff.py")


def table_paths(stack: Supervised, root: Path) -> set[str]:
    store = open_table(stack.settings.data_dir, root)
    if store is None:
        return set()
    return set(store.table.search().select(["path"]).limit(None).to_arrow().column("path").to_pylist())


@pytest.mark.timeout(300)
def test_a_backslash_in_a_file_name_is_indexed_and_nothing_stays_pending(stack: Supervised, ws) -> None:
    """``names/back\\slash.py`` is an ordinary POSIX name: it is indexed, and the workspace reaches zero pending."""
    root, wid = ws
    (root / "names").mkdir()
    (root / "names" / "back\\slash.py").write_text(module_text(4))
    (root / "names" / "..\\up.py").write_text(module_text(5))
    stack.wait_indexed(root)
    assert {"names/back\\slash.py", "names/..\\up.py"} <= table_paths(stack, root)
    wait_until(lambda: stack.status("watcher").details["workspaces"][wid]["pending"] == 0, 60, 0.5,
               message=lambda: str(stack.status("watcher").details))
