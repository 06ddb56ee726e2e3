"""Vectors for the embedder: rows built and embedded through the window cache, and the files
written keywords first whose vectors come later.

``VectorWork`` is the half of ``daemons.embedder.service.Embedder`` that turns a batch into rows
with vectors (``plan_rows`` + ``embed_rows``, windows the cache holds cost nothing), writes a file
keywords first while more batches wait (``keywords_first``), and, when nothing waits, embeds the
oldest such files about ``PENDING_GROUP_WINDOWS`` windows at a time and writes them in one commit
per workspace. The service owns the sockets, the tables and the order of work.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from daemons.lib.config import Settings
from daemons.lib.indexing import embed_rows, keyword_rows, pending_hash, plan_rows
from daemons.lib.vectorcache import VectorCache, cache_file
from protocol.schema import ChunkBatch

if TYPE_CHECKING:
    from daemons.embedder.service import WorkspaceIndex

#: Fault injection for tests: embedding a file's windows sleeps this long first (a slow machine).
FAULT_EMBED_DELAY_MS = int(os.environ.get("WSCTX_FAULT_EMBED_DELAY_MS", "0"))
#: Windows of waiting files embedded together (one model call, one commit): about 1.5-2 s of work
#: on 2 cores at 130-160 windows/s, the longest a newly arrived change waits behind it. Each commit
#: costs about 130 ms whatever its size, and every ``optimize_every`` commits an optimize about 5 s
#: (sympy 1.7), so 256 took sympy's vectors from 633 s to 539 s against 128 (README, `bench.big`).
PENDING_GROUP_WINDOWS = 256


class VectorWork:
    """Row building, the window cache and the keywords-first queue (a mixin of ``Embedder``)."""

    s: Settings
    log: Any
    stats: Any
    lock: threading.RLock
    model: Any
    vectors: VectorCache | None
    #: files whose rows were written without vectors, oldest first: (workspace, path) -> batch
    vector_queue: OrderedDict[tuple[str, str], ChunkBatch]
    #: (workspace, paths) to embed before the rest, appended by the query thread
    first_requests: deque[tuple[str, list[str]]]
    indexes: dict[str, WorkspaceIndex]
    write_error: str

    # the service's: why a batch is not indexed, and a failed write's handling
    def _skip_reason(self, body: ChunkBatch, idx: WorkspaceIndex) -> str:
        raise NotImplementedError("Embedder._skip_reason")

    def _write_failed_reread(self, wid: str, path: str, exc: BaseException, idx: WorkspaceIndex) -> None:
        raise NotImplementedError("Embedder._write_failed_reread")

    def _embed_pending_group(self) -> None:
        """Give the oldest files written without vectors their vectors (nothing else waits): about
        ``PENDING_GROUP_WINDOWS`` windows embedded in one call (small files batch together) and
        written in one commit per workspace."""
        started = time.perf_counter()
        self._take_first_requests()
        group: list[tuple[WorkspaceIndex, ChunkBatch, list[dict[str, Any]], list[str]]] = []
        windows = 0
        while self.vector_queue and windows < PENDING_GROUP_WINDOWS:
            (wid, path), batch = self.vector_queue.popitem(last=False)
            idx = self.indexes.get(wid)
            if idx is None or idx.store is None or idx.catalog.get(path) != pending_hash(batch.content_hash):
                continue  # removed, rebuilt or changed since: what the table holds now decides
            rows, texts = plan_rows(batch.path, batch.content_hash, batch.chunks, self.s)
            group.append((idx, batch, rows, texts))
            windows += len(texts)
        if not group:
            return
        if FAULT_EMBED_DELAY_MS:
            time.sleep(FAULT_EMBED_DELAY_MS * len(group) / 1000)
        all_rows = [r for _, _, rows, _ in group for r in rows]
        cached = self._embed_rows(all_rows, [t for _, _, _, texts in group for t in texts])
        embed_ms = (time.perf_counter() - started) * 1000
        by_index: dict[str, tuple[WorkspaceIndex, list[tuple[ChunkBatch, list[dict[str, Any]]]]]] = {}
        for idx, batch, rows, _ in group:
            by_index.setdefault(idx.wid, (idx, []))[1].append((batch, rows))
        for idx, files in by_index.values():
            t0 = time.perf_counter()
            try:
                with self.lock:
                    if self.indexes.get(idx.wid) is not idx:
                        continue  # rebuilt or removed while embedding
                    current = [(b, rows) for b, rows in files if idx.catalog.get(b.path) == pending_hash(b.content_hash)]
                    idx.store.replace_files({b.path: rows for b, rows in current})
                    for b, _ in current:
                        idx.catalog[b.path] = b.content_hash
                    optimized = idx.store.optimize_if_due(self.s.optimize_every)
                    self.write_error = ""
            except Exception as exc:  # noqa: BLE001 - as in _guarded
                self._write_failed_reread(idx.wid, files[0][0].path, exc, idx)
                continue
            rows_n = sum(len(rows) for _, rows in current)
            self.stats.incr("files.indexed", len(current))
            self.stats.incr("rows.written", rows_n)
            self.log.info("indexed_vectors", workspace=idx.wid, files=len(current), paths=[b.path for b, _ in current[:5]], rows=rows_n,
                          vectors_waiting=len(self.vector_queue), embed_ms=round(embed_ms, 2),
                          write_ms=round((time.perf_counter() - t0) * 1000, 2), optimized=optimized)
        self.stats.incr("windows.cached", cached)
        self.stats.incr("windows.embedded", len(all_rows) - cached)

    def _take_first_requests(self) -> None:
        """Move the files of every waiting ``vectors_first_request`` to the front of the queue (the
        latest request's files first of all)."""
        while self.first_requests:
            wid, paths = self.first_requests.popleft()
            moved = 0
            for path in reversed(paths):
                if (wid, path) in self.vector_queue:
                    self.vector_queue.move_to_end((wid, path), last=False)
                    moved += 1
            if moved:
                self.log.info("vectors_first", workspace=wid, paths=paths[:5], moved=moved)
                self.stats.incr("files.vectors_first", moved)

    def _goes_keywords_first(self, body: ChunkBatch, idx: WorkspaceIndex, backlog: bool) -> bool:
        """With more waiting, a wanted batch whose windows are not all cached is written keywords first."""
        return (backlog and self.s.keywords_first and bool(body.chunks) and not self._skip_reason(body, idx)
                and not self._windows_held(body))

    def _windows_held(self, body: ChunkBatch) -> bool:
        """Whether the window cache holds every window of the batch (then its vectors cost nothing now)."""
        if self.vectors is None:
            return False
        _, texts = plan_rows(body.path, body.content_hash, body.chunks, self.s)
        try:
            return self.vectors.holds_all(texts)
        except sqlite3.Error:
            return False

    def _write_keywords_first(self, batches: list[ChunkBatch], idx: WorkspaceIndex, started: float) -> None:
        """Write these files' rows (one workspace, distinct paths) with keyword text and no vectors
        now, in one commit; queue their vectors."""
        t0 = time.perf_counter()
        files = {b.path: keyword_rows(b.path, b.content_hash, b.chunks, self.s, self.model.dim) for b in batches}
        idx.store.replace_files(files)
        for b in batches:
            idx.catalog[b.path] = pending_hash(b.content_hash)
            self.vector_queue[(b.workspace, b.path)] = b
            self.vector_queue.move_to_end((b.workspace, b.path))
        optimized = idx.store.optimize_if_due(self.s.optimize_every)
        self.write_error = ""
        self.stats.incr("files.keywords_first", len(batches))
        self.log.info("indexed_keywords", workspace=idx.wid, files=len(batches), paths=[b.path for b in batches[:5]],
                      rows=sum(map(len, files.values())), vectors_waiting=len(self.vector_queue),
                      write_ms=round((time.perf_counter() - t0) * 1000, 2), optimized=optimized,
                      ms=round((time.perf_counter() - started) * 1000, 2))

    def _build_rows(self, body: ChunkBatch) -> tuple[list[dict[str, Any]], int]:
        """The file's rows and how many vectors the window cache held."""
        rows, texts = plan_rows(body.path, body.content_hash, body.chunks, self.s)
        return rows, self._embed_rows(rows, texts)

    def _embed_rows(self, rows: list[dict[str, Any]], texts: list[str]) -> int:
        """Give *rows* the vectors of *texts*; how many the window cache held. A cache that fails
        is dropped (logged once) and the windows embedded in full."""
        if self.vectors is not None:
            try:
                return embed_rows(rows, texts, self.model, self.vectors)
            except sqlite3.Error as exc:
                self.log.error("vector_cache_failed", path=str(self.vectors.path), error=f"{type(exc).__name__}: {exc}")
                self.vectors = None
        return embed_rows(rows, texts, self.model)

    def _open_vector_cache(self) -> None:
        if self.s.vector_cache_rows <= 0 or self.model is None:
            return
        path = cache_file(self.s.data_dir, self.model.model_id)
        try:
            self.vectors = VectorCache(path, self.model.model_id, self.model.dim, self.s.vector_cache_rows)
            self.log.info("vector_cache_opened", path=str(path), rows=self.vectors.rows, max_rows=self.s.vector_cache_rows)
        except (sqlite3.Error, OSError) as exc:  # indexing goes on, embedding every window
            self.log.error("vector_cache_failed", path=str(path), error=f"{type(exc).__name__}: {exc}")
