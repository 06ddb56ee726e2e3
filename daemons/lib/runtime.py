"""The small runtime every daemon shares: sockets, the control thread, request dispatch, clients.

- ``prepare_runtime_dir`` makes the private (0700) directory that holds the ipc sockets.
- ``serve_requests`` answers one request on a ROUTER socket: decode, dispatch to a handler,
  turn any exception into an ``ErrorReply`` with a stable code, log one canonical line.
- ``ControlServer`` is a thread with its own ROUTER socket that answers ``status_request``,
  ``ping_request``, ``shutdown_request`` (and daemon-specific control requests) without ever
  waiting behind the daemon's work.
- ``Client`` is a Lazy Pirate request client: DEALER socket, deadline, reconnect on timeout.
"""
from __future__ import annotations

import ctypes
import os
import signal
import stat
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import msgspec
import zmq

from protocol import envelope
from protocol.envelope import DecodeError, Message, VersionError
from protocol.errors import Internal, ProtocolError, Timeout, Unavailable, error_for
from protocol.schema import (
    Body,
    ErrorReply,
    PingReply,
    PingRequest,
    ReconcileRequest,
    ShutdownReply,
    ShutdownRequest,
    StatusReply,
    StatusRequest,
)

VERSION = "0.1.0"
Reply = Body | tuple[Body, list[bytes]]
Handler = Callable[[Message], Reply]
QUIET_TYPES = frozenset({"status_request", "ping_request"})


def prepare_runtime_dir(path: str) -> Path:
    """Create the runtime directory owner-only (0700) and refuse one that others own or that is a
    symbolic link (its target's owner and mode say nothing of who can swap the link).

    Also sets the process umask to 077: every daemon calls this first, so the index, log and
    registry files it creates afterwards (which hold or name the workspace's code) are owner-only."""
    os.umask(0o077)
    p = Path(path)
    if p.is_symlink():
        # the link's target could be anyone's folder, and the link itself can be swapped
        raise PermissionError(f"runtime dir {p} is a symbolic link (to {os.readlink(p)}): name the folder itself")
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(p)
    if st.st_uid != os.getuid():
        raise PermissionError(f"runtime dir {p} belongs to uid {st.st_uid}, not us")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(p, 0o700)
    return p


def bind(sock: zmq.Socket, endpoint: str) -> None:
    """Bind, removing a stale ipc file left by a killed process and making the socket owner-only."""
    if endpoint.startswith("ipc://"):
        path = Path(endpoint[len("ipc://") :])
        path.unlink(missing_ok=True)
        sock.bind(endpoint)
        os.chmod(path, 0o600)
    else:
        sock.bind(endpoint)


def make_socket(ctx: zmq.Context, kind: int, *, max_bytes: int = envelope.MAX_MESSAGE_BYTES) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # ZeroMQ drops an oversized frame before we see it; the codec's own cap answers the rest.
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes + 65536)
    return sock


class Stats:
    """Thread-safe counters shown by ``status_request``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def incr(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def error_reply(exc: BaseException) -> ErrorReply:
    if isinstance(exc, ProtocolError):
        return ErrorReply(code=exc.code.value, message=exc.message)
    return ErrorReply(code="internal", message=f"{type(exc).__name__}: {exc}")


_request = threading.local()


def lower_priority(nice: int, log: Any) -> None:
    """Make the calling thread *nice* steps less urgent for the CPU (0: unchanged).

    On Linux the nice value belongs to a thread, and threads started afterwards (onnxruntime's
    pool of a session made afterwards included) inherit it; threads already running keep theirs.
    So an indexing daemon starts its control and query threads first, then lowers itself.
    """
    if nice <= 0:
        return
    try:
        now = os.nice(nice)
    except OSError as exc:  # not allowed here: indexing just competes at the same priority
        log.warning("priority_unchanged", nice=nice, error=str(exc))
        return
    log.info("priority_lowered", nice=now)


def received_at() -> float | None:
    """When ``serve_threaded`` received the request this thread is handling (``time.monotonic()``),
    so a deadline counts the time it waited for a free thread; None outside such a request."""
    return getattr(_request, "received", None)


def peer_id() -> str | None:
    """The ZAP user id of the request this thread is handling (``serve_threaded(peer_ids=True)``:
    a CURVE client's z85 public key), None without one."""
    return getattr(_request, "peer", None)


def _zap_user(frame: zmq.Frame) -> str | None:
    try:
        return frame.get("User-Id") or None
    except (zmq.ZMQError, AttributeError):
        return None


def answer(frames: list[bytes], handlers: dict[str, Handler], log: Any, sender: str, stats: Stats | None = None) -> list[bytes]:
    """Decode one request, dispatch it, and return the reply frames; never raises for bad input.

    Logs the canonical line of the request: type, status, id, duration (and the time it queued
    for a thread, when served by ``serve_threaded``) and the handler's timings.
    """
    started = time.perf_counter()
    received = received_at()
    queued_ms = round((time.monotonic() - received) * 1000, 2) if received is not None else None
    header = None
    routing: list[bytes] = []
    msg_type = "?"
    try:
        msg = envelope.decode(frames)
        header, routing, msg_type = msg.header, msg.routing, msg.msg_type
        handler = handlers.get(msg_type)
        if handler is None:
            raise DecodeError(f"{sender} does not handle {msg_type!r}", routing, header)
        result = handler(msg)
        body, blobs = result if isinstance(result, tuple) else (result, [])
        status = "ok"
    except (DecodeError, VersionError) as exc:
        routing, header = exc.routing, exc.header
        body, blobs, status = error_reply(exc), [], exc.code.value
    except ProtocolError as exc:
        body, blobs, status = error_reply(exc), [], exc.code.value
    except Exception as exc:  # a bug: answer it, log it, keep serving
        log.exception("handler_failed", msg_type=msg_type)
        body, blobs, status = error_reply(exc), [], "internal"
    if stats is not None:
        stats.incr(f"requests.{msg_type}.{status}")
    timings = getattr(body, "timings_ms", None)
    # Health probes are frequent (``status --wait`` polls every second): keep them out of info logs.
    emit = log.debug if msg_type in QUIET_TYPES and status == "ok" else log.info
    emit(
        "request",
        msg_type=msg_type,
        status=status,
        msg_id=header.msg_id if header else None,
        ms=round((time.perf_counter() - started) * 1000, 2),
        **({"queued_ms": queued_ms} if queued_ms is not None else {}),
        **({"timings_ms": timings} if timings else {}),
        **({"error": body.message} if isinstance(body, ErrorReply) else {}),
    )
    return envelope.encode(body, parent=header, sender=sender, routing=routing, blobs=blobs)


def serve_requests(sock: zmq.Socket, handlers: dict[str, Handler], log: Any, sender: str, stats: Stats | None = None) -> None:
    """Receive one request from ``sock`` (ROUTER) and answer it in this thread."""
    reply = answer(sock.recv_multipart(copy=True), handlers, log, sender, stats)
    try:
        sock.send_multipart(reply)
    except zmq.ZMQError as exc:
        log.warning("reply_failed", error=str(exc))


def serve_threaded(
    ctx: zmq.Context, sock: zmq.Socket, handlers: dict[str, Handler], log: Any, sender: str,
    stats: Stats, stop: threading.Event, workers: int = 4, peer_ids: bool = False,
) -> None:
    """Serve ``sock`` (ROUTER) until ``stop``, running handlers on a thread pool.

    Only this thread touches ``sock``; finished replies come back over an inproc PULL, one
    PUSH per pool thread, so slow requests never hold up quick ones. With *peer_ids*, each
    handler can ask ``peer_id()`` for the ZAP user id its request came with (a CURVE client's
    public key).
    """
    from concurrent.futures import ThreadPoolExecutor

    inproc = f"inproc://replies-{sender}-{id(sock)}"
    pull = ctx.socket(zmq.PULL)
    pull.bind(inproc)
    local = threading.local()

    def work(frames: list[bytes], received: float, user: str | None) -> None:
        _request.received = received
        _request.peer = user
        try:
            reply = answer(frames, handlers, log, sender, stats)
        finally:
            _request.received = None
            _request.peer = None
        if not hasattr(local, "push"):
            local.push = ctx.socket(zmq.PUSH)
            local.push.setsockopt(zmq.LINGER, 1000)
            local.push.connect(inproc)
        local.push.send_multipart(reply)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{sender}-req")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(pull, zmq.POLLIN)
    in_flight = 0
    while not (stop.is_set() and in_flight == 0):
        events = dict(poller.poll(200))
        if pull in events:
            while True:
                try:
                    reply = pull.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                in_flight -= 1
                try:
                    sock.send_multipart(reply)
                except zmq.ZMQError as exc:
                    log.warning("reply_failed", error=str(exc))
        if sock in events and not stop.is_set():
            while True:
                user: str | None = None
                try:
                    if peer_ids:
                        parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        user = _zap_user(parts[-1])
                        frames = [p.bytes for p in parts]
                    else:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                in_flight += 1
                pool.submit(work, frames, time.monotonic(), user)
    pool.shutdown(wait=True)
    pull.close(0)


class ControlServer(threading.Thread):
    """Answers control requests on ``<daemon>.ctl`` in its own thread, so it never waits behind work."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        daemon: str,
        log: Any,
        stats: Stats,
        stop: threading.Event,
        status_fn: Callable[[], dict[str, Any]] | None = None,
        queue_depth_fn: Callable[[], int] | None = None,
        extra: dict[str, Handler] | None = None,
    ) -> None:
        super().__init__(name=f"{daemon}-control", daemon=True)
        self.sock = make_socket(ctx, zmq.ROUTER)
        bind(self.sock, endpoint)
        self.daemon_name = daemon
        self.log = log
        self.stats = stats
        self.stop_event = stop
        self.started_at = time.time()
        self.status_fn = status_fn or (lambda: {})
        self.queue_depth_fn = queue_depth_fn or (lambda: 0)
        self.handlers: dict[str, Handler] = {
            "status_request": self._status,
            "ping_request": lambda m: PingReply(daemon=self.daemon_name),
            "shutdown_request": self._shutdown,
            **(extra or {}),
        }

    def _status(self, msg: Message) -> StatusReply:
        return StatusReply(
            daemon=self.daemon_name,
            pid=os.getpid(),
            version=VERSION,
            protocol=envelope.PROTOCOL_VERSION,
            uptime_s=round(time.time() - self.started_at, 3),
            queue_depth=self.queue_depth_fn(),
            counters=self.stats.snapshot(),
            details=self.status_fn(),
        )

    def _shutdown(self, msg: Message) -> ShutdownReply:
        self.log.info("shutdown_requested")
        self.stop_event.set()
        return ShutdownReply()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while True:
            if poller.poll(200):
                serve_requests(self.sock, self.handlers, self.log, self.daemon_name, self.stats)
            elif self.stop_event.is_set():
                break
        self.sock.close(0)


class Service:
    """What every daemon holds: its settings (``s``), its structlog logger, the process's ZeroMQ
    context, its counters and its stop event. A daemon subclasses it, names itself in ``name``,
    and is started by ``run_daemon``."""

    name = ""

    def __init__(self, settings: Any) -> None:
        from daemons.lib.log import configure

        self.s = settings
        self.log = configure(self.name)
        self.ctx = zmq.Context.instance()
        self.stats = Stats()
        self.stop = threading.Event()


#: glibc's ``mallopt`` parameter number of M_ARENA_MAX.
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc malloc's arenas for this process at *arenas* (``mallopt(M_ARENA_MAX)``); True when
    applied. glibc gives each thread that allocates an arena of its own, up to 8 per core, and
    LanceDB's and onnxruntime's thread pools then spread freed memory over them: on a table written
    and searched 550 times, two arenas held the same work in 190 MB less (bench/store_memory.py).
    0 keeps glibc's default; a libc without ``mallopt`` (musl, macOS) is left as it is. Called
    before the daemon's threads start, as ``run_daemon`` does."""
    return _mallopt(_M_ARENA_MAX, arenas)


def _mallopt(param: int, value: int) -> bool:
    """``mallopt(param, value)`` for a positive *value*; True when applied, False for 0 or where the
    libc has no ``mallopt`` (musl, macOS)."""
    if value <= 0:
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(param, int(value)))
    except (OSError, AttributeError):
        return False


#: glibc's ``mallopt`` parameter number of M_MMAP_THRESHOLD.
_M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(kb: int) -> bool:
    """Serve every allocation of at least *kb* KB from its own mapping, returned to the system when
    freed (``mallopt(M_MMAP_THRESHOLD)``); True when applied. glibc's own threshold starts at
    128 KB and rises to the largest block freed so far (up to 32 MB), so after the first batches
    of a model's activations (tens of MB each) they come from the heap, and the heap keeps the
    freed pages. 0 keeps glibc's rising threshold."""
    return _mallopt(_M_MMAP_THRESHOLD, kb * 1024)


def memory_mb(pid: int | str = "self", field: str = "VmRSS") -> float:
    """A process's memory in MB from ``/proc/PID/status``: resident now (``VmRSS``), or its peak
    (``VmHWM``); 0.0 where /proc has none."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def trim_memory() -> bool:
    """Give the pages glibc's malloc holds free back to the system (``malloc_trim(0)``); True when
    some were. A daemon calls it when it turns idle: its working memory (a model's activations,
    a table write's buffers) was freed but stays resident on the heap otherwise. A libc without
    ``malloc_trim`` is left as it is."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False


def use_arrow_pool(name: str) -> str:
    """Make *name* (one of ``config.ARROW_POOLS``) the Arrow memory pool of this process; '' keeps
    pyarrow's default. Returns the pool in use, or '' when pyarrow is not loaded (then the choice
    is left in ``ARROW_DEFAULT_MEMORY_POOL``, which pyarrow reads when it loads).

    "system" is glibc's malloc, so Arrow's buffers share the capped arenas of
    ``limit_malloc_arenas``: mimalloc keeps the pages of freed buffers, and a table written 600
    times and searched after each write held 560 MB with it against 355 MB with the system pool,
    at the same search speed (bench/store_memory.py)."""
    from daemons.lib.config import ARROW_POOLS

    if name not in ARROW_POOLS:
        raise ValueError(f"arrow_memory_pool {name!r}: use one of {', '.join(map(repr, ARROW_POOLS))}")
    if "pyarrow" not in sys.modules:
        if name:
            os.environ["ARROW_DEFAULT_MEMORY_POOL"] = name
        return ""
    import pyarrow as pa

    if name:
        pa.set_memory_pool(getattr(pa, f"{name}_memory_pool")())
    return pa.default_memory_pool().backend_name


def run_daemon(service: Callable[[Any], Any]) -> None:
    """A daemon's ``main``: load the settings, cap malloc's arenas and fix its mmap threshold, pick
    Arrow's memory pool, build the service and run it."""
    from daemons.lib.config import load_settings

    try:
        settings = load_settings()
    except ValueError as exc:
        # a setting that would start the daemon but break it: refused by name, never run
        name = getattr(service, "name", getattr(service, "__name__", "daemon"))
        print(f"{name}: bad settings: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    limit_malloc_arenas(settings.malloc_arenas)
    fix_mmap_threshold(settings.malloc_mmap_threshold_kb)
    use_arrow_pool(settings.arrow_memory_pool)
    service(settings).run()


def install_signal_handlers(stop: threading.Event, log: Any) -> None:
    """SIGTERM/SIGINT set ``stop``: the daemon finishes what it holds, then exits."""

    def handler(signum: int, frame: object) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


class Client:
    """Request-reply client (Lazy Pirate): one DEALER, a deadline per call, a fresh socket after a timeout.

    ``request`` returns the reply Message or raises the ProtocolError the reply carries
    (``Timeout`` when nothing came back in time).
    """

    def __init__(self, endpoint: str, ctx: zmq.Context | None = None, sender: str = "client", curve: dict[str, bytes] | None = None, connect_timeout_ms: int = 250) -> None:
        self.endpoint = endpoint
        self.connect_timeout_ms = connect_timeout_ms
        self.ctx = ctx or zmq.Context.instance()
        self.sender = sender
        self.curve = curve
        self._sock: zmq.Socket | None = None
        self._lock = threading.Lock()

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = make_socket(self.ctx, zmq.DEALER)
            # Queue nothing for a peer that is not there: a daemon that is down answers
            # "unavailable" within connect_timeout_ms instead of after the whole deadline.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            if self.curve:
                sock.curve_serverkey = self.curve["server_public"]
                sock.curve_publickey = self.curve["public"]
                sock.curve_secretkey = self.curve["secret"]
            sock.connect(self.endpoint)
            self._sock = sock
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def request(self, body: Body, timeout_ms: int = 5000, blobs: list[bytes] | tuple[bytes, ...] = (), retries: int = 0, session: str = "") -> Message:
        with self._lock:
            for attempt in range(retries + 1):
                sock = self._socket()
                if not sock.poll(self.connect_timeout_ms, zmq.POLLOUT):
                    self._reset()
                    raise Unavailable(f"{self.endpoint} is not accepting connections (daemon down?)")
                frames = envelope.encode(body, sender=self.sender, blobs=blobs, session=session)
                msg_id = msgspec.json.decode(frames[1])["msg_id"]
                sock.send_multipart(frames)
                deadline = time.monotonic() + timeout_ms / 1000
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or not sock.poll(int(left * 1000) + 1):
                        break
                    reply = envelope.decode(sock.recv_multipart())
                    if reply.header.parent_id and reply.header.parent_id != msg_id:
                        continue  # a late answer to an earlier, timed-out request
                    if isinstance(reply.body, ErrorReply):
                        raise error_for(reply.body.code, reply.body.message)
                    return reply
                self._reset()
            raise Timeout(f"no reply from {self.endpoint} within {timeout_ms} ms")

    def close(self) -> None:
        with self._lock:
            self._reset()


def wait_ready(endpoint: str, timeout_s: float = 30.0, ctx: zmq.Context | None = None) -> None:
    """Block until the control socket at ``endpoint`` answers a ping (raise Timeout otherwise)."""
    client = Client(endpoint, ctx=ctx, sender="wait_ready")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                client.request(PingRequest(), timeout_ms=300)
                return
            except (Timeout, Unavailable):
                time.sleep(0.05)
                if time.monotonic() > deadline:
                    raise Timeout(f"{endpoint} not ready after {timeout_s:.0f} s") from None
    finally:
        client.close()


def control_request(endpoint: str, body: Body, timeout_ms: int = 2000) -> Message:
    """One-shot control request (status, shutdown, reconcile ...)."""
    client = Client(endpoint, sender="control")
    try:
        return client.request(body, timeout_ms=timeout_ms)
    finally:
        client.close()


__all__ = [
    "Client",
    "ControlServer",
    "Stats",
    "bind",
    "control_request",
    "error_reply",
    "install_signal_handlers",
    "make_socket",
    "prepare_runtime_dir",
    "serve_requests",
    "serve_threaded",
    "answer",
    "wait_ready",
    "Internal",
    "StatusRequest",
    "ShutdownRequest",
]


def ask_watcher_to_reconcile(settings: Any, log, stop: threading.Event, who: str) -> threading.Thread:
    """In the background, ask the watcher (retrying until it answers) to re-send what is not in the table."""

    def run() -> None:
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                control_request(settings.control_endpoint("watcher"), ReconcileRequest(force=True), timeout_ms=1000)
                log.info("reconcile_asked", by=who)
                return
            except ProtocolError:
                stop.wait(0.5)

    t = threading.Thread(target=run, name="ask-reconcile", daemon=True)
    t.start()
    return t
