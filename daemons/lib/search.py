"""The four searches of one question, folded and fused (SPEC §2), with no sockets.

``hybrid_search`` runs, at once: the ``vector_k`` nearest windows, the ``keyword_k`` best BM25
chunks, and the same two restricted to the focus files (``focus_k`` each); windows are folded to
one hit per chunk at the rank of its nearest window. A fifth list comes from the same keyword
query at no extra search: its ``file_pool`` best chunks ranked by file (``file_keyword_list``: a
file's two best chunk scores summed), each file at its best chunk, ``keyword_k`` files long, so
that file-level keyword evidence (what whole-file BM25 sees) votes too. The lists are merged by
reciprocal rank fusion, each chunk's score is multiplied by its file role's weight (``daemons.lib.roles``: tests
and docs count less unless the question asks for them), and the top ``top_n`` returned. Without a query vector (embedder down, slow, or the index
built with another model) only the keyword lists run.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

import numpy as np

from daemons.lib.fusion import (
    FILE_KEYWORD, FILE_KEYWORD_POOL, FOCUS_KEYWORD, FOCUS_VECTOR, KEYWORD, VECTOR, file_keyword_list, fold_windows, rrf,
)
from daemons.lib.roles import weight_of
from daemons.lib.store import IndexStore
from protocol.schema import Candidate

_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="search")


@dataclass
class SearchResult:
    candidates: list[dict[str, Any]]  # rows with fused_score and ranks
    lists: dict[str, list[str]]
    timings_ms: dict[str, float] = field(default_factory=dict)


def _timed(fn, *args) -> tuple[list[dict[str, Any]], float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1000


def hybrid_search(
    store: IndexStore,
    keyword_query: str,
    query_vector: np.ndarray | None,
    focus_paths: list[str] | None = None,
    *,
    vector_k: int = 20,
    keyword_k: int = 20,
    focus_k: int = 6,
    top_n: int = 12,
    rrf_k: int = 60,
    file_pool: int = FILE_KEYWORD_POOL,
    use_keywords: bool = True,
    role_weights: Mapping[str, float] | None = None,
) -> SearchResult:
    """Run the searches concurrently and return the fused top ``top_n`` chunk rows.

    Each returned row carries ``fused_score`` (RRF times its role weight), ``ranks`` (1-based,
    per list) and ``weight`` (the role weight applied, 1.0 for source or without weights).
    ``file_pool`` 0 leaves the file list out (the four lists of SPEC §2 alone).
    """
    jobs: dict[str, Any] = {}
    if query_vector is not None and vector_k > 0:
        jobs[VECTOR] = _POOL.submit(_timed, store.vector_search, query_vector, vector_k)
    if use_keywords and keyword_k > 0:
        jobs[KEYWORD] = _POOL.submit(_timed, store.keyword_search, keyword_query, max(keyword_k, file_pool))
    if focus_paths and focus_k > 0:
        if query_vector is not None:
            jobs[FOCUS_VECTOR] = _POOL.submit(_timed, store.vector_search, query_vector, focus_k, focus_paths)
        if use_keywords:
            jobs[FOCUS_KEYWORD] = _POOL.submit(_timed, store.keyword_search, keyword_query, focus_k, focus_paths)
    rows_by_chunk: dict[str, dict[str, Any]] = {}
    lists: dict[str, list[str]] = {}
    timings: dict[str, float] = {}
    for name, fut in jobs.items():
        rows, ms = fut.result()
        timings[name] = round(ms, 2)
        if name in (VECTOR, FOCUS_VECTOR):
            rows = fold_windows(rows, limit=vector_k if name == VECTOR else focus_k)
        if name == KEYWORD:
            if file_pool > 0:
                by_file = file_keyword_list(rows[:file_pool], limit=keyword_k)
                lists[FILE_KEYWORD] = [r["chunk_id"] for r in by_file]
                for r in by_file:
                    rows_by_chunk.setdefault(r["chunk_id"], r)
            rows = rows[:keyword_k]
        lists[name] = [r["chunk_id"] for r in rows]
        for r in rows:
            rows_by_chunk.setdefault(r["chunk_id"], r)
    t0 = time.perf_counter()
    weighted = []
    for f in rrf(lists, k=rrf_k):
        w = weight_of(rows_by_chunk[f.id]["path"], role_weights)
        weighted.append((f, w, f.score * w))
    # stable: equal weighted scores keep rrf's deterministic order
    weighted.sort(key=lambda t: -round(t[2], 12))
    timings["fuse"] = round((time.perf_counter() - t0) * 1000, 3)
    candidates = []
    for f, w, score in weighted[:top_n]:
        row = dict(rows_by_chunk[f.id])
        row["fused_score"] = score
        row["ranks"] = dict(f.ranks)
        row["weight"] = w
        candidates.append(row)
    return SearchResult(candidates, lists, timings)


def to_candidates(rows: list[dict[str, Any]]) -> list[Candidate]:
    """The fused rows of a ``SearchResult`` as ``Candidate`` messages, in order."""
    return [
        Candidate(
            chunk_id=r["chunk_id"], path=r["path"], start_line=int(r["start_line"]), end_line=int(r["end_line"]),
            text=r["text"], language=r.get("language"), fused_score=float(r["fused_score"]), ranks=r["ranks"],
            weight=float(r.get("weight", 1.0)),
        )
        for r in rows
    ]
