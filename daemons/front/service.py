"""The front: the only socket editors see. It turns an ``ask_request`` into labelled context.

Every question has a time budget (``question_deadline_ms``, or its own ``settings.deadline_ms``)
counted from its receipt: the embedding gets a share of it, the reranker what is left (and refuses
at once what its queue cannot meet), widening and the team fronts are skipped when it is spent,
and each skip is named in ``degraded`` and the context line (``daemons.lib.deadline``).

Steps (each timed in ``AskReply.stages``): follow-up rule and focus files -> searcher (fused top
12) and, at the same time, the team fronts -> reranker (probabilities; fused order if it is
unavailable) -> threshold and near misses -> widening (from the editor's buffer when sent) ->
merging, imports, snippet count, character budget -> labels, prompt text, context line.
A question is always answered: a searcher that is down is replaced by an in-process keyword
search, a reranker that is down by the fused order, and each degraded mode is named.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from daemons.lib import assembly, deadline, notes, pipeline, runtime
from daemons.lib.assembly import Hit
from daemons.lib.chunking import language_for_path
from daemons.lib.config import Settings, question_settings_problem, with_overrides
from daemons.lib.conversation import Conversations
from daemons.lib.focus import focus_files
from daemons.lib.indexing import chunk_content_hash
from daemons.lib.question import QueryPlan, plan_for
from daemons.lib.security import INSECURE_WARNING, curve_client_keys, granted, key_names, parse_grants, secure_server_socket
from daemons.lib.workspaces import Registry, check_request_path, index_dir, read_inside, safe_relpath
from models.cross_encoder import rerank_passage
from protocol import envelope
from protocol.errors import BadMessage, ErrorCode, ProtocolError, UnknownWorkspace
from protocol.schema import (
    AskReply,
    AskRequest,
    Block,
    Candidate,
    NearMiss,
    RerankRequest,
    SearchRequest,
    Stage,
    StatusRequest,
)

DEGRADED_SEARCHER_DOWN = "keywords only (searcher unavailable: searched in the front)"
MAX_BUFFERS_CHARS = 8_000_000
#: The longest question answered, in characters: a long issue with its traceback is a few thousand
#: (the longest SWE-bench Lite issue is 25,000). Longer ones get bad_message at once, before any
#: work, so that the reply (which repeats the question in ``searched_query`` and ``prompt``) stays
#: far under the message cap.
MAX_QUESTION_CHARS = 100_000
#: Threads answering questions: they mostly wait on the searcher and the reranker, and a question
#: waiting for a thread is already spending its budget.
FRONT_THREADS = 16


@dataclass
class _Question:
    """One question on its way through the stages: what was asked, where, and what happened so far."""

    req: AskRequest
    s: Settings  # the daemons' settings with the question's overrides
    budget: deadline.Budget
    wid: str
    root: str
    buffers: dict[str | None, str]
    searched: str  # the question after the follow-up rule
    follow_up: bool
    previous_files: list[str]
    focus: list[str]
    qplan: QueryPlan
    stages: list[Stage] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)

    def stage(self, name: str, t0: float, **detail: Any) -> None:
        self.stages.append(Stage(name=name, ms=round((time.perf_counter() - t0) * 1000, 2), detail=detail))


class Front(runtime.Service):
    name = "front"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.registry = Registry(settings.data_dir)
        #: whether LanceDB was loaded, for a search of its own while the searcher is down
        self.tables_loaded = False
        self.tables_lock = threading.Lock()
        self.conversations = Conversations()
        self.local = threading.local()
        self.team_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="team")
        #: the authorised client keys' names by public key, read when the tcp front starts, as the
        #: authenticator reads the keys themselves (a key added later needs a restart either way)
        self.client_keys: dict[bytes, str] = {}

    # ------------------------------------------------------------------ peers

    def _client(self, name: str, endpoint: str, curve: dict[str, bytes] | None = None) -> runtime.Client:
        clients = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {}
        if name not in clients:
            clients[name] = runtime.Client(endpoint, self.ctx, sender="front", curve=curve)
        return clients[name]

    def _index_progress(self, wid: str) -> dict[str, Any]:
        try:
            reply = self._client("watcher.ctl", self.s.control_endpoint("watcher")).request(StatusRequest(), timeout_ms=300)
        except ProtocolError:
            return {}
        return dict(reply.body.details.get("workspaces", {}).get(wid, {}))

    # ------------------------------------------------------------------ the question

    def _resolve(self, req: AskRequest) -> tuple[str, str]:
        check_paths(req)
        ref = req.workspace or (req.active_file or "")
        if not ref and (req.visible_files or req.open_documents):
            ref = (req.visible_files or req.open_documents)[0]
        return self.registry.resolve(ref)

    def _rel(self, root: str, path: str | None) -> str | None:
        if not path:
            return None
        return safe_relpath(root, path)

    def ask(self, msg: envelope.Message) -> AskReply:
        """Answer one question: prepare, search, rerank, order, widen, team, assemble (module doc)."""
        t_start = time.perf_counter()
        q = self._prepare(msg.body)
        team_futures = [(spec, self.team_pool.submit(self._ask_team, spec, q.searched))
                        for spec in (self.s.team_fronts if q.req.include_team else [])]
        candidates, keyword_query, roles_missing = self._search(q)
        probs = self._rerank(q, candidates)
        threshold = q.req.settings.threshold if q.req.settings.threshold is not None else self.s.rerank_threshold
        ordered = pipeline.order(candidates, probs, q.s, threshold, long=q.qplan.long)

        t0 = time.perf_counter()
        texts: dict[str, str] = {}
        changes: dict[str, str] = {}  # path -> how it differs from the indexed version (freshness)
        widen_files = not q.budget.spent()
        if ordered.kept and not widen_files:
            q.degraded.append(deadline.SKIPPED_WIDEN)
        for cand, _ in ordered.kept:
            if widen_files and cand.path not in changes:
                changes[cand.path] = self._file_change(q.root, cand, q.buffers)

        def text_of(path: str) -> str | None:
            return self._file_text(q.root, path, q.buffers, texts) if widen_files else None

        hits = pipeline.widen_hits(ordered, text_of, language_for_path, self.s.widen_max_chars)
        q.stage("widen", t0, hits=len(hits), from_buffer=[p for p in texts if p in q.buffers])
        team_hits = self._team(q, team_futures)

        t0 = time.perf_counter()
        snippets = q.req.settings.snippet_count if q.req.settings.snippet_count is not None else self.s.snippet_count
        budget_chars = q.req.settings.budget_chars if q.req.settings.budget_chars is not None else self.s.budget_chars
        blocks = pipeline.assemble(hits, team_hits, texts, {h.path: h.language for h in hits}, self.s, snippets, budget_chars)
        reply = self._reply(q, blocks, candidates, ordered, changes, roles_missing, keyword_query)
        q.stage("assemble", t0, blocks=len(reply.blocks), chars=sum(len(b.text) for b in reply.blocks))

        self.conversations.remember(q.req.conversation_id, q.searched, sorted({b.path for b in blocks if not b.team}))
        q.stages.append(Stage(name="total", ms=round((time.perf_counter() - t_start) * 1000, 2)))
        reply.stages = q.stages
        self.stats.incr("questions")
        if q.degraded:
            self.stats.incr("questions.degraded")
        return reply

    def _prepare(self, req: AskRequest) -> _Question:
        """Check the request, resolve its workspace and files, apply the follow-up rule and plan the searches."""
        received = runtime.received_at() or time.monotonic()
        now = time.monotonic()
        if len(req.question) > MAX_QUESTION_CHARS:
            raise BadMessage(f"question is {len(req.question)} characters; the limit is {MAX_QUESTION_CHARS}")
        if not req.question.strip():
            raise BadMessage("empty question")
        if sum(len(v) for v in req.buffers.values()) > MAX_BUFFERS_CHARS:
            raise BadMessage(f"buffers exceed {MAX_BUFFERS_CHARS} characters")
        _, problem = question_settings_problem(req.settings.threshold, req.settings.snippet_count, req.settings.budget_chars,
                                               req.settings.deadline_ms)
        if problem:
            raise BadMessage(problem)
        try:
            s = with_overrides(self.s, req.settings.overrides, "settings.overrides")
        except ValueError as exc:
            raise BadMessage(str(exc)) from None
        budget = deadline.Budget(req.settings.deadline_ms if req.settings.deadline_ms is not None else self.s.question_deadline_ms,
                                 started=received)
        t0 = time.perf_counter()
        wid, root = self._resolve(req)
        # Every field that names a file must stay inside the workspace.
        active = self._rel(root, req.active_file)
        visible = [self._rel(root, p) for p in req.visible_files]
        open_docs = [self._rel(root, p) for p in req.open_documents]
        buffers = {self._rel(root, p): text for p, text in req.buffers.items()}
        searched, follow_up = self.conversations.effective_question(req.conversation_id, req.question, MAX_QUESTION_CHARS)
        previous_files = self.conversations.previous_files(req.conversation_id)
        focus = focus_files(active, visible, previous_files, open_docs, limit=self.s.focus_files)
        q = _Question(req=req, s=s, budget=budget, wid=wid, root=root, buffers=buffers, searched=searched, follow_up=follow_up,
                      previous_files=previous_files, focus=focus, qplan=plan_for(searched, s))
        q.stage("prepare", t0, workspace=wid, follow_up=follow_up, focus=focus, deadline_ms=budget.total_ms,
                queued_ms=round((now - received) * 1000, 2),
                **({"question": q.qplan.analysis.account()} if q.qplan.analysis is not None else {}))
        return q

    def _search(self, q: _Question) -> tuple[list[Candidate], str, list[str]]:
        """The searcher's fused candidates, keyword query and the kinds of file the index lacks; an
        in-process keyword search when the searcher is down."""
        t0 = time.perf_counter()
        s = q.s
        try:
            sr = self._client("searcher", self.s.endpoint("searcher")).request(
                SearchRequest(
                    workspace=q.wid, question=q.searched, focus_paths=q.focus,
                    embed_timeout_ms=q.budget.embed_timeout_ms(self.s.embed_timeout_ms), overrides=q.req.settings.overrides,
                ),
                timeout_ms=self.s.embed_timeout_ms + 5000,
            ).body
        except ProtocolError as exc:
            self.log.warning("searcher_unavailable", error=exc.message)
            candidates, keyword_query = self._local_search(q.wid, q.qplan, q.focus, s)
            q.degraded.append(DEGRADED_SEARCHER_DOWN)
            q.stage("search", t0, candidates=len(candidates), **_search_detail(q))
            return candidates, keyword_query, []
        q.degraded += sr.degraded
        q.stage("search", t0, candidates=len(sr.candidates), timings_ms=sr.timings_ms, **_search_detail(q), **sr.index)
        return sr.candidates, sr.keyword_query, list(sr.index.get("roles_missing") or [])

    def _rerank(self, q: _Question, candidates: list[Candidate]) -> list[float] | None:
        """The cross-encoder's probabilities, or None (reranking off, skipped for the deadline, or
        failed: the fused order stands, and the reason is in ``degraded``)."""
        t0 = time.perf_counter()
        probs: list[float] | None = None
        detail: dict[str, Any] = {}
        rerank_ms = q.budget.rerank_ms()
        if candidates and q.req.settings.rerank and rerank_ms == 0:
            q.degraded.append(deadline.SKIPPED_RERANK)
            detail = {"skipped": "question deadline", "left_ms": round(q.budget.left_ms() or 0.0, 1)}
        elif candidates and q.req.settings.rerank:
            try:
                timeout = self.s.reranker_timeout_ms if rerank_ms is None else min(self.s.reranker_timeout_ms, rerank_ms)
                rr = self._client("reranker", self.s.endpoint("reranker")).request(
                    RerankRequest(query=q.qplan.rerank_query, passages=[rerank_passage(c.path, c.text) for c in candidates],
                                  deadline_ms=rerank_ms),
                    timeout_ms=timeout + 1000,
                ).body
                probs = list(rr.scores)
                # the final order's rank constant and cross-encoder weight, a long question's or a short one's
                detail = {"model_id": rr.model_id, "workers": rr.workers, "cached": rr.cached, "timings_ms": rr.timings_ms,
                          "blend": list(pipeline.blend(q.s, q.qplan.long)), **({"deadline_ms": rerank_ms} if rerank_ms is not None else {})}
            except ProtocolError as exc:
                if rerank_ms is not None and exc.code == ErrorCode.TIMEOUT:
                    q.degraded.append(deadline.REFUSED_RERANK if exc.message.startswith(deadline.BUSY_PREFIX) else deadline.LATE_RERANK)
                else:
                    q.degraded.append(assembly.DEGRADED_FUSED_ORDER)
                detail = {"error": exc.code.value, "message": exc.message}
        elif candidates:
            q.degraded.append("fused order (reranking switched off)")
        q.stage("rerank", t0, reranked=len(candidates) if probs is not None else 0, **detail)
        return probs

    def _team(self, q: _Question, futures: list[tuple[str, Any]]) -> list[Hit]:
        """The team fronts' blocks as hits, each waited for only as long as the deadline allows."""
        t0 = time.perf_counter()
        team_hits: list[Hit] = []
        for spec, fut in futures:
            left = q.budget.left_ms(deadline.RESERVE_MS)
            try:
                wait_ms = self.s.team_timeout_ms if left is None else max(0.0, min(self.s.team_timeout_ms, left))
                team_hits += fut.result(timeout=wait_ms / 1000)
            except Exception as exc:  # noqa: BLE001 - a team index that fails only loses its hits
                late = left is not None and left < self.s.team_timeout_ms
                q.degraded.append(f"team index {spec.split('#')[0]} " + ("not back in time (question deadline)" if late else "unavailable"))
                self.log.warning("team_failed", team=spec, error=str(exc))
        if futures:
            q.stage("team", t0, hits=len(team_hits))
        return team_hits

    def _reply(self, q: _Question, blocks: list[assembly.Block], candidates: list[Candidate], ordered: pipeline.Ordered,
               changes: dict[str, str], roles_missing: list[str], keyword_query: str) -> AskReply:
        """The reply: labelled blocks, near misses, the prompt and the context line."""
        reranked = ordered.reranked
        out_blocks = [
            Block(label=assembly.label(b), path=b.path, start_line=b.start_line, end_line=b.end_line, text=b.text,
                  probability=(round(b.score, 4) if reranked or b.team else None) if b.kind == assembly.CODE else None,
                  retrievers=list(b.retrievers), team=b.team_name if b.team else None, kind=b.kind,
                  changed="" if b.team else changes.get(b.path, ""))
            for b in blocks
        ]
        progress = self._index_progress(q.wid)
        q.degraded += notes.progress_notes(progress)
        own = [b for b in blocks if b.kind == assembly.CODE and not b.team]
        kept_labels = [(assembly.label(b), b.score if reranked else None) for b in own]
        near_labels = [(assembly.span_label(c.path, c.start_line, c.end_line), p) for c, p in ordered.near]
        line_notes = pipeline.notes(candidates, q.s, focus=q.focus, changes=[changes.get(b.path, "") for b in own],
                               roles_missing=roles_missing, follow_up=q.follow_up, previous_files=q.previous_files,
                               answered_files=[b.path for b in own])
        line = assembly.context_line(q.searched, len(candidates) if reranked else 0, kept_labels, near_labels, q.degraded, notes=line_notes)
        return AskReply(
            searched_query=q.searched, keyword_query=keyword_query, blocks=out_blocks,
            near_misses=[NearMiss(label=lab, path=c.path, start_line=c.start_line, end_line=c.end_line, probability=round(p, 4))
                         for (c, p), (lab, _) in zip(ordered.near, near_labels)],
            prompt=assembly.prompt_text(q.req.question, blocks), context_line=line, degraded=q.degraded, stages=q.stages,
            index={"workspace": q.wid, **progress},
        )

    def _file_text(self, root: str, path: str, buffers: dict[str | None, str], cache: dict[str, str]) -> str | None:
        if path in cache:
            return cache[path]
        text = buffers.get(path)
        if text is None:
            try:
                text = read_inside(root, safe_relpath(root, path)).decode("utf-8")
            except (OSError, UnicodeDecodeError, BadMessage):
                return None
        cache[path] = text
        return text

    def _file_change(self, root: str, cand: Candidate, buffers: dict[str | None, str]) -> str:
        """How *cand*'s file differs from the version its chunk was indexed from (notes.file_change)."""
        indexed = chunk_content_hash(cand.chunk_id)
        if not indexed:
            return ""
        try:
            data: bytes | None = read_inside(root, safe_relpath(root, cand.path))
        except (OSError, BadMessage):
            data = None
        return notes.file_change(indexed, data, buffers.get(cand.path))

    def _local_search(self, wid: str, qplan: QueryPlan, focus: list[str], s: Settings) -> tuple[list[Candidate], str]:
        """Keywords-only search in this process (the searcher is down), with the question's plan
        made again with the workspace's term counts when the table has them.

        LanceDB and pyarrow (about 90 MB resident) are loaded here, on the first such search: while
        the searcher answers, the front never holds them."""
        from daemons.lib.search import settings_search, to_candidates
        from daemons.lib.store import IndexStore, configure_caches

        with self.tables_lock:
            if not self.tables_loaded:
                configure_caches(self.s.lance_index_cache_mb, self.s.lance_metadata_cache_mb)
                self.tables_loaded = True
        store = IndexStore.open_reader(index_dir(self.s.data_dir, wid))
        if store is None:
            return [], qplan.keyword_query
        counts = store.document_frequencies(wait=True)
        if counts:
            qplan = plan_for(qplan.question, s, counts[0])
        result = settings_search(store, qplan, None, focus, s)
        return to_candidates(result.candidates), qplan.keyword_query

    def ask_tcp(self, msg: envelope.Message) -> AskReply:
        """``ask`` for a client on the tcp front: only of a workspace its key is granted
        (``team_workspaces``); any other gets unknown_workspace, as one that does not exist."""
        if self.s.curve_secret_key_file:
            wid, _ = self._resolve(msg.body)
            user = runtime.peer_id()
            name = self.client_keys.get(user.encode()) if user else None
            if wid not in self._granted_ids(name):
                self.stats.incr("tcp.refused_workspace")
                self.log.warning("workspace_not_granted", key=name, workspace=wid)
                raise UnknownWorkspace(f"workspace {msg.body.workspace or wid!r} is not shared with this key "
                                       "(the team front's team_workspaces grants it)")
        return self.ask(msg)

    def _granted_ids(self, key_name: str | None) -> set[str]:
        """The registered workspace ids that client *key_name* may ask."""
        ids = set()
        for ref in granted(parse_grants(self.s.team_workspaces), key_name):
            try:
                ids.add(self.registry.resolve(ref)[0])
            except UnknownWorkspace:
                continue
        return ids

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"team_fronts": self.s.team_fronts, "tcp": self.s.front_tcp, "tables_loaded": self.tables_loaded}
        if self.s.front_tcp and not self.s.curve_secret_key_file:
            out.update(tcp_insecure=True, warning=INSECURE_WARNING)
        if self.tables_loaded:
            from daemons.lib.store import arrow_memory, cache_usage
            out.update(lance_cache=cache_usage(), arrow=arrow_memory())
        return out

    def _ask_team(self, spec: str, question: str) -> list[Hit]:
        """Ask a team front (``tcp://host:port[#workspace]``); its blocks come back as team hits."""
        endpoint, _, workspace = spec.partition("#")
        curve = curve_client_keys(self.s) if endpoint.startswith("tcp://") else None
        client = runtime.Client(endpoint, self.ctx, sender="front-team", curve=curve)
        try:
            reply = client.request(AskRequest(question=question, workspace=workspace, include_team=False), timeout_ms=self.s.team_timeout_ms).body
        finally:
            client.close()
        name = endpoint.removeprefix("tcp://")
        return [
            Hit(path=b.path, start_line=b.start_line, end_line=b.end_line, text=b.text, score=b.probability or 0.0,
                retrievers=b.retrievers, team=True, team_name=name)
            for b in reply.blocks if b.kind == assembly.CODE
        ]

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        runtime.prepare_runtime_dir(self.s.runtime_dir)
        runtime.install_signal_handlers(self.stop, self.log)
        sock = runtime.make_socket(self.ctx, zmq.ROUTER)
        runtime.bind(sock, self.s.endpoint("front"))
        tcp_sock = None
        authenticator = None
        if self.s.front_tcp:
            tcp_sock = runtime.make_socket(self.ctx, zmq.ROUTER)
            try:
                authenticator = secure_server_socket(self.ctx, tcp_sock, self.s)
                if authenticator is not None:
                    self.client_keys = key_names(self.s.curve_authorized_keys_dir)
                tcp_sock.bind(self.s.front_tcp)
            except (ValueError, OSError, zmq.ZMQError) as exc:
                self.log.error("tcp_refused", endpoint=self.s.front_tcp, error=str(exc))
                sock.close(0)
                raise SystemExit(f"front: {exc}") from None
        control = runtime.ControlServer(self.ctx, self.s.control_endpoint("front"), "front", self.log, self.stats, self.stop,
                                        status_fn=self.status)
        control.start()
        handlers = {"ask_request": self.ask}
        threads = []
        if tcp_sock is not None:
            if authenticator is None:
                self.log.warning("tcp_insecure", endpoint=self.s.front_tcp, warning=INSECURE_WARNING)
            t = threading.Thread(target=runtime.serve_threaded, args=(self.ctx, tcp_sock, {"ask_request": self.ask_tcp}, self.log, "front",
                                                                     self.stats, self.stop, 2, True), daemon=True)
            t.start()
            threads.append(t)
        self.log.info("started", tcp=self.s.front_tcp or None)
        runtime.serve_threaded(self.ctx, sock, handlers, self.log, "front", self.stats, self.stop, workers=FRONT_THREADS)
        for t in threads:
            t.join(timeout=2)
        if authenticator is not None:
            authenticator.stop()
        sock.close(0)
        control.join(timeout=2)
        self.log.info("stopped")


def check_paths(req: AskRequest) -> None:
    """BadMessage for any path field of *req* that no file can have (``check_request_path``)."""
    check_request_path("workspace", req.workspace)
    if req.active_file:
        check_request_path("active_file", req.active_file)
    for name, paths in (("visible_files", req.visible_files), ("open_documents", req.open_documents), ("buffers", list(req.buffers))):
        for path in paths:
            check_request_path(name, path)


def _search_detail(q: _Question) -> dict[str, Any]:
    """What the search stage says of the question's own ranking: each list's vote (a traceback
    question's own for the file-ranked lists) and how many candidates it may take to the
    cross-encoder (a long question's more)."""
    s = q.s
    return {"list_weights": s.list_weights(traceback=q.qplan.traceback), "rerank_top": s.rerank_top_for(q.qplan.long, q.qplan.traceback)}


def main() -> None:
    runtime.run_daemon(Front)
