"""The reranker pool as real processes: broker + worker processes over ipc, faults by environment."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from daemons.supervision import processes_for
from daemons.lib import runtime
from daemons.lib.config import load_settings
from protocol.errors import Unavailable
from tests.support import standin_cross_encoder
from protocol.schema import RerankReply, RerankRequest, StatusRequest

REPO = Path(__file__).resolve().parents[1]
REAL_MODEL = REPO / "models" / "artifacts" / "cross-encoder"


def _build_fixture_model(folder: Path) -> Path:
    """A tiny ONNX stand-in cross-encoder with a real tokenizer, for when the real one is not built."""
    return standin_cross_encoder(folder)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    if (REAL_MODEL / "manifest.json").is_file():
        return REAL_MODEL
    return _build_fixture_model(tmp_path_factory.mktemp("ce"))


def _passages(n: int = 12, size: int = 1000) -> list[str]:
    out = []
    for i in range(n):
        body = (
            f"def handle_request_{i}(sock, frames):\n"
            f"    # decode the envelope and dispatch message number {i}\n"
            "    msg = envelope.decode(frames)\n    handler = handlers.get(msg.msg_type)\n"
            "    return handler(msg) if handler else error_reply(BadMessage('unknown type'))\n"
        )
        text = f"daemons/lib/mod{i}.py\n" + (body * (size // len(body) + 1))
        out.append(text[: size - 50 * (i % 3)])
    return out


QUERY = "how does the daemon decode and dispatch a request?"


def _pids_with_runtime_dir(rt: str) -> list[int]:
    """Processes (any parent) whose environment names this test's runtime dir."""
    return processes_for(rt)


class Pool:
    """One broker process and its settings; ``stop`` always leaves no process behind."""

    def __init__(self, model: Path | str, **env: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="wsr", dir="/tmp")
        self.env = dict(os.environ)
        self.env.update(
            WSCTX_RUNTIME_DIR=f"{self.dir}/run", WSCTX_DATA_DIR=f"{self.dir}/data", WSCTX_CONFIG="/nonexistent",
            WSCTX_RERANKER_DIR=str(model), PYTHONPATH=str(REPO),
        )
        for k in [k for k in self.env if k.startswith("WSCTX_FAULT_")]:
            del self.env[k]
        self.env.update(env)
        self.settings = load_settings(env=self.env)
        self.log = open(f"{self.dir}/reranker.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "daemons.reranker"], cwd=REPO, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        runtime.wait_ready(self.settings.control_endpoint("reranker"), timeout_s=20)
        self.client = runtime.Client(self.settings.endpoint("reranker"), sender="test")

    def rerank(self, passages: list[str], query: str = QUERY, timeout_ms: int = 30000) -> RerankReply:
        return self.client.request(RerankRequest(query=query, passages=passages), timeout_ms=timeout_ms).body

    def status(self) -> dict:
        return runtime.control_request(self.settings.control_endpoint("reranker"), StatusRequest()).body.details

    def wait_status(self, pred, timeout_s: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            if pred(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"status never matched: {st}")
            time.sleep(0.1)

    def terminate(self, timeout_s: float = 15.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in _pids_with_runtime_dir(self.env["WSCTX_RUNTIME_DIR"]):
            os.kill(pid, signal.SIGKILL)
        self.log.close()

    def log_text(self) -> str:
        return Path(f"{self.dir}/reranker.log").read_text(errors="replace")


@pytest.fixture
def make_pool(model_dir):
    pools: list[Pool] = []

    def make(model: Path | str | None = None, **env: str) -> Pool:
        pools.append(Pool(model or model_dir, **env))
        return pools[-1]

    yield make
    for p in pools:
        p.stop()
        shutil.rmtree(p.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(120)
def test_scores_in_order_match_in_process_and_pool_size_respected(make_pool, model_dir):
    """Twelve passages come back scored in order, equal to in-process scoring, split over the two workers a pool size of 2 allows."""
    from models.cross_encoder import load_cross_encoder

    pool = make_pool(WSCTX_RERANKER_POOL_SIZE="2", WSCTX_RERANK_CACHE_PAIRS="0")  # the warm call is scored again
    passages = _passages()
    t0 = time.perf_counter()
    cold = pool.rerank(passages)
    cold_ms = (time.perf_counter() - t0) * 1000
    st = pool.wait_status(lambda s: s["live_workers"] == 2)
    assert st["pool_size"] == 2 and len(set(st["worker_pids"])) == 2
    assert all(_alive(pid) for pid in st["worker_pids"])
    t0 = time.perf_counter()
    warm = pool.rerank(passages)
    warm_ms = (time.perf_counter() - t0) * 1000
    expected = load_cross_encoder(model_dir, threads=1).score(QUERY, passages)
    for reply in (cold, warm):
        assert len(reply.scores) == 12
        assert reply.scores == pytest.approx(expected, abs=1e-4)
    assert warm.workers == 2
    assert pool.status()["live_workers"] == 2  # never more than the pool size
    print(f"\nlatency 12x~1000 chars ({model_dir.name}): cold {cold_ms:.0f} ms, warm {warm_ms:.0f} ms, warm timings {warm.timings_ms}")


@pytest.mark.timeout(60)
def test_broken_model_gives_unavailable_quickly(make_pool, tmp_path):
    """A model folder without a usable model gets `unavailable` with the reason, well before the deadline, and again without a respawn."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    pool = make_pool(broken, WSCTX_RERANKER_TIMEOUT_MS="20000")
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="manifest"):
        pool.rerank(_passages(3))
    assert time.monotonic() - t0 < 10
    st = pool.status()
    assert "manifest" in st["last_model_error"] and st["live_workers"] == 0
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="manifest"):
        pool.rerank(_passages(3))
    assert time.monotonic() - t0 < 1.0  # remembered: answered without starting a worker
    counters = runtime.control_request(pool.settings.control_endpoint("reranker"), StatusRequest()).body.counters
    assert counters["workers.spawned"] == 1 and counters["requests.rerank_request.unavailable"] == 2


@pytest.mark.timeout(120)
def test_worker_killed_mid_request_still_answers(make_pool, model_dir):
    """When the first worker dies on its first part, the part is re-dispatched and the full answer still comes back."""
    from models.cross_encoder import load_cross_encoder

    pool = make_pool(WSCTX_FAULT_WORKER_DIE_AFTER="0", WSCTX_RERANKER_POOL_SIZE="1")
    passages = _passages()
    reply = pool.rerank(passages)
    assert reply.scores == pytest.approx(load_cross_encoder(model_dir, threads=1).score(QUERY, passages), abs=1e-4)
    st = pool.status()
    assert st["live_workers"] == 1 and st["workers"][0]["id"] != "w1"
    assert "worker_dropped" in pool.log_text()


@pytest.mark.timeout(120)
def test_hung_worker_dropped_after_missed_heartbeats(make_pool):
    """A worker that freezes mid-request is dropped after three missed heartbeats, killed, and its part answered by another."""
    pool = make_pool(WSCTX_FAULT_WORKER_HANG_AFTER="0", WSCTX_RERANKER_POOL_SIZE="1", WSCTX_HEARTBEAT_S="0.3")
    reply = pool.rerank(_passages(4))
    assert len(reply.scores) == 4
    st = pool.status()
    assert [w["id"] for w in st["workers"]] != ["w1"]
    assert "no_heartbeat" in pool.log_text()


@pytest.mark.timeout(120)
def test_idle_pool_shrinks_to_zero_and_restarts(make_pool):
    """With reranker_idle_s=2 the workers exit, status shows none and their pids are gone, and the next request starts workers again."""
    pool = make_pool(WSCTX_RERANKER_IDLE_S="2", WSCTX_RERANKER_POOL_SIZE="1", WSCTX_RERANK_CACHE_PAIRS="0")
    assert len(pool.rerank(_passages(4)).scores) == 4
    pids = pool.status()["worker_pids"]
    assert pids
    pool.wait_status(lambda s: s["live_workers"] == 0 and not s["children"] and not s["workers"], timeout_s=15)
    assert not any(_alive(pid) for pid in pids)
    reply = pool.rerank(_passages(4))
    assert len(reply.scores) == 4
    assert pool.status()["worker_pids"] and set(pool.status()["worker_pids"]).isdisjoint(pids)


@pytest.mark.timeout(60)
def test_timeout_when_work_exceeds_deadline(make_pool):
    """Work slower than reranker_timeout_ms is answered `timeout` at the deadline."""
    from protocol.errors import Timeout

    pool = make_pool(WSCTX_FAULT_WORKER_SCORE_DELAY_MS="5000", WSCTX_RERANKER_TIMEOUT_MS="1500", WSCTX_RERANKER_POOL_SIZE="1")
    with pytest.raises(Timeout, match="not finished within 1500 ms"):
        pool.rerank(_passages(2), timeout_ms=10000)


@pytest.mark.timeout(90)
def test_sigterm_leaves_no_worker_processes(make_pool):
    """After the broker gets SIGTERM it exits 0 and no worker process of its pool is left."""
    pool = make_pool(WSCTX_RERANKER_POOL_SIZE="2")
    pool.rerank(_passages(6))
    st = pool.wait_status(lambda s: s["live_workers"] == 2)
    assert pool.terminate() == 0
    assert not any(_alive(pid) for pid in st["worker_pids"])
    assert _pids_with_runtime_dir(pool.env["WSCTX_RUNTIME_DIR"]) == []


@pytest.mark.timeout(180)
def test_a_forged_worker_frame_is_dropped_and_the_broker_stays_up(make_pool):
    """A peer that takes the next worker id and sends READY with broken JSON is logged as a bad frame; the broker keeps its pid and answers."""
    import threading

    import zmq

    from daemons.reranker import frames as F

    pool = make_pool(WSCTX_RERANKER_POOL_SIZE="1", WSCTX_RERANKER_IDLE_S="1", WSCTX_HEARTBEAT_S="0.3", WSCTX_RERANK_CACHE_PAIRS="0")
    ctx = zmq.Context.instance()
    forger = ctx.socket(zmq.DEALER)
    forger.setsockopt(zmq.ROUTING_ID, b"w2")  # the id the broker gives its second worker
    forger.setsockopt(zmq.LINGER, 0)
    forger.connect(pool.settings.endpoint("reranker.workers"))
    try:
        forger.send_multipart([F.MAGIC, F.HB])  # the broker does not know w2 yet: it answers STOP
        assert forger.poll(10000) and forger.recv_multipart()[1] == F.STOP
        assert len(pool.rerank(_passages(2)).scores) == 2  # worker w1
        pool.wait_status(lambda st: not st["workers"])  # w1 idles out
        answered: list[object] = []
        second = threading.Thread(target=lambda: answered.append(_try_rerank(pool)), daemon=True)
        second.start()  # the broker spawns w2, whose real connection finds the id taken
        pool.wait_status(lambda st: any(w["id"] == "w2" for w in st["workers"]))
        for frame in ([F.MAGIC, F.READY, b"{not json"], [F.MAGIC, F.READY, b"[1, 2]"],
                      [F.MAGIC, F.READY, b'{"pid": "x"}'], [F.MAGIC, F.RESULT, b"job", b"\xff"]):
            forger.send_multipart(frame)
        deadline = time.monotonic() + 20
        while pool.log_text().count("bad_worker_frame") < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.log_text().count("bad_worker_frame") >= 4
        assert pool.proc.poll() is None, pool.log_text()[-2000:]
        assert pool.status()["workers"] is not None
    finally:
        forger.close()
    second.join(timeout=120)
    assert pool.proc.poll() is None


def test_only_finite_json_numbers_are_scores() -> None:
    """finite_scores refuses NaN and infinite numbers, numeric strings such as "nan", booleans and a non-list."""
    from daemons.reranker.pool import finite_scores

    assert finite_scores([0.25, 1, 0]) == [0.25, 1.0, 0.0]
    for bad in (["nan"], [float("nan")], [1e999], ["inf"], [True], "0.5", [None], [[0.1]]):
        with pytest.raises(ValueError):
            finite_scores(bad)


@pytest.mark.timeout(180)
def test_a_forged_result_of_scores_that_are_not_finite_is_never_answered_or_cached(make_pool):
    """A peer holding a worker's id that answers its part with "nan" scores is logged as a bad frame; the part goes to a real worker, and every score answered or cached is finite."""
    import math
    import threading

    import zmq

    from daemons.reranker import frames as F

    pool = make_pool(WSCTX_RERANKER_POOL_SIZE="1", WSCTX_RERANKER_IDLE_S="30", WSCTX_HEARTBEAT_S="0.3")
    ctx = zmq.Context.instance()
    forger = ctx.socket(zmq.DEALER)
    forger.setsockopt(zmq.ROUTING_ID, b"w1")  # the id the broker gives its first worker, taken first
    forger.setsockopt(zmq.LINGER, 0)
    forger.connect(pool.settings.endpoint("reranker.workers"))
    passages = _passages(2)
    client = runtime.Client(pool.settings.endpoint("reranker"), sender="test")
    try:
        forger.send_multipart([F.MAGIC, F.HB])  # the broker does not know w1 yet: it answers STOP
        assert forger.poll(10000) and forger.recv_multipart()[1] == F.STOP
        outcome: list[object] = []
        asker = threading.Thread(target=lambda: outcome.append(_outcome(client, RerankRequest(query=QUERY, passages=passages))), daemon=True)
        asker.start()
        pool.wait_status(lambda st: any(w["id"] == "w1" for w in st["workers"]))
        forger.send_multipart([F.MAGIC, F.READY, F.pack({"pid": os.getpid(), "model_id": "forged", "load_ms": 1})])
        while True:  # the part comes to the forger, which holds the id
            assert forger.poll(20000), pool.log_text()[-2000:]
            frames = forger.recv_multipart()
            if frames[1] == F.PART:
                break
        forger.send_multipart([F.MAGIC, F.RESULT, frames[2], b'{"scores": ["nan", "nan"], "ms": 1}'])
        asker.join(90)
    finally:
        forger.close()
        client.close()
    assert "is not a finite number" in pool.log_text()
    got = outcome[0]
    assert isinstance(got, RerankReply) and all(math.isfinite(x) for x in got.scores), got
    again = pool.rerank(passages)
    assert again.cached == 2 and again.scores == got.scores


def _outcome(client: runtime.Client, req: RerankRequest) -> object:
    try:
        return client.request(req, timeout_ms=30000).body
    except Exception as exc:  # noqa: BLE001 - the outcome is only recorded
        return exc


def _try_rerank(pool: Pool) -> object:
    try:
        return pool.rerank(_passages(2), timeout_ms=90000)
    except Exception as exc:  # noqa: BLE001 - the outcome is only recorded
        return exc


@pytest.mark.timeout(120)
def test_a_repeated_question_is_answered_from_the_pair_cache(make_pool, model_dir):
    """Asked again, every pair comes from the cache with no worker; an edited passage alone is scored again, equal to in-process scoring."""
    from models.cross_encoder import load_cross_encoder

    pool = make_pool(WSCTX_RERANKER_POOL_SIZE="1")
    passages = _passages(6)
    first = pool.rerank(passages)
    assert first.cached == 0 and first.workers == 1
    again = pool.rerank(passages)
    assert again.cached == 6 and again.workers == 0 and again.scores == first.scores
    edited = list(passages)
    edited[2] = edited[2].replace("dispatch", "route")
    third = pool.rerank(edited)
    assert third.cached == 5 and third.workers == 1
    expected = load_cross_encoder(model_dir, threads=1).score(QUERY, edited)
    assert third.scores == pytest.approx(expected, abs=1e-4)
    other = pool.rerank(passages, query="where are worker heartbeats sent?")
    assert other.cached == 0  # the question is part of the key
    cache = pool.status()["cache"]
    assert cache["pairs"] == 6 + 1 + 6 and cache["hits"] == 6 + 5


@pytest.mark.timeout(120)
def test_a_deadline_the_queue_cannot_meet_is_refused_at_once(make_pool):
    """With the only worker busy for a second, a request whose deadline is 300 ms gets `timeout` (busy) at once, and one with room is scored."""
    import threading

    from protocol.errors import Timeout

    pool = make_pool(WSCTX_FAULT_WORKER_SCORE_DELAY_MS="1000", WSCTX_RERANKER_POOL_SIZE="1")
    pool.rerank(_passages(2), query="warm the pool and measure its rate")
    assert pool.status()["ms_per_kchar"] > 0
    busy = runtime.Client(pool.settings.endpoint("reranker"), sender="test-busy")
    background = threading.Thread(target=lambda: busy.request(RerankRequest(query="keeps the worker busy", passages=_passages(2)), timeout_ms=30000))
    background.start()
    pool.wait_status(lambda st: any(w["busy"] for w in st["workers"]), timeout_s=10)
    t0 = time.monotonic()
    with pytest.raises(Timeout, match="busy"):
        pool.client.request(RerankRequest(query=QUERY, passages=_passages(2), deadline_ms=300), timeout_ms=5000)
    assert time.monotonic() - t0 < 0.25  # answered at once, not at the deadline
    reply = pool.client.request(RerankRequest(query=QUERY, passages=_passages(2), deadline_ms=20000), timeout_ms=30000).body
    assert len(reply.scores) == 2
    background.join(30)
    busy.close()
    counters = runtime.control_request(pool.settings.control_endpoint("reranker"), StatusRequest()).body.counters
    assert counters["requests.refused_busy"] == 1


def test_a_long_request_is_cut_into_parts_of_bounded_size() -> None:
    """part_count gives one part per idle worker, and more when a part would hold over PART_MAX_PASSAGES."""
    from daemons.reranker.jobs import PART_MAX_PASSAGES, part_count

    assert part_count(12, 2) == 2 and part_count(16, 1) == 1 and part_count(3, 8) == 3
    assert part_count(PART_MAX_PASSAGES * 8, 1) == 8 and part_count(PART_MAX_PASSAGES * 8 + 1, 2) == 9


@pytest.mark.timeout(180)
def test_a_short_question_is_not_held_behind_a_long_one(make_pool):
    """With one worker, a 2-passage request sent just after a 64-passage one on the same socket is answered first: the pool hands out parts in turn."""
    import zmq

    from protocol import envelope

    pool = make_pool(WSCTX_RERANKER_POOL_SIZE="1", WSCTX_RERANK_CACHE_PAIRS="0", WSCTX_RERANKER_TIMEOUT_MS="150000")
    pool.rerank(_passages(2))  # the worker is up and warm
    sock = runtime.make_socket(zmq.Context.instance(), zmq.DEALER)
    try:
        sock.connect(pool.settings.endpoint("reranker"))
        long_frames = envelope.encode(RerankRequest(query=QUERY, passages=_passages(64)), sender="long")
        short_frames = envelope.encode(RerankRequest(query="where is a message decoded?", passages=_passages(2, 300)), sender="short")
        ids = {envelope.decode(long_frames).header.msg_id: "long", envelope.decode(short_frames).header.msg_id: "short"}
        sock.send_multipart(long_frames)  # one connection keeps the order: the broker reads the long one first
        sock.send_multipart(short_frames)
        order = []
        for _ in range(2):
            assert sock.poll(150_000), order
            msg = envelope.decode(sock.recv_multipart())
            assert isinstance(msg.body, RerankReply), msg.body
            order.append(ids[msg.header.parent_id])
    finally:
        sock.close(0)
    assert order == ["short", "long"], order
