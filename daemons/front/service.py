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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import zmq

from daemons.lib import assembly, deadline, echoes, runtime
from daemons.lib.assembly import Hit
from daemons.lib.chunking import language_for_path
from daemons.lib.config import Settings, load_settings, question_settings_problem, with_overrides
from daemons.lib.conversation import Conversations
from daemons.lib.focus import focus_files
from daemons.lib.indexing import chunk_content_hash
from daemons.lib.fusion import rerank_order
from daemons.lib.question import QueryPlan, plan_for
from daemons.lib.log import configure
from daemons.lib.search import settings_search, to_candidates
from daemons.lib.security import curve_client_keys, secure_server_socket
from daemons.lib.store import IndexStore, cache_usage, configure_caches
from daemons.lib.widening import lines_text, split_lines, widen
from daemons.lib.workspaces import Registry, index_dir, safe_relpath
from models.cross_encoder import rerank_passage
from protocol import envelope
from protocol.errors import BadMessage, ErrorCode, ProtocolError
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


class Front:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.log = configure("front")
        self.ctx = zmq.Context.instance()
        self.stats = runtime.Stats()
        self.stop = threading.Event()
        self.registry = Registry(settings.data_dir)
        configure_caches(settings.lance_index_cache_mb, settings.lance_metadata_cache_mb)
        self.conversations = Conversations()
        self.local = threading.local()
        self.team_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="team")

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
        ref = req.workspace or (req.active_file or "")
        if not ref and (req.visible_files or req.open_documents):
            ref = (req.visible_files or req.open_documents)[0]
        return self.registry.resolve(ref)

    def _rel(self, root: str, path: str | None) -> str | None:
        if not path:
            return None
        return safe_relpath(root, path)

    def ask(self, msg: envelope.Message) -> AskReply:
        req: AskRequest = msg.body
        t_start = time.perf_counter()
        now = time.monotonic()
        received = runtime.received_at() or now
        stages: list[Stage] = []

        def stage(name: str, t0: float, **detail: Any) -> None:
            stages.append(Stage(name=name, ms=round((time.perf_counter() - t0) * 1000, 2), detail=detail))

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
        searched, follow_up = self.conversations.effective_question(req.conversation_id, req.question)
        previous_files = self.conversations.previous_files(req.conversation_id)
        focus = focus_files(active, visible, previous_files, open_docs, limit=self.s.focus_files)
        qplan = plan_for(searched, s)
        stage("prepare", t0, workspace=wid, follow_up=follow_up, focus=focus, deadline_ms=budget.total_ms,
              queued_ms=round((now - received) * 1000, 2),
              **({"question": qplan.analysis.account()} if qplan.analysis is not None else {}))

        threshold = req.settings.threshold if req.settings.threshold is not None else self.s.rerank_threshold
        snippets = req.settings.snippet_count if req.settings.snippet_count is not None else self.s.snippet_count
        budget_chars = req.settings.budget_chars if req.settings.budget_chars is not None else self.s.budget_chars

        team_futures = []
        if req.include_team and self.s.team_fronts:
            for spec in self.s.team_fronts:
                team_futures.append((spec, self.team_pool.submit(self._ask_team, spec, searched)))

        # --- search
        t0 = time.perf_counter()
        degraded: list[str] = []
        search_detail: dict[str, Any] = {}
        roles_missing: list[str] = []
        try:
            reply = self._client("searcher", self.s.endpoint("searcher")).request(
                SearchRequest(
                    workspace=wid, question=searched, focus_paths=focus, vector_k=s.vector_k,
                    keyword_k=s.keyword_k, focus_k=s.focus_k, top_n=s.rerank_top,
                    embed_timeout_ms=budget.embed_timeout_ms(self.s.embed_timeout_ms), overrides=req.settings.overrides,
                ),
                timeout_ms=self.s.embed_timeout_ms + 5000,
            )
            sr = reply.body
            candidates, keyword_query = sr.candidates, sr.keyword_query
            degraded += sr.degraded
            search_detail = {"timings_ms": sr.timings_ms, **sr.index}
            roles_missing = list(sr.index.get("roles_missing") or [])
        except ProtocolError as exc:
            self.log.warning("searcher_unavailable", error=exc.message)
            candidates, keyword_query = self._local_search(wid, qplan, focus, s)
            degraded.append(DEGRADED_SEARCHER_DOWN)
        stage("search", t0, candidates=len(candidates), **search_detail)

        # --- rerank
        t0 = time.perf_counter()
        probs: list[float] | None = None
        rerank_detail: dict[str, Any] = {}
        rerank_ms = budget.rerank_ms()
        if candidates and req.settings.rerank and rerank_ms == 0:
            degraded.append(deadline.SKIPPED_RERANK)
            rerank_detail = {"skipped": "question deadline", "left_ms": round(budget.left_ms() or 0.0, 1)}
        elif candidates and req.settings.rerank:
            try:
                rr = self._client("reranker", self.s.endpoint("reranker")).request(
                    RerankRequest(query=qplan.rerank_query, passages=[rerank_passage(c.path, c.text) for c in candidates],
                                  deadline_ms=rerank_ms),
                    timeout_ms=(self.s.reranker_timeout_ms if rerank_ms is None else min(self.s.reranker_timeout_ms, rerank_ms)) + 1000,
                ).body
                probs = list(rr.scores)
                rerank_detail = {"model_id": rr.model_id, "workers": rr.workers, "cached": rr.cached, "timings_ms": rr.timings_ms,
                                 **({"deadline_ms": rerank_ms} if rerank_ms is not None else {})}
            except ProtocolError as exc:
                if rerank_ms is not None and exc.code == ErrorCode.TIMEOUT:
                    degraded.append(deadline.REFUSED_RERANK if exc.message.startswith(deadline.BUSY_PREFIX) else deadline.LATE_RERANK)
                else:
                    degraded.append(assembly.DEGRADED_FUSED_ORDER)
                rerank_detail = {"error": exc.code.value, "message": exc.message}
        elif candidates:
            degraded.append("fused order (reranking switched off)")
        stage("rerank", t0, reranked=len(candidates) if probs is not None else 0, **rerank_detail)

        # --- threshold
        near: list[tuple[Candidate, float]] = []
        order_of: dict[int, float] = {}
        if probs is not None:
            named = assembly.named_positions([(c.path, c.ranks, p) for c, p in zip(candidates, probs)])
            kept, near = assembly.select_by_threshold(list(zip(candidates, probs)), threshold, self.s.near_misses, always=named)
            # keyed by position among all candidates, so a dropped one still holds its rank
            keys = rerank_order([c.path for c in candidates], [p * c.weight for c, p in zip(candidates, probs)],
                                s.rerank_fusion_k, s.rerank_fusion_weight)
            order_of = {id(c): key for c, key in zip(candidates, keys)}
        else:
            kept = [(c, c.fused_score) for c in candidates]

        # --- widen
        t0 = time.perf_counter()
        file_texts: dict[str, str] = {}
        languages: dict[str, str | None] = {}
        hits: list[Hit] = []
        widen_files = not budget.spent()
        if kept and not widen_files:
            degraded.append(deadline.SKIPPED_WIDEN)
        changes: dict[str, str] = {}  # path -> how it differs from the indexed version (freshness)
        for cand, score in kept:
            if widen_files and cand.path not in changes:
                changes[cand.path] = self._file_change(root, cand, buffers)
            text = self._file_text(root, cand.path, buffers, file_texts) if widen_files else None
            language = language_for_path(cand.path)
            languages[cand.path] = language
            start, end = cand.start_line, cand.end_line
            if text is not None:
                start, end = widen(text, language, start, end, self.s.widen_max_chars)
                body = lines_text(split_lines(text), start, end)
            else:
                body = cand.text
            # a fused score already carries the role weight; a probability gets it for the order only
            hits.append(Hit(path=cand.path, start_line=start, end_line=end, text=body, score=score,
                            retrievers=sorted(cand.ranks), language=language,
                            weight=cand.weight if probs is not None else 1.0, order=order_of.get(id(cand))))
        stage("widen", t0, hits=len(hits), from_buffer=[p for p in file_texts if p in buffers])

        # --- team
        t0 = time.perf_counter()
        team_hits: list[Hit] = []
        for spec, fut in team_futures:
            left = budget.left_ms(deadline.RESERVE_MS)
            try:
                wait_ms = self.s.team_timeout_ms if left is None else max(0.0, min(self.s.team_timeout_ms, left))
                team_hits += fut.result(timeout=wait_ms / 1000)
            except Exception as exc:  # noqa: BLE001 - a team index that fails only loses its hits
                late = left is not None and left < self.s.team_timeout_ms
                degraded.append(f"team index {spec.split('#')[0]} " + ("not back in time (question deadline)" if late else "unavailable"))
                self.log.warning("team_failed", team=spec, error=str(exc))
        if team_futures:
            stage("team", t0, hits=len(team_hits))

        # --- assemble
        t0 = time.perf_counter()
        blocks = assembly.merge_hits(hits, file_texts, self.s.block_max_chars)
        blocks = assembly.add_imports(blocks, file_texts, languages, self.s.imports_max_chars, self.s.block_max_chars)
        blocks += assembly.merge_hits(team_hits, {}, self.s.block_max_chars)
        blocks = assembly.budget(blocks, snippets, budget_chars)
        out_blocks = [
            Block(label=assembly.label(b), path=b.path, start_line=b.start_line, end_line=b.end_line, text=b.text,
                  probability=(round(b.score, 4) if probs is not None or b.team else None) if b.kind == assembly.CODE else None,
                  retrievers=list(b.retrievers), team=b.team_name if b.team else None, kind=b.kind,
                  changed="" if b.team else changes.get(b.path, ""))
            for b in blocks
        ]
        prompt = assembly.prompt_text(req.question, blocks)
        progress = self._index_progress(wid)
        degraded += assembly.progress_notes(progress)
        kept_labels = [(assembly.label(b), b.score if probs is not None else None) for b in blocks if b.kind == assembly.CODE and not b.team]
        near_labels = [(assembly.span_label(c.path, c.start_line, c.end_line), p) for c, p in near]
        key = echoes.copy_key(searched) if s.question_copy_weight < 1.0 else ""
        copies = {id(c) for c in candidates if echoes.quotes_question(c.text, key)}
        # a copy's weight holds the copy weight too; the roles' note wants its role weight alone
        weighted = assembly.weights_note((c.path, c.weight / s.question_copy_weight if id(c) in copies else c.weight)
                                         for c in candidates if id(c) not in copies or s.question_copy_weight > 0)
        notes = [f"weighted {weighted}"] if weighted else []
        notes.append(assembly.copies_note(len(copies), s.question_copy_weight))
        notes.append(assembly.named_note((c.path, c.ranks) for c in candidates))
        notes.append(assembly.focus_note(focus, ((c.path, c.ranks) for c in candidates)))
        notes.append(assembly.changed_note(changes.get(b.path, "") for b in blocks if b.kind == assembly.CODE and not b.team))
        notes.append(assembly.missing_roles_note(roles_missing))
        notes.append(assembly.nothing_new_note(follow_up, previous_files, [b.path for b in blocks if b.kind == assembly.CODE and not b.team]))
        line = assembly.context_line(searched, len(candidates) if probs is not None else 0, kept_labels, near_labels, degraded, notes=notes)
        stage("assemble", t0, blocks=len(out_blocks), chars=sum(len(b.text) for b in out_blocks))

        self.conversations.remember(req.conversation_id, searched, sorted({b.path for b in blocks if not b.team}))
        stages.append(Stage(name="total", ms=round((time.perf_counter() - t_start) * 1000, 2)))
        self.stats.incr("questions")
        if degraded:
            self.stats.incr("questions.degraded")
        return AskReply(
            searched_query=searched, keyword_query=keyword_query, blocks=out_blocks,
            near_misses=[NearMiss(label=lab, path=c.path, start_line=c.start_line, end_line=c.end_line, probability=round(p, 4))
                         for (c, p), (lab, _) in zip(near, near_labels)],
            prompt=prompt, context_line=line, degraded=degraded, stages=stages,
            index={"workspace": wid, **progress},
        )

    def _file_text(self, root: str, path: str, buffers: dict[str | None, str], cache: dict[str, str]) -> str | None:
        if path in cache:
            return cache[path]
        text = buffers.get(path)
        if text is None:
            try:
                full = Path(root) / safe_relpath(root, path)
                text = full.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError, BadMessage):
                return None
        cache[path] = text
        return text

    def _file_change(self, root: str, cand: Candidate, buffers: dict[str | None, str]) -> str:
        """How *cand*'s file differs from the version its chunk was indexed from (assembly.file_change)."""
        indexed = chunk_content_hash(cand.chunk_id)
        if not indexed:
            return ""
        try:
            data: bytes | None = (Path(root) / safe_relpath(root, cand.path)).read_bytes()
        except (OSError, BadMessage):
            data = None
        return assembly.file_change(indexed, data, buffers.get(cand.path))

    def _local_search(self, wid: str, qplan: QueryPlan, focus: list[str], s: Settings) -> tuple[list[Candidate], str]:
        """Keywords-only search in this process (the searcher is down), with the question's plan
        made again with the workspace's term counts when the table has them."""
        store = IndexStore.open_reader(index_dir(self.s.data_dir, wid))
        if store is None:
            return [], qplan.keyword_query
        counts = store.document_frequencies(wait=True)
        if counts:
            qplan = plan_for(qplan.question, s, counts[0])
        result = settings_search(store, qplan, None, focus, s)
        return to_candidates(result.candidates), qplan.keyword_query

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
                tcp_sock.bind(self.s.front_tcp)
            except (ValueError, OSError, zmq.ZMQError) as exc:
                self.log.error("tcp_refused", endpoint=self.s.front_tcp, error=str(exc))
                sock.close(0)
                raise SystemExit(f"front: {exc}") from None
        control = runtime.ControlServer(self.ctx, self.s.control_endpoint("front"), "front", self.log, self.stats, self.stop,
                                        status_fn=lambda: {"team_fronts": self.s.team_fronts, "tcp": self.s.front_tcp, "lance_cache": cache_usage()})
        control.start()
        handlers = {"ask_request": self.ask}
        threads = []
        if tcp_sock is not None:
            t = threading.Thread(target=runtime.serve_threaded, args=(self.ctx, tcp_sock, handlers, self.log, "front", self.stats, self.stop, 2), daemon=True)
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


def main() -> None:
    Front(load_settings()).run()
