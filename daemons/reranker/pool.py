"""The broker's worker processes: spawned on demand, watched by heartbeat, dropped and replaced.

``WorkerPool`` is the half of ``daemons.reranker.broker.Broker`` that speaks to the workers on the
backend ROUTER (frames in ``daemons.reranker.frames``): spawning up to ``reranker_pool_size``,
READY / HB / RESULT / ERROR / FAIL / BYE, liveness, reaping, and giving a lost worker's part back
to the queue. The request half (the frontend, splitting, the pair cache, deadlines) is the broker's;
this class calls its ``finish_ok`` and ``finish_error``.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from daemons.lib.config import Settings
from daemons.lib.deadline import ScoringRate
from daemons.lib.scorecache import ScoreCache, pair_key
from daemons.reranker import frames as F
from daemons.reranker.jobs import Part, Request, WorkerState
from protocol.errors import ErrorCode

#: After a worker could not load the model, new requests are refused this long without a spawn.
FAIL_BACKOFF_S = 10.0
#: A spawned worker that has not said READY by then is dropped.
STARTUP_TIMEOUT_S = 60.0
#: A part that has been lost with this many workers fails its request.
MAX_ATTEMPTS = 3


def finite_scores(raw: Any) -> list[float]:
    """A RESULT's scores as floats; ValueError unless each is a JSON number and finite (a string
    such as "nan", or 1e999, from a peer that took a worker's id, must never reach an answer or the
    pair cache, where it would stay)."""
    if not isinstance(raw, list):
        raise ValueError("scores is not a list")
    out = []
    for x in raw:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"score {x!r} is not a finite number")
        out.append(float(x))
    return out


class WorkerPool:
    """The worker side of the broker (a mixin of ``Broker``, which owns the sockets and requests)."""

    s: Settings
    log: Any
    stats: Any
    stop: Any
    backend: zmq.Socket
    pool_size: int
    hb: float
    workers: dict[bytes, WorkerState]
    procs: dict[bytes, subprocess.Popen]
    idle: list[bytes]
    waiting: deque[Request]
    pending: deque[Part]
    active: dict[str, Request]
    seq: int
    model_error: str
    fail_until: float
    model_id: str
    next_hb: float
    cache: ScoreCache
    rate: ScoringRate

    # the broker's request half answers these
    def finish_ok(self, req: Request) -> None:
        raise NotImplementedError("Broker.finish_ok")

    def finish_error(self, req: Request, code: ErrorCode, message: str) -> None:
        raise NotImplementedError("Broker.finish_error")

    def live(self) -> int:
        return len(self.workers)

    def spawn(self) -> None:
        self.seq += 1
        ident = f"w{self.seq}".encode()
        env = dict(os.environ)
        env.update(
            WSCTX_RERANKER_BACKEND=self.s.endpoint("reranker.workers"),
            WSCTX_RERANKER_WORKER_ID=ident.decode(),
            WSCTX_RUNTIME_DIR=self.s.runtime_dir,
            WSCTX_HEARTBEAT_S=str(self.s.heartbeat_s),
            WSCTX_RERANKER_IDLE_S=str(self.s.reranker_idle_s),
        )
        if self.s.reranker_dir:
            env["WSCTX_RERANKER_DIR"] = self.s.reranker_dir
        proc = subprocess.Popen([sys.executable, "-m", "daemons.reranker.worker"], env=env, stdin=subprocess.DEVNULL, close_fds=True)
        now = time.monotonic()
        self.workers[ident] = WorkerState(ident=ident, seq=self.seq, proc=proc, started=now, pid=proc.pid, expiry=now + STARTUP_TIMEOUT_S)
        self.procs[ident] = proc
        self.stats.incr("workers.spawned")
        self.log.info("worker_spawned", worker=ident.decode(), worker_pid=proc.pid)

    def ensure_workers(self) -> None:
        if self.stop.is_set() or time.monotonic() < self.fail_until:
            return
        if not (self.waiting or self.pending or any(w.job for w in self.workers.values())):
            return
        while self.live() < self.pool_size:
            self.spawn()

    def send_worker(self, ident: bytes, *frames: bytes) -> bool:
        try:
            self.backend.send_multipart([ident, F.MAGIC, *frames], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # unroutable (gone) or full: treat as gone
            self.log.warning("worker_send_failed", worker=ident.decode(), error=str(exc))
            w = self.workers.get(ident)
            if w is not None:
                self.drop(w, "unreachable", kill=True)
            return False

    def drop(self, w: WorkerState, reason: str, kill: bool = False) -> None:
        """Forget a worker; give its in-flight part back to the queue."""
        self.workers.pop(w.ident, None)
        if w.ident in self.idle:
            self.idle.remove(w.ident)
        part, w.job = w.job, None
        if part is not None and not part.done and part.req.msg_id in self.active:
            part.worker = None
            part.attempt += 1
            if part.attempt >= MAX_ATTEMPTS:
                self.finish_error(part.req, ErrorCode.INTERNAL, f"a part of this request was lost with {part.attempt} workers")
            else:
                self.pending.appendleft(part)
                self.stats.incr("parts.redispatched")
        if kill and w.proc.poll() is None:
            w.proc.kill()
        self.stats.incr(f"workers.dropped.{reason}")
        self.log.info("worker_dropped", worker=w.ident.decode(), worker_pid=w.pid, reason=reason, redispatched=part is not None)

    def startup_failed(self, reason: str) -> None:
        self.model_error = reason
        self.fail_until = time.monotonic() + FAIL_BACKOFF_S
        self.stats.incr("model.failures")
        self.log.error("model_unavailable", error=reason)
        if not self.workers:  # nobody left who could do the work
            for req in list(self.active.values()):
                self.finish_error(req, ErrorCode.UNAVAILABLE, f"cross-encoder unavailable: {reason}")

    def on_worker(self, msg: list[bytes]) -> None:
        if len(msg) < 3 or msg[1] != F.MAGIC:
            self.log.warning("bad_worker_frame", frames=len(msg))
            return
        ident, cmd, rest = msg[0], msg[2], msg[3:]
        w = self.workers.get(ident)
        if w is None:
            if cmd not in (F.BYE, F.FAIL):  # a worker we dropped: tell it to go
                try:
                    self.backend.send_multipart([ident, F.MAGIC, F.STOP], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
            return
        # decode before anything changes: a malformed or forged frame (worker ids are predictable)
        # is logged and dropped like any other socket's garbage, and never refreshes liveness
        try:
            info = F.unpack(rest[0]) if cmd in (F.READY, F.FAIL, F.BYE) and rest else {}
            body = F.unpack(rest[1]) if cmd in (F.RESULT, F.ERROR) and len(rest) >= 2 else {}
            pid = int(info.get("pid", w.pid))
            scores = finite_scores(body.get("scores") or []) if cmd == F.RESULT else []
            score_ms = float(body.get("ms", 0.0))
        except (msgspec.MsgspecError, ValueError, TypeError) as exc:
            self.log.warning("bad_worker_frame", worker=ident.decode(errors="replace"), command=cmd.decode(errors="replace")[:16], error=str(exc)[:200])
            self.stats.incr("workers.bad_frames")
            return
        now = time.monotonic()
        w.expiry = now + self.hb * F.LIVENESS if w.ready or cmd == F.READY else w.expiry
        if cmd == F.HB:
            return
        if cmd == F.READY:
            w.ready, w.pid = True, pid
            w.model_id = self.model_id = str(info.get("model_id", ""))
            self.model_error, self.fail_until = "", 0.0
            self.idle.append(ident)
            self.rate.observe_startup((now - w.started) * 1000)
            self.log.info("worker_ready", worker=ident.decode(), worker_pid=w.pid, load_ms=info.get("load_ms"), startup_ms=round((now - w.started) * 1000, 1))
        elif cmd == F.FAIL:
            self.workers.pop(ident, None)
            self.startup_failed(str(info.get("reason", "unknown reason")))
        elif cmd == F.BYE:
            self.drop(w, f"bye_{info.get('reason', '?')}")
        elif cmd in (F.RESULT, F.ERROR) and len(rest) >= 2:
            part = w.job
            if part is None or part.job_id != rest[0]:
                self.log.warning("stale_result", worker=ident.decode(), job=rest[0].decode(errors="replace"))
                return
            w.job = None
            w.parts_done += 1
            self.idle.append(ident)
            part.done = True
            req = part.req
            positions = req.todo[part.start : part.end]
            if cmd == F.RESULT and len(scores) == len(positions):
                self.rate.observe(score_ms, req.part_chars(part))
                for i, score in zip(positions, scores):  # kept even when the request was answered already
                    self.cache.put(pair_key(w.model_id, req.query, req.passages[i]), score)
            if req.msg_id not in self.active:
                return  # answered already (timeout)
            if cmd == F.ERROR:
                self.finish_error(req, ErrorCode.INTERNAL, f"scoring failed: {body.get('message', '')}")
                return
            if len(scores) != len(positions):
                self.finish_error(req, ErrorCode.INTERNAL, f"worker returned {len(scores)} scores for {len(positions)} passages")
                return
            for i, score in zip(positions, scores):
                req.scores[i] = score
            req.workers_used.add(ident)
            req.score_ms = max(req.score_ms, score_ms)
            req.model_id = w.model_id
            if all(p.done for p in req.parts):
                self.finish_ok(req)

    def reap(self) -> None:
        for ident, proc in list(self.procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.procs[ident]
            w = self.workers.get(ident)
            if w is None:
                continue
            if not w.ready:
                self.workers.pop(ident, None)
                self.startup_failed(f"worker exited with code {rc} before it was ready")
            else:
                self.drop(w, f"exited_{rc}")

    def check_liveness(self, now: float) -> None:
        for w in list(self.workers.values()):
            if now > w.expiry:
                self.drop(w, "no_heartbeat" if w.ready else "startup_timeout", kill=True)
                if not w.ready:
                    self.startup_failed(f"worker not ready after {STARTUP_TIMEOUT_S:.0f} s")
        if now >= self.next_hb:
            for w in list(self.workers.values()):
                if w.ready:
                    self.send_worker(w.ident, F.HB)
            self.next_hb = now + self.hb
