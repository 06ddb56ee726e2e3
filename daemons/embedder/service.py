"""The embedder: the single writer of every workspace's table, and the query embedder.

Input (PULL ``embedder.in``): ``chunks.batch`` and ``file.deleted`` from the chunker. Each batch
is windowed, given keyword text, embedded, and replaces the file's rows in one commit; a batch
whose hash the table already holds costs nothing. While more batches wait behind one
(``keywords_first``), its rows are written at once with their keyword text and no vectors (marked
pending, skipped by vector search) and the file is embedded later, when nothing waits: a large
workspace is searchable by keywords long before its vectors are built. ``embed_query_request`` is answered on the
ROUTER ``embedder.query`` by its own thread with its own one-thread model session, so a question
never waits behind indexing; indexing runs ``index_nice`` steps below it for the CPU.
A table built with other settings or another model is left alone and reported as
"rebuild needed" until ``rebuild_request`` drops it.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict, deque
from typing import Any

import numpy as np
import zmq

from daemons.lib import catalog, runtime
from daemons.lib.config import Settings
from daemons.lib.indexing import chunk_shape, index_meta, pending_hash
from daemons.lib.store import IndexStore, RebuildNeeded, arrow_memory, cache_usage, configure_caches
from daemons.lib.vectorcache import VectorCache
from daemons.lib.workspaces import Registry, check_event, index_dir, remove_index, safe_relpath
from daemons.embedder.vectors import FAULT_EMBED_DELAY_MS, VectorWork
from models.embedding import ModelUnavailable, load_embedder
from protocol import envelope
from protocol.errors import BadMessage, ProtocolError, Unavailable, UnknownWorkspace
from protocol.schema import ChunkBatch, EmbedQueryReply, FileDeleted, RebuildReply, VectorsFirstReply, WorkspaceRemoveReply

#: Fault injection for tests: every query embedding sleeps this long first.
FAULT_QUERY_DELAY_MS = int(os.environ.get("WSCTX_FAULT_EMBED_QUERY_DELAY_MS", "0"))
#: At most this many waiting chunker messages are taken together; their keywords-first files are
#: written in one commit (a commit scans the table, so one per file grows with the table).
KEYWORD_BURST = 64
#: After a table write failed (read-only or full disk), ask for a forced reconcile this often.
WRITE_RETRY_S = 5.0


class WorkspaceIndex:
    def __init__(self, wid: str, root: str, store: IndexStore | None, problem: str = "") -> None:
        self.wid, self.root, self.store, self.problem = wid, root, store, problem
        self._generation = 0
        self.catalog = store.catalog() if store else {}
        #: ``version`` when the list was last published, and when (monotonic)
        self.published: tuple[int, int] | None = None
        self.published_at = 0.0
        #: after a failed publish (full disk, read-only folder), not before this (monotonic)
        self.publish_retry_at = 0.0

    @property
    def catalog(self) -> catalog.Catalog:
        """``{path: content hash}`` of what the table holds, kept in step with every commit."""
        return self._catalog

    @catalog.setter
    def catalog(self, files: dict[str, str]) -> None:
        self._catalog = catalog.Catalog(files)
        self._generation += 1

    @property
    def version(self) -> tuple[int, int]:
        """Changes whenever the list does."""
        return self._generation, self._catalog.changes


class Embedder(VectorWork, runtime.Service):
    name = "embedder"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.registry = Registry(settings.data_dir)
        self.indexes: dict[str, WorkspaceIndex] = {}
        configure_caches(settings.lance_index_cache_mb, settings.lance_metadata_cache_mb)
        self.vector_index_builds: dict[str, threading.Thread] = {}
        self.lock = threading.RLock()
        self.model = None  # indexing (embed_threads, at the lowered priority)
        self.query_model = None  # questions (one thread, normal priority)
        self.vectors: VectorCache | None = None  # window vectors by content (vectorcache.py)
        #: files whose rows were written without vectors, oldest first: (workspace, path) -> batch
        self.vector_queue: OrderedDict[tuple[str, str], ChunkBatch] = OrderedDict()
        #: (workspace, paths) whose vectors go first (vectors_first_request), for the indexing thread
        self.first_requests: deque[tuple[str, list[str]]] = deque()
        self.model_error = ""
        self.chunker_problem = ""
        self.queue_depth = 0
        self.write_failed_at = 0.0
        #: the last failed write's error, shown by status until a write succeeds
        self.write_error = ""
        self.pull = runtime.make_socket(self.ctx, zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, 100_000)

    # ------------------------------------------------------------------ tables

    def _meta(self, root: str) -> dict[str, Any]:
        return index_meta(self.s, self.model, root)

    def index_for(self, wid: str, root: str) -> WorkspaceIndex:
        with self.lock:
            idx = self.indexes.get(wid)
            if idx is None:
                folder = index_dir(self.s.data_dir, wid)
                try:
                    t0 = time.perf_counter()
                    if not folder.exists():
                        # the empty list goes first, so that the watcher never meets a table without one
                        folder.mkdir(parents=True)
                        catalog.publish(folder, {})
                    idx = WorkspaceIndex(wid, root, IndexStore.open_writer(folder, self._meta(root)))
                    self._publish(idx)  # a table that opens but whose folder is read-only: logged, tried again later
                    if idx.store.file_keywords_filled:
                        self.log.info("file_keywords_added", workspace=wid, files=idx.store.file_keywords_filled,
                                      ms=round((time.perf_counter() - t0) * 1000, 1))
                except RebuildNeeded as exc:
                    self.log.error("rebuild_needed", workspace=wid, problem=str(exc))
                    idx = WorkspaceIndex(wid, root, None, str(exc))
                except Exception as exc:  # noqa: BLE001 - a table that cannot be made (full disk, read-only): like a failed write
                    self._write_failed(wid, "", exc, "table_create_failed")
                    return WorkspaceIndex(wid, root, None, "")  # not kept: the next batch tries again
                self.indexes[wid] = idx
            return idx

    def _publish(self, idx: WorkspaceIndex) -> None:
        """Write the table's file list for the watcher (``daemons/lib/catalog.py``). When that fails
        (a full disk) the previous list stays, which lags the table and never leads it: logged, and
        tried again after WRITE_RETRY_S."""
        version, now = idx.version, time.monotonic()
        try:
            catalog.publish(index_dir(self.s.data_dir, idx.wid), idx.catalog)
        except OSError as exc:
            idx.publish_retry_at = now + WRITE_RETRY_S
            self.log.error("catalog_publish_failed", workspace=idx.wid, error=f"{type(exc).__name__}: {exc}")
            return
        idx.published, idx.published_at = version, now

    def _publish_catalogs(self, throttle: bool = False) -> None:
        """Publish each list that changed; with *throttle* (more messages wait) at most every PUBLISH_EVERY_S."""
        now = time.monotonic()
        due = [idx for idx in list(self.indexes.values()) if idx.store is not None and idx.published != idx.version
               and now >= idx.publish_retry_at and (not throttle or now - idx.published_at >= catalog.PUBLISH_EVERY_S)]
        if not due:
            return
        with self.lock:
            for idx in due:
                self._publish(idx)

    def _write_failed(self, wid: str, path: str, exc: BaseException, event: str = "write_failed") -> None:
        """Count and log a failed write or table creation; the watcher is asked to re-send after WRITE_RETRY_S."""
        self.stats.incr("writes.failed")
        self.write_failed_at = time.monotonic()
        self.write_error = f"{type(exc).__name__}: {exc}"
        self.log.error(event, workspace=wid, path=path, error=self.write_error)

    def rebuild(self, wid: str) -> None:
        entries = self.registry.load()
        if wid not in entries:
            raise UnknownWorkspace(f"unknown workspace {wid!r}")
        with self.lock:
            self.indexes.pop(wid, None)
            IndexStore.destroy(index_dir(self.s.data_dir, wid))
            self.index_for(wid, entries[wid])
        self.log.info("rebuild_started", workspace=wid)
        runtime.ask_watcher_to_reconcile(self.s, self.log, self.stop, "embedder-rebuild")

    # ------------------------------------------------------------------ indexing

    def handle(self, frames: list[bytes], backlog: bool = False) -> None:
        """Apply one chunker message; with *backlog* (more wait behind it) a batch's vectors may wait."""
        prepared = self._prepare(frames)
        if prepared is not None:
            self._guarded(*prepared, backlog)

    def handle_burst(self, messages: list[list[bytes]]) -> None:
        """Apply chunker messages that arrived together (a backlog), in order: the batches that go
        keywords first are written together, one commit per workspace, instead of one each."""
        group: dict[str, tuple[WorkspaceIndex, list[ChunkBatch]]] = {}

        def flush() -> None:
            for idx, batches in group.values():
                self._guarded_keywords(batches, idx)
            group.clear()

        for frames in messages:
            prepared = self._prepare(frames)
            if prepared is None:
                continue
            body, idx, started = prepared
            if isinstance(body, ChunkBatch) and self._goes_keywords_first(body, idx, backlog=True):
                batches = group.setdefault(body.workspace, (idx, []))[1]
                if any(b.path == body.path for b in batches):  # a second version of one file: the first goes in first
                    flush()
                    batches = group.setdefault(body.workspace, (idx, []))[1]
                batches.append(body)
                continue
            flush()
            # not keywords first (just decided, and nothing it depends on has changed): applied as
            # without a backlog, so that the decision is not made again
            self._guarded(body, idx, started, False)
        flush()

    def _prepare(self, frames: list[bytes]) -> tuple[ChunkBatch | FileDeleted, WorkspaceIndex, float] | None:
        """Decode and check one chunker message and find its workspace's table; None (counted and
        logged) when it cannot be applied."""
        started = time.perf_counter()
        try:
            msg = envelope.decode(frames)
        except ProtocolError as exc:
            self.stats.incr("messages.bad")
            self.log.warning("bad_message", error=exc.message)
            return None
        body = msg.body
        if not isinstance(body, (ChunkBatch, FileDeleted)):
            self.stats.incr("messages.unexpected")
            self.stats.incr("messages.bad")
            self.log.warning("unexpected_message", msg_type=msg.msg_type)
            return None
        try:
            check_event(self.registry, body.workspace, body.root, body.path)
            if isinstance(body, ChunkBatch):
                safe_relpath(body.root, body.path)  # no rows for a path that leads out through a link
        except ProtocolError as exc:
            self.stats.incr("messages.bad")
            self.log.warning("bad_event", workspace=body.workspace, path=body.path, error=exc.message)
            return None
        idx = self.index_for(body.workspace, body.root)
        if idx.store is None:
            self.stats.incr("batches.refused")
            return None
        return body, idx, started

    def _guarded(self, body: ChunkBatch | FileDeleted, idx: WorkspaceIndex, started: float, backlog: bool) -> None:
        try:
            self._apply(body, idx, started, backlog)
        except Exception as exc:  # noqa: BLE001 - a table that cannot be written (read-only or full disk): keep serving
            self._write_failed_reread(body.workspace, body.path, exc, idx)

    def _guarded_keywords(self, batches: list[ChunkBatch], idx: WorkspaceIndex) -> None:
        try:
            with self.lock:
                self._write_keywords_first(batches, idx, time.perf_counter())
        except Exception as exc:  # noqa: BLE001 - as in _guarded
            self._write_failed_reread(batches[0].workspace, batches[0].path, exc, idx)

    def _write_failed_reread(self, wid: str, path: str, exc: BaseException, idx: WorkspaceIndex) -> None:
        """A failed write: count and log it, and read back what the table holds now."""
        self._write_failed(wid, path, exc)
        with self.lock:
            try:
                idx.catalog = idx.store.catalog()
            except Exception:  # noqa: BLE001 - unreadable too: forget it, the next write re-reads
                idx.catalog = {}

    def _more(self, n: int) -> list[list[bytes]]:
        """Up to *n* more messages that are already waiting (never blocks)."""
        out: list[list[bytes]] = []
        while len(out) < n:
            try:
                out.append(self.pull.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        return out

    def _apply(self, body: ChunkBatch | FileDeleted, idx: WorkspaceIndex, started: float, backlog: bool = False) -> None:
        with self.lock:
            if isinstance(body, FileDeleted):
                self.vector_queue.pop((body.workspace, body.path), None)
                if body.path in idx.catalog:
                    idx.store.delete_file(body.path)
                    idx.catalog.pop(body.path, None)
                    self.stats.incr("files.removed")
                    self.log.info("removed", workspace=body.workspace, path=body.path, reason=body.reason, ms=round((time.perf_counter() - started) * 1000, 2))
                return
            if not self._wanted(body, idx):
                return
            if self._goes_keywords_first(body, idx, backlog):
                self._write_keywords_first([body], idx, started)
                return
            self.vector_queue.pop((body.workspace, body.path), None)
            t0 = time.perf_counter()
            if FAULT_EMBED_DELAY_MS:
                time.sleep(FAULT_EMBED_DELAY_MS / 1000)
            rows, cached = self._build_rows(body)
            embed_ms = (time.perf_counter() - t0) * 1000
            t1 = time.perf_counter()
            idx.store.replace_file(body.path, rows)
            write_ms = (time.perf_counter() - t1) * 1000
            if rows:
                idx.catalog[body.path] = body.content_hash
            else:
                idx.catalog.pop(body.path, None)
            optimized = idx.store.optimize_if_due(self.s.optimize_every)
            self.write_error = ""
        self.stats.incr("files.indexed")
        self.stats.incr("rows.written", len(rows))
        self.stats.incr("windows.cached", cached)
        self.stats.incr("windows.embedded", len(rows) - cached)
        self.log.info(
            "indexed", workspace=body.workspace, path=body.path, chunks=len(body.chunks), rows=len(rows), cached=cached,
            embed_ms=round(embed_ms, 2), write_ms=round(write_ms, 2), optimized=optimized,
            ms=round((time.perf_counter() - started) * 1000, 2),
        )

    def _skip_reason(self, body: ChunkBatch, idx: WorkspaceIndex) -> str:
        """Why the batch changes nothing ("shape" or "unchanged"), "" when it is wanted."""
        if body.chunk_shape and body.chunk_shape != chunk_shape(self.s):
            return "shape"
        if idx.catalog.get(body.path) == body.content_hash:
            return "unchanged"
        waiting = self.vector_queue.get((body.workspace, body.path))
        if waiting is not None and waiting.content_hash == body.content_hash and idx.catalog.get(body.path) == pending_hash(body.content_hash):
            return "unchanged"  # sent again while its vectors wait: they are coming
        return ""

    def _wanted(self, body: ChunkBatch, idx: WorkspaceIndex) -> bool:
        """Whether the batch changes anything (else it is counted and logged here)."""
        reason = self._skip_reason(body, idx)
        if reason == "shape":
            # A chunker running with other chunk settings: its rows would not match the table's recorded shape.
            self.stats.incr("batches.shape_mismatch")
            self.chunker_problem = f"chunker sends chunks shaped {body.chunk_shape}, this index expects {chunk_shape(self.s)}: restart the chunker with the same settings"
            self.log.error("chunk_shape_mismatch", workspace=body.workspace, path=body.path, got=body.chunk_shape, expected=chunk_shape(self.s))
        elif reason == "unchanged":
            self.stats.incr("files.unchanged")
        return not reason

    def _optimize_idle(self) -> None:
        with self.lock:
            for idx in self.indexes.values():
                if idx.store is not None and idx.store.writes_since_optimize:
                    t0 = time.perf_counter()
                    try:
                        idx.store.optimize()
                    except Exception as exc:  # noqa: BLE001 - read-only or full disk: try again after the next write
                        self.log.error("optimize_failed", workspace=idx.wid, error=f"{type(exc).__name__}: {exc}")
                        continue
                    self.log.info("optimized", workspace=idx.wid, ms=round((time.perf_counter() - t0) * 1000, 1))
                if idx.store is not None and idx.wid not in self.vector_index_builds and idx.store.needs_vector_index():
                    t = threading.Thread(target=self._build_vector_index, args=(idx,), name="vector-index", daemon=True)
                    self.vector_index_builds[idx.wid] = t
                    t.start()
        # what embedding and writing freed stays resident on malloc's heap until it is trimmed
        if self.s.trim_when_idle:
            before = runtime.memory_mb()
            if runtime.trim_memory():
                after = runtime.memory_mb()
                self.log.info("memory_trimmed", resident_mb=round(after, 1), released_mb=round(before - after, 1))

    def _build_vector_index(self, idx: WorkspaceIndex) -> None:
        """Build the ANN index in the background; indexing and queries go on meanwhile."""
        t0 = time.perf_counter()
        try:
            idx.store.ensure_vector_index()
            self.log.info("vector_index_built", workspace=idx.wid, ms=round((time.perf_counter() - t0) * 1000, 1))
        except Exception as exc:  # noqa: BLE001 - retried at the next idle optimize
            self.log.error("vector_index_failed", workspace=idx.wid, error=f"{type(exc).__name__}: {exc}")
        finally:
            self.vector_index_builds.pop(idx.wid, None)

    def _retry_failed_writes(self) -> None:
        """After a failed write, ask the watcher (every WRITE_RETRY_S) to re-send what the table lacks."""
        if self.write_failed_at and time.monotonic() - self.write_failed_at > WRITE_RETRY_S:
            self.write_failed_at = 0.0
            runtime.ask_watcher_to_reconcile(self.s, self.log, self.stop, "embedder-write-retry")

    # ------------------------------------------------------------------ queries

    def _embed_query(self, msg: envelope.Message) -> tuple[EmbedQueryReply, list[bytes]]:
        model = self.query_model
        if model is None:
            raise Unavailable(f"embedding model not loaded: {self.model_error}")
        if FAULT_QUERY_DELAY_MS:
            time.sleep(FAULT_QUERY_DELAY_MS / 1000)
        vec = np.ascontiguousarray(model.embed_query(msg.body.text), dtype=np.float32)
        return EmbedQueryReply(model_id=model.model_id, dim=int(vec.shape[0])), [vec.tobytes()]

    def _vectors_first(self, msg: envelope.Message) -> VectorsFirstReply:
        """Note which of these files wait for their vectors; the indexing thread embeds them next
        (``VectorWork._take_first_requests``). Answered at once, whatever indexing is doing."""
        body = msg.body
        waiting = [p for p in body.paths if (body.workspace, p) in self.vector_queue]
        if waiting:
            self.first_requests.append((body.workspace, waiting))
        return VectorsFirstReply(waiting=len(waiting))

    def _query_loop(self) -> None:
        sock = runtime.make_socket(self.ctx, zmq.ROUTER)
        runtime.bind(sock, self.s.endpoint("embedder.query"))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        handlers = {"embed_query_request": self._embed_query, "vectors_first_request": self._vectors_first}
        while not self.stop.is_set():
            if poller.poll(200):
                runtime.serve_requests(sock, handlers, self.log, "embedder", self.stats)
        sock.close(0)

    # ------------------------------------------------------------------ control

    def _ctl_rebuild(self, msg: envelope.Message) -> RebuildReply:
        if self.model is None:
            raise Unavailable(f"embedding model not loaded: {self.model_error}")
        self.rebuild(msg.body.workspace)
        return RebuildReply(workspace=msg.body.workspace)

    def _ctl_remove(self, msg: envelope.Message) -> WorkspaceRemoveReply:
        """Let go of an unregistered workspace and delete its index folder (this daemon writes them)."""
        wid = msg.body.workspace
        if wid in self.registry.load():
            raise BadMessage(f"workspace {wid} is still registered: `wsctx remove` unregisters it first")
        with self.lock:
            self.indexes.pop(wid, None)
            freed = remove_index(self.s.data_dir, wid)
        self.log.info("workspace_removed", workspace=wid, freed_bytes=freed)
        return WorkspaceRemoveReply(workspace=wid, freed_bytes=freed)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": getattr(self.model, "model_id", None), "model_error": self.model_error, "chunker_problem": self.chunker_problem,
                               "write_error": self.write_error, "writes_failed": self.stats.snapshot().get("writes.failed", 0), "workspaces": {},
                               "vector_cache": {"rows": self.vectors.rows, "max_rows": self.vectors.max_rows} if self.vectors is not None else None,
                               "vectors_waiting": len(self.vector_queue), "lance_cache": cache_usage(), "arrow": arrow_memory()}
        for wid, idx in list(self.indexes.items()):
            entry: dict[str, Any] = {"root": idx.root, "problem": idx.problem}
            if idx.store is not None:
                rows = idx.store.table.count_rows()
                entry.update(files=len(idx.catalog), chunks=idx.store.table.count_rows("window = 0") if rows else 0, rows=rows, last_update=idx.store.last_update)
            out["workspaces"][wid] = entry
        return out

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        runtime.prepare_runtime_dir(self.s.runtime_dir)
        runtime.install_signal_handlers(self.stop, self.log)
        try:
            # loaded before the priority is lowered: a one-thread session has no pool of its own,
            # and the query thread that runs it starts below at normal priority
            self.query_model = load_embedder(self.s.embedder_model, threads=1)
        except ModelUnavailable as exc:
            self.model_error = str(exc)
            self.log.error("model_unavailable", error=self.model_error)
        control = runtime.ControlServer(
            self.ctx, self.s.control_endpoint("embedder"), "embedder", self.log, self.stats, self.stop,
            status_fn=self.status, queue_depth_fn=lambda: self.queue_depth, extra={"rebuild_request": self._ctl_rebuild, "workspace_remove_request": self._ctl_remove},
        )
        control.start()
        query_thread = threading.Thread(target=self._query_loop, name="embed-query", daemon=True)
        query_thread.start()
        runtime.lower_priority(self.s.index_nice, self.log)
        if self.query_model is not None:
            try:
                t0 = time.perf_counter()
                self.model = load_embedder(self.s.embedder_model, threads=self.s.embed_threads or None,
                                           batch_tokens=self.s.embed_batch_tokens, batch_max=self.s.embed_batch)
                self.log.info("model_loaded", model=self.model.model_id, dim=self.model.dim, ms=round((time.perf_counter() - t0) * 1000, 1))
            except ModelUnavailable as exc:
                self.model_error = str(exc)
                self.log.error("model_unavailable", error=self.model_error)
        self._open_vector_cache()
        if self.model is not None:
            for wid, root in self.registry.load().items():
                self.index_for(wid, root)
            runtime.bind(self.pull, self.s.endpoint("embedder.in"))
            runtime.ask_watcher_to_reconcile(self.s, self.log, self.stop, "embedder")
        self.log.info("started", model=getattr(self.model, "model_id", None))
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        idle_since = time.monotonic()
        while not self.stop.is_set():
            if self.model is None:
                self.stop.wait(0.5)
                continue
            self._retry_failed_writes()
            if poller.poll(0 if self.vector_queue else 200):
                frames = self.pull.recv_multipart()
                backlog = bool(self.pull.getsockopt(zmq.EVENTS) & zmq.POLLIN)
                if backlog and self.s.keywords_first:
                    self.handle_burst([frames, *self._more(KEYWORD_BURST - 1)])
                    backlog = bool(self.pull.getsockopt(zmq.EVENTS) & zmq.POLLIN)
                else:
                    self.handle(frames, backlog)
                self.queue_depth = int(backlog) + len(self.vector_queue)
                idle_since = time.monotonic()
                self._publish_catalogs(throttle=backlog)
            elif self.vector_queue:  # nothing arrived: the vectors that wait, a group of files at a time
                self._publish_catalogs()  # a group takes seconds: what was written before it shows meanwhile
                self._embed_pending_group()
                self.queue_depth = len(self.vector_queue)
                idle_since = time.monotonic()
                self._publish_catalogs()
            else:
                self._publish_catalogs()
                if time.monotonic() - idle_since > 2.0:
                    self._optimize_idle()
                    idle_since = float("inf")
        control.join(timeout=2)
        query_thread.join(timeout=2)
        self.pull.close(0)
        self.log.info("stopped")


def main() -> None:
    runtime.run_daemon(Embedder)
