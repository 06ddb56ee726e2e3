"""Helpers for tests that run the real daemons as subprocesses.

- ``short_tmpdir()``: a temp folder under /tmp with a short name (ipc paths must stay < ~100 bytes).
- ``daemon_env(base)``: an environment for the daemons rooted at ``base`` (runtime, data, no user config).
- ``Daemons(names, env, workdir)``: start / kill / restart ``python -m daemons.<name>`` processes,
  wait on readiness through their control sockets, read their logs, stop them all at teardown.
- ``wait_until(predicate, timeout)``: poll a predicate (never sleep a fixed time in a test).
- ``table_matches_disk(data_dir, root)``: compare the workspace's table with what is on disk.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from daemons.lib import runtime
from daemons.lib.config import load_settings
from daemons.lib.filtering import WorkspaceFilter, classify_file
from daemons.lib.store import IndexStore
from daemons.lib.workspaces import Registry, index_dir, workspace_id
from protocol.schema import Body, ShutdownRequest, StatusRequest

REPO = Path(__file__).resolve().parent.parent


def short_tmpdir(prefix: str = "ws") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def daemon_env(base: Path, **settings: Any) -> dict[str, str]:
    """Environment for daemons living under ``base``; ``settings`` become ``WSCTX_<NAME>`` variables."""
    env = dict(os.environ)
    for key in [k for k in env if k.startswith("WSCTX_")]:
        del env[key]
    env.update(
        WSCTX_RUNTIME_DIR=str(base / "run"),
        WSCTX_DATA_DIR=str(base / "data"),
        WSCTX_CONFIG="/nonexistent",
        WSCTX_RECONCILE_INTERVAL_S="2",
        WSCTX_DEBOUNCE_MS="100",
        WSCTX_EMBED_THREADS="1",
        # No question deadline unless a test sets one: a cold worker on a loaded CI machine may take
        # longer than the product's 2 s, and most tests check the reranked answer, not the budget.
        WSCTX_QUESTION_DEADLINE_MS="0",
        PYTHONUNBUFFERED="1",
    )
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for key, value in settings.items():
        env[f"WSCTX_{key.upper()}"] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
    return env


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, message: str | Callable[[], str] = "") -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned); exceptions count as False.

    Raises AssertionError after ``timeout`` seconds, with ``message`` (or a callable giving it)
    and the last exception if there was one.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last_exc = None
        except Exception as exc:  # noqa: BLE001 - a table mid-write, a daemon mid-start
            last_exc = exc
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:.0f} s: {text or predicate}" + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


class Daemons:
    """Real daemon subprocesses sharing one environment (so one runtime dir and one data dir).

    ``Daemons(["watcher", "chunker", "embedder"], env, workdir)``; ``start()`` starts all named
    ones (or ``start("embedder", WSCTX_CHUNK_MAX_CHARS="500")`` one, with extra env), each
    logging to ``<workdir>/logs/<name>.<n>.log``; ``stop_all()`` ends them all (and asserts
    none is left running).
    """

    def __init__(self, names: Iterable[str], env: dict[str, str], workdir: str | Path | None = None) -> None:
        self.names = list(names)
        self.env = dict(env)
        self.workdir = Path(workdir or env.get("WSCTX_RUNTIME_DIR", short_tmpdir())).resolve()
        self.logdir = self.workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, list[Path]] = {}
        self._files: dict[str, Any] = {}
        self.settings = load_settings(env=self.env)

    # ------------------------------------------------------------------ endpoints

    @property
    def runtime_dir(self) -> str:
        return self.settings.runtime_dir

    @property
    def data_dir(self) -> str:
        return self.settings.data_dir

    def endpoint(self, socket_name: str) -> str:
        return self.settings.endpoint(socket_name)

    def control_endpoint(self, name: str) -> str:
        return self.settings.control_endpoint(name)

    # ------------------------------------------------------------------ lifecycle

    def start(self, *names: str, wait: bool = True, timeout: float = 60.0, **extra_env: str) -> None:
        """Start ``names`` (default: all), optionally with extra env vars, and wait until each answers a ping."""
        names = names or tuple(self.names)
        for name in names:
            if name not in self.names:
                self.names.append(name)
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                raise RuntimeError(f"{name} is already running (pid {proc.pid})")
            env = dict(self.env)
            env.update({k: str(v) for k, v in extra_env.items()})
            n = len(self.logs.setdefault(name, []))
            log_path = self.logdir / f"{name}.{n}.log"
            self.logs[name].append(log_path)
            fh = open(log_path, "wb")
            self._files[name] = fh
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", f"daemons.{name}"], env=env, cwd=str(REPO), stdout=fh, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if wait:
            for name in names:
                self.wait_ready(name, timeout)

    def wait_ready(self, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode} before it was ready:\n{self.log(name)[-4000:]}")
            try:
                runtime.wait_ready(self.control_endpoint(name), timeout_s=1.0)
                return
            except Exception:  # noqa: BLE001 - Timeout: not bound yet
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name} not ready after {timeout:.0f} s:\n{self.log(name)[-4000:]}") from None

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def running(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 20.0) -> int:
        """Send ``sig`` (SIGKILL by default, or SIGTERM) and wait for the exit; return the exit code."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait(5)
            raise AssertionError(f"{name} ignored {signal.Signals(sig).name} for {timeout:.0f} s:\n{self.log(name)[-4000:]}")
        fh = self._files.pop(name, None)
        if fh:
            fh.close()
        return rc

    def terminate(self, name: str, timeout: float = 20.0) -> int:
        return self.kill(name, signal.SIGTERM, timeout)

    def restart(self, name: str, sig: int = signal.SIGKILL, wait: bool = True, **extra_env: str) -> None:
        self.kill(name, sig)
        self.start(name, wait=wait, **extra_env)

    def stop_all(self, timeout: float = 20.0) -> None:
        """SIGTERM every daemon, SIGKILL any that is still there after ``timeout``; assert none is left."""
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        stuck = []
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                stuck.append(name)
                proc.kill()
                proc.wait(5)
        for fh in self._files.values():
            fh.close()
        self._files.clear()
        left = [n for n, p in self.procs.items() if p.poll() is None]
        assert not left, f"daemons still running after stop: {left}"
        assert not stuck, f"daemons ignored SIGTERM for {timeout:.0f} s: {stuck}"

    # ------------------------------------------------------------------ talking

    def request(self, name: str, body: Body, timeout_ms: int = 5000):
        """One control request to ``name``'s control socket; returns the reply Message."""
        return runtime.control_request(self.control_endpoint(name), body, timeout_ms=timeout_ms)

    def status(self, name: str, timeout_ms: int = 5000):
        """The daemon's StatusReply body."""
        return self.request(name, StatusRequest(), timeout_ms).body

    def counter(self, name: str, key: str) -> int:
        return int(self.status(name).counters.get(key, 0))

    def shutdown(self, name: str, timeout: float = 20.0) -> int:
        self.request(name, ShutdownRequest())
        return self.procs[name].wait(timeout)

    # ------------------------------------------------------------------ logs

    def log(self, name: str | None = None) -> str:
        """All log text of ``name`` (every run, oldest first), or of every daemon when None."""
        names = [name] if name else list(self.logs)
        out = []
        for n in names:
            for p in self.logs.get(n, []):
                try:
                    out.append(p.read_text(errors="replace"))
                except OSError:
                    pass
        return "".join(out)

    def log_events(self, name: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        """The parsed JSON log lines (optionally only those whose ``event`` is ``event``)."""
        events = []
        for line in self.log(name).splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and (event is None or rec.get("event") == event):
                events.append(rec)
        return events

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"==== {n}\n{self.log(n)[-chars:]}" for n in self.logs)


# ---------------------------------------------------------------------------- workspace and table


def register(data_dir: str | Path, root: str | Path) -> str:
    """Register ``root`` as a workspace and return its id."""
    wid, _ = Registry(data_dir).add(root)
    return wid


def open_table(data_dir: str | Path, root: str | Path) -> IndexStore | None:
    return IndexStore.open_reader(index_dir(data_dir, workspace_id(root)))


def disk_hashes(root: str | Path, max_file_bytes: int = 1_000_000, include_globs=None, exclude_globs=None) -> dict[str, str]:
    """``{path: content hash}`` of every file the product should index under ``root``."""
    root = Path(root).resolve()
    filt = WorkspaceFilter(root, include_globs, exclude_globs, max_file_bytes)
    out = {}
    for rel in filt.iter_files():
        verdict = classify_file(root / rel, max_file_bytes, filt.data_policy_applies(rel))
        if verdict.ok:
            out[rel] = verdict.content_hash
    return out


def table_mismatches(data_dir: str | Path, root: str | Path, max_file_bytes: int = 1_000_000, include_globs=None, exclude_globs=None) -> list[str]:
    """Human descriptions of every difference between the table and the disk (empty when they match)."""
    want = disk_hashes(root, max_file_bytes, include_globs, exclude_globs)
    store = open_table(data_dir, root)
    if store is None:
        return [f"no table (disk has {len(want)} files)"] if want else []
    tbl = store.table.search().select(["path", "content_hash", "chunk_index", "window"]).limit(None).to_arrow().to_pylist()
    have: dict[str, set[str]] = {}
    keys: dict[str, list[tuple[int, int]]] = {}
    for row in tbl:
        have.setdefault(row["path"], set()).add(row["content_hash"])
        keys.setdefault(row["path"], []).append((row["chunk_index"], row["window"]))
    problems = []
    for path, h in sorted(want.items()):
        got = have.get(path)
        if not got:
            problems.append(f"{path}: no rows")
        elif got != {h}:
            problems.append(f"{path}: rows of hashes {sorted(got)}, disk has {h}")
        elif len(keys[path]) != len(set(keys[path])):
            problems.append(f"{path}: duplicate rows")
    for path in sorted(set(have) - set(want)):
        problems.append(f"{path}: rows but not an indexable file on disk")
    return problems


def table_matches_disk(data_dir: str | Path, root: str | Path, max_file_bytes: int = 1_000_000, include_globs=None, exclude_globs=None) -> bool:
    """True when every indexable file has rows of exactly its content hash and no other path has rows."""
    return not table_mismatches(data_dir, root, max_file_bytes, include_globs, exclude_globs)


def standin_cross_encoder(folder: Path) -> Path:
    """A tiny ONNX 'cross-encoder' (mean of per-token weights) with a real tokenizer, for when the real one is not built."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((REPO / "models" / "artifacts" / "minilm-l6-v2" / "tokenizer.json").read_text())["model"]["vocab"]
    weights = np.random.default_rng(7).normal(0, 2, size=(len(vocab), 1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["W", "input_ids"], ["emb"], axis=0),  # B,T,1
            helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "ax2"], ["mask3"]),
            helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "ax1"], ["total"], keepdims=0),  # B,1
            helper.make_node("ReduceSum", ["mask3", "ax1"], ["count"], keepdims=0),
            helper.make_node("Div", ["total", "count"], ["logits"]),
        ],
        "fixture_ce",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 1])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(np.array([2], np.int64), "ax2"),
         numpy_helper.from_array(np.array([1], np.int64), "ax1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.int8.onnx"))
    shutil.copy(REPO / "models" / "artifacts" / "minilm-l6-v2" / "tokenizer.json", folder / "tokenizer.json")
    sums = {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in ("model.int8.onnx", "tokenizer.json")}
    (folder / "manifest.json").write_text(json.dumps({"name": "fixture-ce", "version": "0", "sha256": sums}))
    return folder


def index_row(path: str, i: int, keywords: str, vec: Any, h: str = "h") -> dict:
    """One window-0 table row of chunk ``i`` of ``path``: its text and keywords are ``keywords``."""
    import numpy as np

    return {
        "id": f"{path}|{h}|{i}|0", "chunk_id": f"{path}|{h}|{i}", "path": path, "content_hash": h, "chunk_index": i,
        "window": 0, "start_line": 10 * i + 1, "end_line": 10 * i + 9, "language": "python", "text": keywords,
        "keywords": keywords, "vector": np.asarray(vec, dtype=np.float32) / np.linalg.norm(vec),
    }
