"""One reranker worker process: its own copy of the cross-encoder, one part at a time.

Started by the broker as ``python -m daemons.reranker.worker`` with the broker's environment plus
``WSCTX_RERANKER_BACKEND`` (the broker's worker endpoint) and ``WSCTX_RERANKER_WORKER_ID``
(its routing identity). It loads the model once (one onnxruntime thread, memory arena off),
says READY (or FAIL with the reason, then exits), heartbeats every ``heartbeat_s`` from its I/O
loop while a separate thread scores, and exits when idle for ``reranker_idle_s`` (telling the
broker BYE), when the broker has been silent for ``BROKER_LIVENESS`` intervals or is no longer its
parent, on STOP, or on SIGTERM/SIGINT. Frames: see ``daemons.reranker.frames``.

Fault injection for tests (environment only; inert unless set):
- ``WSCTX_FAULT_WORKER_DIE_AFTER=N``: after answering N parts, the worker ``os._exit(1)``s on
  receiving the next one (mid-request, nothing answered).
- ``WSCTX_FAULT_WORKER_HANG_AFTER=N``: same point, but the worker freezes (no heartbeats, no
  answers) until killed.
- ``WSCTX_FAULT_WORKER_SEQS=1,3``: which spawns (``seq``, counted from 1) the two faults above
  apply to; default ``1`` (only the first worker the broker ever starts).
- ``WSCTX_FAULT_WORKER_SCORE_DELAY_MS=MS``: every part sleeps this long before scoring.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time

import zmq

from daemons.lib import runtime
from daemons.lib.config import load_settings
from daemons.lib.log import configure
from daemons.reranker import frames as F


def _fault_int(name: str) -> int | None:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip() else None


def load_model(model_dir: str | None):
    """Load the cross-encoder with one thread (the loader's session keeps no memory arena)."""
    from models.cross_encoder import load_cross_encoder

    return load_cross_encoder(model_dir, threads=1)


class Worker:
    def __init__(self) -> None:
        self.s = load_settings()
        self.endpoint = os.environ.get("WSCTX_RERANKER_BACKEND") or self.s.endpoint("reranker.workers")
        self.ident = os.environ.get("WSCTX_RERANKER_WORKER_ID") or f"w-{os.getpid()}"
        self.seq = int(self.ident[1:]) if self.ident[1:].isdigit() else 0
        self.log = configure("reranker.worker").bind(worker=self.ident)
        self.stop = threading.Event()
        self.parent = os.getppid()
        self.ctx = zmq.Context()
        self.jobs: queue.Queue[tuple[bytes, str, list[str]] | None] = queue.Queue()
        seqs = {int(x) for x in os.environ.get("WSCTX_FAULT_WORKER_SEQS", "1").split(",") if x.strip()}
        faulty = self.seq in seqs
        self.die_after = _fault_int("WSCTX_FAULT_WORKER_DIE_AFTER") if faulty else None
        self.hang_after = _fault_int("WSCTX_FAULT_WORKER_HANG_AFTER") if faulty else None
        self.score_delay_ms = _fault_int("WSCTX_FAULT_WORKER_SCORE_DELAY_MS") or 0
        self.model = None

    # ------------------------------------------------------------------ scoring thread

    def _score_loop(self) -> None:
        out = self.ctx.socket(zmq.PAIR)
        out.setsockopt(zmq.LINGER, 0)
        out.connect(f"inproc://results-{id(self)}")
        while True:
            job = self.jobs.get()
            if job is None:
                break
            job_id, query, passages = job
            t0 = time.perf_counter()
            try:
                if self.score_delay_ms:
                    time.sleep(self.score_delay_ms / 1000)
                scores = self.model.score(query, passages)
                ms = round((time.perf_counter() - t0) * 1000, 2)
                out.send_multipart([F.RESULT, job_id, F.pack({"scores": scores, "ms": ms})])
                self.log.info("part", job=job_id.decode(), passages=len(passages), chars=sum(map(len, passages)), ms=ms, status="ok")
            except Exception as exc:  # answered as ERROR, the worker stays up
                self.log.exception("part_failed", job=job_id.decode())
                out.send_multipart([F.ERROR, job_id, F.pack({"message": f"{type(exc).__name__}: {exc}"})])
        out.close(0)

    # ------------------------------------------------------------------ main

    def run(self) -> int:
        runtime.install_signal_handlers(self.stop, self.log)
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.IDENTITY, self.ident.encode())
        sock.connect(self.endpoint)
        t0 = time.perf_counter()
        try:
            from models.cross_encoder import ModelUnavailable

            try:
                self.model = load_model(self.s.reranker_dir or None)
            except ModelUnavailable as exc:
                reason = str(exc)
            except Exception as exc:  # anything else at load is also "cannot load"
                reason = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # models.cross_encoder itself missing or broken
            reason = f"cross-encoder module unavailable: {type(exc).__name__}: {exc}"
        load_ms = round((time.perf_counter() - t0) * 1000, 1)
        if self.model is None:
            self.log.error("model_unavailable", error=reason, ms=load_ms)
            sock.send_multipart([F.MAGIC, F.FAIL, F.pack({"pid": os.getpid(), "reason": reason})])
            sock.close()
            self.ctx.term()
            return 2
        results = self.ctx.socket(zmq.PAIR)
        results.setsockopt(zmq.LINGER, 0)
        results.bind(f"inproc://results-{id(self)}")
        scorer = threading.Thread(target=self._score_loop, name="score", daemon=True)
        scorer.start()
        sock.send_multipart([F.MAGIC, F.READY, F.pack({"pid": os.getpid(), "model_id": self.model.model_id, "load_ms": load_ms})])
        self.log.info("ready", model=self.model.model_id, ms=load_ms)
        reason = self._loop(sock, results)
        self.log.info("exiting", reason=reason)
        if reason != "stop":
            try:
                sock.send_multipart([F.MAGIC, F.BYE, F.pack({"reason": reason})], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self.jobs.put(None)
        results.close(0)
        sock.close()  # linger: the BYE gets out
        return 0

    def _loop(self, sock: zmq.Socket, results: zmq.Socket) -> str:
        hb = self.s.heartbeat_s
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(results, zmq.POLLIN)
        now = time.monotonic()
        last_broker = last_work = now
        next_hb = now + hb
        busy = False
        answered = 0
        while True:
            if self.stop.is_set():
                return "signal"
            events = dict(poller.poll(min(200, max(1, int((next_hb - time.monotonic()) * 1000)))))
            now = time.monotonic()
            if sock in events:
                msg = sock.recv_multipart()
                last_broker = now
                if len(msg) < 2 or msg[0] != F.MAGIC:
                    self.log.warning("bad_frame", frames=len(msg))
                elif msg[1] == F.STOP:
                    return "stop"
                elif msg[1] == F.PART and len(msg) >= 4:
                    if self.die_after is not None and answered >= self.die_after:
                        self.log.warning("fault_die", after=answered)
                        os._exit(1)
                    if self.hang_after is not None and answered >= self.hang_after:
                        self.log.warning("fault_hang", after=answered)
                        while True:
                            time.sleep(3600)
                    body = F.unpack(msg[3])
                    self.jobs.put((msg[2], str(body["query"]), [str(p) for p in body["passages"]]))
                    busy, last_work = True, now
            if results in events:
                kind, job_id, payload = results.recv_multipart()
                sock.send_multipart([F.MAGIC, kind, job_id, payload])
                answered += 1
                busy, last_work = False, now
                next_hb = now + hb
            if now >= next_hb:
                sock.send_multipart([F.MAGIC, F.HB])
                next_hb = now + hb
            if not busy and now - last_work > self.s.reranker_idle_s:
                return "idle"
            if now - last_broker > hb * F.BROKER_LIVENESS:
                return "broker_gone"
            if os.getppid() != self.parent:
                return "broker_gone"


def main() -> None:
    rc = Worker().run()
    sys.stdout.flush()
    os._exit(rc)  # the scoring thread may sit in native code: do not wait for it


if __name__ == "__main__":
    main()
