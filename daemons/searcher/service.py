"""The searcher: builds the keyword query, embeds the question, runs the four searches at once,
folds windows, fuses by RRF and returns the top candidates with text and line ranges.

ROUTER ``searcher`` answers ``search_request``. The query embedding is asked of the embedder
with a deadline (``embed_timeout_ms``); when it is late, down, or the index was built with
another model, the vector lists are empty, the keyword lists still run, and ``degraded`` says so.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from daemons.lib import runtime
from daemons.lib.config import Settings, with_overrides
from daemons.lib.question import QueryPlan, combine_vectors, plan_for
from daemons.lib.lru import LRU
from daemons.lib.roles import roles_present, wanted_roles
from daemons.lib.search import settings_search, to_candidates
from daemons.lib.store import IndexStore, arrow_memory, cache_usage, configure_caches
from daemons.lib.workspaces import Registry, index_dir
from protocol import envelope
from protocol.errors import BadMessage, ProtocolError, UnknownWorkspace
from protocol.schema import EmbedQueryRequest, SearchReply, VectorsFirstRequest

DEGRADED_EMBEDDER_DOWN = "keywords only (embedder unavailable)"
DEGRADED_EMBEDDER_SLOW = "keywords only (embedder too slow)"
DEGRADED_REBUILD = "keywords only (index built with another model: rebuild needed)"


#: Question vectors remembered (an editor asks again, an agent repeats itself, a follow-up reuses them).
QUERY_VECTORS_KEPT = 512
#: How long the background thread waits for the embedder's answer to vectors_first.
VECTORS_FIRST_TIMEOUT_MS = 2000


class QueryEmbedder:
    """Embeds questions through the embedder daemon, with a deadline; one client per thread. The
    last ``QUERY_VECTORS_KEPT`` vectors are kept by text, so a repeated question is not embedded again."""

    def __init__(self, endpoint: str, ctx: zmq.Context) -> None:
        self.endpoint, self.ctx = endpoint, ctx
        self.local = threading.local()
        self.kept: LRU[str, tuple[np.ndarray, str]] = LRU(QUERY_VECTORS_KEPT)
        self.kept_lock = threading.Lock()

    def holds(self, texts: list[str]) -> bool:
        """Whether a vector is kept for any of *texts*."""
        with self.kept_lock:
            return any(text in self.kept for text in texts)

    def forget(self, texts: list[str]) -> None:
        """Drop the vectors kept for *texts*."""
        with self.kept_lock:
            for text in texts:
                self.kept.pop(text)

    def embed(self, text: str, timeout_ms: int) -> tuple[np.ndarray | None, str, str]:
        """``(vector, model_id, problem)``; vector is None and problem set when it failed."""
        with self.kept_lock:
            hit = self.kept.get(text)
        if hit is not None:
            return hit[0], hit[1], ""
        vec, model_id, problem = self._ask(text, timeout_ms)
        if vec is not None:
            with self.kept_lock:
                self.kept.put(text, (vec, model_id))
        return vec, model_id, problem

    def _client(self) -> runtime.Client:
        """This thread's client of the embedder's query socket."""
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = runtime.Client(self.endpoint, self.ctx, sender="searcher")
        return client

    def _ask(self, text: str, timeout_ms: int) -> tuple[np.ndarray | None, str, str]:
        try:
            reply = self._client().request(EmbedQueryRequest(text=text), timeout_ms=timeout_ms)
        except ProtocolError as exc:
            return None, "", DEGRADED_EMBEDDER_SLOW if exc.code.value == "timeout" else DEGRADED_EMBEDDER_DOWN
        if not reply.blobs:
            return None, "", DEGRADED_EMBEDDER_DOWN
        vec = np.frombuffer(reply.blobs[0], dtype=np.float32)
        if vec.shape[0] != reply.body.dim:
            return None, "", DEGRADED_EMBEDDER_DOWN
        return vec, reply.body.model_id, ""

    def vectors_first(self, workspace: str, paths: list[str], timeout_ms: int = VECTORS_FIRST_TIMEOUT_MS) -> int | None:
        """Ask the embedder to embed *paths* before the other files that wait; how many of them
        wait there, or None when it did not answer."""
        try:
            return int(self._client().request(VectorsFirstRequest(workspace=workspace, paths=paths), timeout_ms=timeout_ms).body.waiting)
        except ProtocolError:
            return None


class Searcher(runtime.Service):
    name = "searcher"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.registry = Registry(settings.data_dir)
        self.stores: dict[str, IndexStore] = {}
        self.lock = threading.Lock()
        configure_caches(settings.lance_index_cache_mb, settings.lance_metadata_cache_mb)
        self.embedder = QueryEmbedder(settings.endpoint("embedder.query"), self.ctx)
        # one thread, so a question never waits on the embedder's answer to vectors_first; while one
        # ask is in flight the next question's is dropped (it asks again), so a stalled embedder
        # never builds a backlog
        self.first_pool = ThreadPoolExecutor(1, thread_name_prefix="vectors-first")
        self.first_in_flight = threading.Lock()

    def store_for(self, wid: str) -> IndexStore | None:
        with self.lock:
            store = self.stores.get(wid)
            if store is not None and not store.folder.is_dir():
                store = self.stores.pop(wid)  # rebuilt or deleted under us
                store = None
            if store is None:
                store = IndexStore.open_reader(index_dir(self.s.data_dir, wid))
                if store is not None:
                    self.stores[wid] = store
                    store.document_frequencies()  # starts the term count a long question's keyword query uses
            return store

    def forget_removed(self, registered: Mapping[str, Any]) -> None:
        """Close the tables of workspaces no longer registered, so a removed one holds no memory."""
        with self.lock:
            for wid in [w for w in self.stores if w not in registered]:
                del self.stores[wid]

    def status(self) -> dict[str, Any]:
        """The tables open now (those of removed workspaces are closed first), LanceDB's cache use and Arrow's pool."""
        self.forget_removed(self.registry.load())
        return {"open_tables": list(self.stores), "lance_cache": cache_usage(), "arrow": arrow_memory()}

    def search(self, msg: envelope.Message) -> SearchReply:
        req = msg.body
        started = time.perf_counter()
        entries = self.registry.load()
        self.forget_removed(entries)
        if req.workspace not in entries:
            raise UnknownWorkspace(f"unknown workspace {req.workspace!r}")
        timings: dict[str, float] = {}
        store = self.store_for(req.workspace)
        t0 = time.perf_counter()
        counts = store.document_frequencies() if store is not None else None  # None at first: counted in the background
        try:
            s = with_overrides(self.s, req.overrides, "search_request.overrides")
        except ValueError as exc:
            raise BadMessage(str(exc)) from None
        qplan = plan_for(req.question, s, counts[0] if counts else None)
        timings["analyse"] = round((time.perf_counter() - t0) * 1000, 2)
        keyword_query = qplan.keyword_query
        if store is None:
            return SearchReply(keyword_query=keyword_query, candidates=[], degraded=["index not built yet"], index={"rows": 0})
        t0 = time.perf_counter()
        kept = self.embedder.holds(qplan.dense_texts)
        vector, model_id, problem = self.embed_plan(qplan, req.embed_timeout_ms)
        timings["embed"] = round((time.perf_counter() - t0) * 1000, 2)
        meta = store.meta
        if vector is not None and model_id != meta.get("model_id"):
            self.embedder.forget(qplan.dense_texts)
            if kept:  # a kept vector may be the old model's: ask the embedder once more
                vector, model_id, problem = self.embed_plan(qplan, req.embed_timeout_ms)
            if vector is not None and model_id != meta.get("model_id"):
                vector, problem = None, DEGRADED_REBUILD
        degraded = [problem] if problem else []
        first = self._focus_vectors_first(store, req)
        try:
            result = self._run(store, vector, req, qplan, s)
        except (OSError, ValueError, RuntimeError) as exc:
            # The table changed under us (compaction, rebuild): reopen once and retry.
            self.log.warning("search_retry", error=str(exc))
            with self.lock:
                self.stores.pop(req.workspace, None)
            store = self.store_for(req.workspace)
            if store is None:
                return SearchReply(keyword_query=keyword_query, candidates=[], degraded=["index not built yet"])
            result = self._run(store, vector, req, qplan, s)
        timings.update(result.timings_ms)
        candidates = to_candidates(result.candidates)
        timings["total"] = round((time.perf_counter() - started) * 1000, 2)
        self.stats.incr("searches")
        if degraded:
            self.stats.incr("searches.keywords_only")
        return SearchReply(
            keyword_query=keyword_query, candidates=candidates, degraded=degraded, timings_ms=timings,
            index={"model_id": meta.get("model_id"), "list_sizes": {k: len(v) for k, v in result.lists.items()},
                   "roles_missing": self.roles_missing(store, qplan), "focus_vectors_first": first},
        )

    def _focus_vectors_first(self, store: IndexStore, req: Any) -> int:
        """The question's focus files that still wait for their vectors, which the embedder is asked
        (in the background) to embed before the rest: the file a user is editing gets its vectors
        first on a workspace still being built."""
        try:
            waiting = store.pending_paths(list(req.focus_paths))
        except (OSError, ValueError, RuntimeError) as exc:  # the table changed under us: the search retries
            self.log.warning("pending_paths_failed", error=str(exc))
            return 0
        if waiting and self.first_in_flight.acquire(blocking=False):
            self.first_pool.submit(self._ask_vectors_first, req.workspace, waiting)
        return len(waiting)

    def _ask_vectors_first(self, wid: str, paths: list[str]) -> None:
        try:
            waiting = self.embedder.vectors_first(wid, paths)
        finally:
            self.first_in_flight.release()
        self.stats.incr("focus.vectors_first")
        self.log.info("vectors_first_asked", workspace=wid, paths=paths[:5], waiting=waiting)

    def roles_missing(self, store: IndexStore, qplan: QueryPlan) -> list[str]:
        """The kinds of file (test, doc, config) the question asks for that the index has none of."""
        wanted = wanted_roles(qplan.role_text)
        present = roles_present(store.paths()) if wanted else frozenset()
        return [role for role in wanted if role not in present]

    def embed_plan(self, qplan: QueryPlan, timeout_ms: int) -> tuple[np.ndarray | None, str, str]:
        """The question's query vector (or one row per text for ``dense_query = max``), within
        *timeout_ms* in all; ``(None, "", problem)`` when any text fails."""
        deadline = time.monotonic() + timeout_ms / 1000
        vectors, model_id = [], ""
        for text in qplan.dense_texts:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return None, "", DEGRADED_EMBEDDER_SLOW
            vec, model_id, problem = self.embedder.embed(text, left)
            if vec is None:
                return None, "", problem
            vectors.append(vec)
        return combine_vectors(np.stack(vectors), qplan.dense), model_id, ""

    def _run(self, store: IndexStore, vector: np.ndarray | None, req: Any, qplan: QueryPlan, s: Settings):
        return settings_search(store, qplan, vector, req.focus_paths, s)

    def run(self) -> None:
        runtime.prepare_runtime_dir(self.s.runtime_dir)
        runtime.install_signal_handlers(self.stop, self.log)
        sock = runtime.make_socket(self.ctx, zmq.ROUTER)
        runtime.bind(sock, self.s.endpoint("searcher"))
        control = runtime.ControlServer(self.ctx, self.s.control_endpoint("searcher"), "searcher", self.log, self.stats, self.stop,
                                        status_fn=self.status)
        control.start()
        self.log.info("started")
        runtime.serve_threaded(self.ctx, sock, {"search_request": self.search}, self.log, "searcher", self.stats, self.stop, workers=4)
        sock.close(0)
        self.first_pool.shutdown(wait=False, cancel_futures=True)
        control.join(timeout=2)
        self.log.info("stopped")


def main() -> None:
    runtime.run_daemon(Searcher)
