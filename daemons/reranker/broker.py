"""The reranker broker: ``rerank_request`` in, cross-encoder scores out, scored by worker processes.

Frontend: ROUTER at ``settings.endpoint("reranker")`` (envelope codec; ``rerank_request`` ->
``rerank_reply`` or ``error_reply``). Backend: ROUTER at ``settings.endpoint("reranker.workers")``
for the workers (Paranoid Pirate queue, ZeroMQ guide ch. 4; internal frames documented in
``daemons.reranker.frames``). One ``zmq.Poller`` loop serves both and never blocks on work.

- Workers are spawned on demand (``python -m daemons.reranker.worker``), up to
  ``reranker_pool_size``, when work arrives and fewer are alive. Work goes to the ready ones as
  they come: a cold start waits for the first READY, not for all.
- A request is split when it is first dispatched, across the idle ready workers at that moment:
  contiguous slices of roughly equal total characters. Parts go to the least recently used idle
  worker; scores are reassembled in order; one ``RerankReply``.
- A worker that misses ``LIVENESS`` heartbeats is dropped and killed; one whose process exits is
  dropped at once. Either way its in-flight part is re-dispatched (a replacement is spawned when
  needed). A part that has killed ``MAX_ATTEMPTS`` workers fails its request with ``internal``.
- Workers exit by themselves after ``reranker_idle_s`` without work (BYE); the pool shrinks to zero.
- A worker that cannot load the model says FAIL with the reason: when no live worker remains, the
  waiting requests get ``unavailable`` with that reason at once, and for ``FAIL_BACKOFF_S`` new
  requests get the same answer without a spawn.
- Pairs the same model has scored before come from a bounded pair cache (``rerank_cache_pairs``,
  ``daemons.lib.scorecache``): only the rest is split and sent to workers, and a request whose
  every pair is cached is answered at once. Scores that come back after their request was answered
  are still cached.
- Work not done by ``reranker_timeout_ms`` after arrival, or by the request's own ``deadline_ms``
  when that is sooner, is answered ``timeout``. A request with a ``deadline_ms`` that the queue
  (characters waiting and in flight at the workers' measured rate, ``daemons.lib.deadline``) would
  finish later than that is answered ``timeout`` at once, so the asker can use the fused order.
- SIGTERM / ``shutdown_request``: new requests get ``unavailable``, held ones may finish for up to
  ``DRAIN_S``, workers are told STOP, stragglers terminated then killed, every child reaped.
"""
from __future__ import annotations

import subprocess
import time
from collections import deque
from typing import Any

import zmq

from daemons.lib import runtime
from daemons.lib.config import Settings
from daemons.lib.deadline import BUSY_PREFIX, ScoringRate
from daemons.lib.scorecache import ScoreCache, pair_key
from daemons.reranker import frames as F
from daemons.reranker.jobs import Part, Request, WorkerState, part_count, split_by_chars
from daemons.reranker.pool import WorkerPool
from protocol import envelope
from protocol.envelope import DecodeError, Header, VersionError
from protocol.errors import ErrorCode, ProtocolError
from protocol.schema import ErrorReply, RerankReply, RerankRequest

DRAIN_S = 3.0


class Broker(WorkerPool, runtime.Service):
    name = "reranker"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.pool_size = max(1, int(settings.reranker_pool_size))
        self.hb = float(settings.heartbeat_s)
        self.workers: dict[bytes, WorkerState] = {}
        self.procs: dict[bytes, subprocess.Popen] = {}  # every child not yet reaped
        self.idle: list[bytes] = []  # ready and free, least recently used first
        self.waiting: deque[Request] = deque()  # not yet split
        self.pending: deque[Part] = deque()  # split, waiting for a worker
        self.active: dict[str, Request] = {}  # msg_id -> request (waiting or in progress)
        self.seq = 0
        self.model_error = ""
        self.fail_until = 0.0
        self.model_id = ""
        self.served = 0
        self.next_hb = 0.0
        self._status: dict[str, Any] = {}
        self.cache = ScoreCache(max(0, int(settings.rerank_cache_pairs)))
        self.rate = ScoringRate()
        self.frontend = runtime.make_socket(self.ctx, zmq.ROUTER)
        self.backend = runtime.make_socket(self.ctx, zmq.ROUTER)
        self.backend.setsockopt(zmq.ROUTER_MANDATORY, 1)

    # ------------------------------------------------------------------ requests

    def reply(self, req_routing: list[bytes], header: Header | None, body: Any) -> None:
        # the status snapshot (read by the control thread) is refreshed before the reply goes out,
        # so an asker that reads status next sees what this request cached and counted
        self._update_status(time.monotonic())
        try:
            self.frontend.send_multipart(envelope.encode(body, parent=header, sender="reranker", routing=req_routing), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.log.warning("reply_failed", error=str(exc))

    def _close(self, req: Request) -> None:
        self.active.pop(req.msg_id, None)
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
        for p in list(self.pending):
            if p.req is req:
                self.pending.remove(p)

    def _log(self, req: Request, status: str, **extra: Any) -> None:
        self.stats.incr(f"requests.rerank_request.{status}")
        self.log.info(
            "request", msg_type="rerank_request", status=status, msg_id=req.msg_id, passages=len(req.passages),
            chars=sum(map(len, req.passages)), cached=req.cached, parts=len(req.parts), workers=len(req.workers_used), cold=req.cold,
            ms=round((time.monotonic() - req.arrived) * 1000, 2), **extra,
        )

    def finish_ok(self, req: Request) -> None:
        self._close(req)
        now = time.monotonic()
        timings = {
            "queue": round(((req.first_dispatch or now) - req.arrived) * 1000, 2),
            "score": round(req.score_ms, 2),
            "total": round((now - req.arrived) * 1000, 2),
        }
        # counted before the reply goes out: an asker that reads the counters next sees this request
        self.served += 1
        self._log(req, "ok", timings_ms=timings)
        self.reply(req.routing, req.header, RerankReply(scores=[float(s) for s in req.scores], model_id=req.model_id or self.model_id,
                                                        workers=len(req.workers_used), timings_ms=timings, cached=req.cached))

    def finish_error(self, req: Request, code: ErrorCode, message: str) -> None:
        if req.msg_id not in self.active:
            return
        self._close(req)
        self._log(req, code.value, error=message)  # counted before the reply goes out, as in finish_ok
        self.reply(req.routing, req.header, ErrorReply(code=code.value, message=message))

    def on_frontend(self, frames: list[bytes]) -> None:
        started = time.monotonic()
        try:
            msg = envelope.decode(frames)
            if msg.msg_type != "rerank_request" or not isinstance(msg.body, RerankRequest):
                raise DecodeError(f"reranker does not handle {msg.msg_type!r}", msg.routing, msg.header)
        except (DecodeError, VersionError) as exc:
            self.stats.incr(f"requests.bad.{exc.code.value}")
            self.reply(exc.routing, exc.header, runtime.error_reply(exc))
            self.log.info("request", msg_type=getattr(exc.header, "msg_type", "?"), status=exc.code.value, error=exc.message)
            return
        except ProtocolError as exc:
            self.log.warning("bad_message", error=exc.message)
            return
        body: RerankRequest = msg.body
        limit_ms = self.s.reranker_timeout_ms if body.deadline_ms is None else min(self.s.reranker_timeout_ms, body.deadline_ms)
        req = Request(
            routing=msg.routing, header=msg.header, query=body.query, passages=list(body.passages), arrived=started,
            deadline=started + limit_ms / 1000, scores=[None] * len(body.passages),
        )
        self.active[req.msg_id] = req
        if self.stop.is_set():
            self.finish_error(req, ErrorCode.UNAVAILABLE, "reranker is shutting down")
            return
        self.from_cache(req)
        if not req.todo:
            self.finish_ok(req)
            return
        if not self.workers and started < self.fail_until:
            self.finish_error(req, ErrorCode.UNAVAILABLE, f"cross-encoder unavailable: {self.model_error}")
            return
        if body.deadline_ms is not None:
            finish_ms = self.queue_finish_ms(req)
            if body.deadline_ms <= 0 or (finish_ms is not None and finish_ms > body.deadline_ms):
                self.stats.incr("requests.refused_busy")
                self.finish_error(req, ErrorCode.TIMEOUT, f"{BUSY_PREFIX}: the queue would finish this in about {finish_ms or 0:.0f} ms, "
                                                  f"past its deadline of {body.deadline_ms} ms")
                return
        req.cold = not self.idle
        self.waiting.append(req)
        self.ensure_workers()

    def from_cache(self, req: Request) -> None:
        """Fill the scores the cache holds for this model; the rest become ``req.todo``."""
        if not (self.model_id and self.cache.capacity):
            req.todo = list(range(len(req.passages)))
            return
        for i, passage in enumerate(req.passages):
            score = self.cache.get(pair_key(self.model_id, req.query, passage))
            if score is None:
                req.todo.append(i)
            else:
                req.scores[i] = score
                req.cached += 1

    def queue_finish_ms(self, req: Request) -> float | None:
        """When the pool would be done with *req* if queued now (None before any rate is known)."""
        backlog = sum(r.todo_chars() for r in self.waiting)
        backlog += sum(p.req.part_chars(p) for p in self.pending)
        backlog += sum(w.job.req.part_chars(w.job) for w in self.workers.values() if w.job is not None)
        ready = sum(1 for w in self.workers.values() if w.ready)
        return self.rate.finish_ms(backlog, req.todo_chars(), ready or self.pool_size, ready > 0)

    def _next_part(self) -> Part | None:
        """The pending part of the request that has had the fewest parts handed out (the oldest
        first among equals), taken off the queue; parts of closed requests are dropped."""
        best: Part | None = None
        for part in list(self.pending):
            if part.done or part.req.msg_id not in self.active:
                self.pending.remove(part)
            elif best is None or part.req.turns < best.req.turns:
                best = part
        if best is not None:
            self.pending.remove(best)
        return best

    def dispatch(self, now: float) -> None:
        """Hand parts to idle workers, fairly: a request not yet started is cut (``part_count``)
        as soon as a worker is free, and each free worker takes a part of the request that has
        had fewest, so one long request shares the pool instead of holding it."""
        while self.idle and (self.pending or self.waiting):
            if self.waiting:
                req = self.waiting.popleft()
                slices = split_by_chars([req.passages[i] for i in req.todo], part_count(len(req.todo), len(self.idle)))
                req.parts = [Part(req=req, index=i, start=a, end=b) for i, (a, b) in enumerate(slices)]
                req.first_dispatch = now
                self.pending.extend(req.parts)
            part = self._next_part()
            if part is None:
                continue
            part.req.turns += 1
            ident = self.idle.pop(0)
            w = self.workers[ident]
            w.job, part.worker = part, ident
            payload = F.pack({"query": part.req.query, "passages": part.req.part_passages(part)})
            if not self.send_worker(ident, F.PART, part.job_id, payload):
                continue  # drop() put the part back
        self.ensure_workers()

    def expire(self, now: float) -> None:
        for req in list(self.active.values()):
            if now >= req.deadline:
                self.finish_error(req, ErrorCode.TIMEOUT, f"reranking not finished within {self.s.reranker_timeout_ms} ms")

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        return self._status

    def _update_status(self, now: float) -> None:
        self._status = {
            "pool_size": self.pool_size,
            "idle_s": self.s.reranker_idle_s,
            "heartbeat_s": self.hb,
            "live_workers": sum(1 for w in self.workers.values() if w.ready),
            "starting_workers": sum(1 for w in self.workers.values() if not w.ready),
            "worker_pids": sorted(w.pid for w in self.workers.values() if w.ready),
            "workers": [
                {"id": w.ident.decode(), "pid": w.pid, "ready": w.ready, "busy": w.job is not None, "parts": w.parts_done}
                for w in self.workers.values()
            ],
            "children": sorted(p.pid for p in self.procs.values()),
            "model_id": self.model_id,
            "last_model_error": self.model_error,
            "retry_spawn_in_s": round(max(0.0, self.fail_until - now), 1),
            "requests_served": self.served,
            "requests_active": len(self.active),
            "cache": {"pairs": len(self.cache), "capacity": self.cache.capacity, "hits": self.cache.hits, "misses": self.cache.misses},
            "ms_per_kchar": round(self.rate.ms_per_char * 1000, 2) if self.rate.ms_per_char is not None else None,
        }

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        runtime.prepare_runtime_dir(self.s.runtime_dir)
        runtime.install_signal_handlers(self.stop, self.log)
        runtime.bind(self.backend, self.s.endpoint("reranker.workers"))
        runtime.bind(self.frontend, self.s.endpoint("reranker"))
        self._update_status(time.monotonic())
        control = runtime.ControlServer(
            self.ctx, self.s.control_endpoint("reranker"), "reranker", self.log, self.stats, self.stop,
            status_fn=self.status, queue_depth_fn=lambda: len(self.active),
        )
        control.start()
        self.log.info("started", pool_size=self.pool_size, idle_s=self.s.reranker_idle_s, heartbeat_s=self.hb)
        try:
            self._loop()
        finally:
            self._shutdown()
            control.join(timeout=2)
            self.frontend.close(0)
            self.backend.close(0)
            self.log.info("stopped")

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        drain_until: float | None = None
        while True:
            now = time.monotonic()
            if self.stop.is_set():
                if drain_until is None:
                    drain_until = now + DRAIN_S
                    self.log.info("draining", active=len(self.active))
                if not self.active or now >= drain_until:
                    for req in list(self.active.values()):
                        self.finish_error(req, ErrorCode.UNAVAILABLE, "reranker is shutting down")
                    return
            timeout = min(100, max(1, int((self.next_hb - now) * 1000)))
            events = dict(poller.poll(timeout))
            if self.backend in events:
                for _ in range(100):
                    try:
                        self.on_worker(self.backend.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
            if self.frontend in events:
                for _ in range(100):
                    try:
                        self.on_frontend(self.frontend.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
            now = time.monotonic()
            self.reap()
            self.check_liveness(now)
            self.expire(now)
            self.dispatch(now)
            self._update_status(now)

    def _shutdown(self) -> None:
        for w in list(self.workers.values()):
            if w.ready:
                try:
                    self.backend.send_multipart([w.ident, F.MAGIC, F.STOP], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
            elif w.proc.poll() is None:
                w.proc.terminate()  # still loading: nothing to finish
        deadline = time.monotonic() + 3.0
        for sig_step in ("wait", "terminate", "kill"):
            for proc in list(self.procs.values()):
                if proc.poll() is None and sig_step == "terminate":
                    proc.terminate()
                elif proc.poll() is None and sig_step == "kill":
                    proc.kill()
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
                time.sleep(0.05)
            deadline = time.monotonic() + 2.0
        for proc in self.procs.values():
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                self.log.error("worker_not_reaped", worker_pid=proc.pid)
        self.workers.clear()
        self.log.info("workers_stopped", count=len(self.procs))
        self.procs.clear()


def main() -> None:
    runtime.run_daemon(Broker)
