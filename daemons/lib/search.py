"""The searches of one question, folded and fused (SPEC §2), with no sockets.

``hybrid_search`` runs, at once: the ``vector_k`` nearest windows, the ``keyword_k`` best BM25
chunks, and the same two restricted to the focus files (``focus_k`` each); windows are folded to
one hit per chunk at the rank of its nearest window. Two file-ranked keyword lists add what
whole-file BM25 sees and chunk-level BM25 misses (a file whose chunks each match a different word
of the question), each file entering at one chunk, ``keyword_k`` files long:

* ``file_keyword``: the keyword query's ``file_pool`` best chunks ranked by file
  (``file_keyword_list``: a file's two best chunk scores summed), at no extra search;
* ``file_bm25``: BM25 over one document per file (the table's ``file_keywords`` column), its
  scores weighed by file role before the cut, each file at its best pooled keyword chunk, else
  its nearest vector chunk, else its first chunk (``representatives``).

A question that names files (a traceback path, ``core/basic.py``, ``sphinx.ext.autodoc``; see
``daemons.lib.mentions``) adds the ``mentioned`` list: those files in order of mention, each at its
representative chunk as above.

``file_list`` picks the two file lists: ``"both"`` (default), ``"chunks"`` (``file_keyword`` alone) or
``"files"`` (``file_bm25`` alone); ``file_pool`` 0 drops both (SPEC §2's four lists). A table
without the whole-file column (made by an older version, not yet opened by the writer) gives no
``file_bm25`` list. The lists are merged by reciprocal rank fusion, each chunk's score is
multiplied by its file role's weight (``daemons.lib.roles``: tests, docs and config count less
unless the question asks for them), and the top ``top_n`` returned. Without a query vector
(embedder down, slow, or the index built with another model) only the keyword lists run.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from daemons.lib.fusion import (
    BOTH, CHUNKS, FILE_BM25, FILE_KEYWORD, FILE_KEYWORD_POOL, FILE_LISTS, FILES, FOCUS_K, FOCUS_KEYWORD, FOCUS_VECTOR, KEYWORD, KEYWORD_K,
    MENTIONED, RERANK_TOP, RRF_K, TESTED, VECTOR, VECTOR_K, file_keyword_list, fold_windows, weighted_fuse,
)
from daemons.lib.mentions import path_index
from daemons.lib import echoes
from daemons.lib.roles import role_weights, weight_of
from daemons.lib.subjects import subject_index
from daemons.lib.store import IndexStore
from protocol.schema import Candidate

if TYPE_CHECKING:
    from daemons.lib.config import Settings
    from daemons.lib.question import QueryPlan

_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="search")


@dataclass
class SearchResult:
    candidates: list[dict[str, Any]]  # rows with fused_score and ranks
    lists: dict[str, list[str]]
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchParams:
    """Everything ``hybrid_search`` needs besides the index and the question's two queries. The
    defaults are the module constants of ``fusion`` (the settings' defaults come from the same
    constants); ``question_params`` makes the product's from a ``Settings`` and a ``QueryPlan``,
    and ``dataclasses.replace`` one variant of it (the benchmarks' "without the file lists" ...).

    ``file_pool`` 0 leaves the file lists out (the four lists of SPEC §2 alone); ``file_list``
    picks them (``fusion.FILE_LISTS``); ``mentioned`` is the question's path-like tokens
    (``mentions.mentions``); ``test_subjects`` adds the ``tested`` list (``subjects``); ``role_weights`` the multiplier of each file role
    (``roles.role_weights``); ``list_weights`` each list's vote by name (``fusion.rrf``; a list not
    named counts 1.0); a chunk that quotes the question (``echoes.quotes_question`` with
    ``copy_key``) has its weight multiplied by ``copy_weight``.
    """

    vector_k: int = VECTOR_K
    keyword_k: int = KEYWORD_K
    focus_k: int = FOCUS_K
    top_n: int = RERANK_TOP
    rrf_k: int = RRF_K
    file_pool: int = FILE_KEYWORD_POOL
    file_list: str = BOTH
    mentioned: Sequence[str] = ()
    test_subjects: bool = False
    role_weights: Mapping[str, float] | None = None
    list_weights: Mapping[str, float] | None = None
    copy_key: str = ""
    copy_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.file_list not in FILE_LISTS:
            raise ValueError(f"file_list is {self.file_list!r}, not one of {', '.join(FILE_LISTS)}")


def question_params(s: Settings, qplan: QueryPlan) -> SearchParams:
    """The product's parameters for one question's plan under settings ``s`` (the daemons' own, or
    with the question's overrides): list sizes (a long question's candidates,
    ``Settings.rerank_top_for``), fusion, its named files, role weights, list weights (a traceback question's own,
    ``QueryPlan.traceback``) and copy key."""
    return SearchParams(
        vector_k=s.vector_k, keyword_k=s.keyword_k, focus_k=s.focus_k, top_n=s.rerank_top_for(qplan.long, qplan.traceback), rrf_k=s.rrf_k,
        file_pool=s.file_keyword_pool, file_list=s.file_list, mentioned=tuple(qplan.mentions) if s.path_mentions else (),
        test_subjects=s.test_subjects,
        role_weights=role_weights(qplan.role_text, s.test_weight, s.doc_weight, s.config_weight, s.vendored_weight),
        list_weights=s.list_weights(traceback=qplan.traceback), copy_key=echoes.copy_key(qplan.question), copy_weight=s.question_copy_weight,
    )


def _timed(fn, *args) -> tuple[list[dict[str, Any]], float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1000


def hybrid_search(
    store: IndexStore,
    keyword_query: str,
    query_vector: np.ndarray | None,
    focus_paths: list[str] | None = None,
    params: SearchParams = SearchParams(),
) -> SearchResult:
    """Run the searches concurrently and return the fused top ``params.top_n`` chunk rows.

    Each returned row carries ``fused_score`` (RRF times its weight), ``ranks`` (1-based, per list),
    ``role_weight`` (its file role's multiplier), ``quotes_question`` and ``weight`` (the role
    weight, times the copy weight for a chunk that quotes the question; 1.0 for source without
    either). A 2-D ``query_vector`` searches with each row and keeps each chunk at its nearest
    (``question.MAX``).
    """
    p = params
    jobs = _submit(store, keyword_query, query_vector, focus_paths, p)
    timings: dict[str, float] = {}
    named: list[str] = []
    if p.mentioned:
        t0 = time.perf_counter()
        named = path_index(store.paths()).named_files(list(p.mentioned))
        timings[MENTIONED] = round((time.perf_counter() - t0) * 1000, 2)
    results: dict[str, list[dict[str, Any]] | None] = {}
    for name, fut in jobs.items():
        results[name], ms = fut.result()
        timings[name] = round(ms, 2)
    lists, rows_by_chunk = _ranked_lists(store, results, named, p, timings)

    role: dict[str, float] = {}
    copies: set[str] = set()

    def weight(cid: str) -> float:
        row = rows_by_chunk[cid]
        w = role[cid] = weight_of(row["path"], p.role_weights)
        if p.copy_weight != 1.0 and echoes.quotes_question(str(row.get("text") or ""), p.copy_key):
            copies.add(cid)
            w *= p.copy_weight
        return w

    t0 = time.perf_counter()
    weighted = weighted_fuse(lists, weight, p.rrf_k, p.list_weights)
    timings["fuse"] = round((time.perf_counter() - t0) * 1000, 3)
    candidates = []
    for f, w, score in weighted[:p.top_n]:
        row = dict(rows_by_chunk[f.id])
        row["fused_score"] = score
        row["ranks"] = dict(f.ranks)
        row["weight"] = w
        row["role_weight"] = role.get(f.id, w)
        row["quotes_question"] = f.id in copies
        candidates.append(row)
    return SearchResult(candidates, lists, timings)


def _ranked_lists(store: IndexStore, results: dict[str, list[dict[str, Any]] | None], named: list[str],
                  p: SearchParams, timings: dict[str, float]) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """The searches' rows as ranked lists of chunk ids (the file-ranked lists built from them), and
    each listed chunk's row; the ``tested`` list's time goes into *timings*."""
    vector_k, keyword_k, focus_k, file_pool, file_list = p.vector_k, p.keyword_k, p.focus_k, p.file_pool, p.file_list
    rows_by_chunk: dict[str, dict[str, Any]] = {}
    lists: dict[str, list[str]] = {}
    pool = (results.get(KEYWORD) or [])[:file_pool]
    vector_rows = fold_windows(results[VECTOR], limit=vector_k) if VECTOR in results else []
    file_rows = whole_file_rows = results.pop(FILE_BM25, None)
    file_lists: dict[str, list[dict[str, Any]]] = {}
    if file_rows is not None:
        # weighed by role before the cut, so tests and docs that repeat the question's words do not fill the list
        file_rows = sorted(file_rows, key=lambda r: -float(r.get("_score") or 0.0) * weight_of(r["path"], p.role_weights))
        file_lists[FILE_BM25] = representatives(file_rows[:keyword_k], pool, vector_rows)
    if file_pool > 0 and KEYWORD in results and file_list != FILES:
        file_lists[FILE_KEYWORD] = file_keyword_list(pool, limit=keyword_k)
    tested: list[str] = []
    if p.test_subjects:
        t0 = time.perf_counter()
        tested = subject_index(store.paths()).tested_files(_test_hits(vector_rows, pool[:keyword_k], whole_file_rows or []))
        timings[TESTED] = round((time.perf_counter() - t0) * 1000, 2)
    if named or tested:
        first = {r["path"]: r for r in _first_rows(store, list(dict.fromkeys([*named, *tested])), pool, vector_rows)}
        for name, files in ((MENTIONED, named), (TESTED, tested)):
            if files:
                file_lists[name] = representatives([first[f] for f in files if f in first], pool, vector_rows)
    for name, rows in file_lists.items():
        lists[name] = [r["chunk_id"] for r in rows]
        for r in rows:
            rows_by_chunk.setdefault(r["chunk_id"], r)
    for name, rows in results.items():
        if name == VECTOR:
            rows = vector_rows
        elif name == FOCUS_VECTOR:
            rows = fold_windows(rows, limit=focus_k)
        elif name == KEYWORD:
            rows = rows[:keyword_k]
        lists[name] = [r["chunk_id"] for r in rows]
        for r in rows:
            rows_by_chunk.setdefault(r["chunk_id"], r)
    return lists, rows_by_chunk


def _test_hits(*ranked: list[dict[str, Any]]) -> list[str]:
    """The paths of *ranked* row lists interleaved rank by rank (each list's first row, then each
    one's second ...), for ``subjects.SubjectIndex.tested_files`` to pick the tests from."""
    out: list[str] = []
    for i in range(max((len(rows) for rows in ranked), default=0)):
        out.extend(rows[i]["path"] for rows in ranked if i < len(rows))
    return out


def _submit(store: IndexStore, keyword_query: str, query_vector: np.ndarray | None, focus_paths: list[str] | None,
            p: SearchParams) -> dict[str, Any]:
    """Start ``hybrid_search``'s searches on the pool: ``{list name: future of (rows, ms)}``."""
    vector_k, keyword_k, focus_k, file_pool, file_list = p.vector_k, p.keyword_k, p.focus_k, p.file_pool, p.file_list
    jobs: dict[str, Any] = {}
    if query_vector is not None and vector_k > 0:
        jobs[VECTOR] = _POOL.submit(_timed, _vector_search, store, query_vector, vector_k)
    if keyword_k > 0:
        jobs[KEYWORD] = _POOL.submit(_timed, store.keyword_search, keyword_query, max(keyword_k, file_pool))
        if file_pool > 0 and file_list != CHUNKS:
            # twice as many files as kept, so the role weights below have some to choose from
            jobs[FILE_BM25] = _POOL.submit(_timed, store.file_keyword_search, keyword_query, 2 * keyword_k)
    if focus_paths and focus_k > 0:
        if query_vector is not None:
            jobs[FOCUS_VECTOR] = _POOL.submit(_timed, _vector_search, store, query_vector, focus_k, focus_paths)
        jobs[FOCUS_KEYWORD] = _POOL.submit(_timed, store.keyword_search, keyword_query, focus_k, focus_paths)
    return jobs


def _vector_search(store: IndexStore, vectors: np.ndarray, k: int, paths: list[str] | None = None) -> list[dict[str, Any]]:
    """The *k* nearest windows of one query vector, or of each row of a 2-D array (their rows
    together, for ``fold_windows`` to keep each chunk at its nearest)."""
    if vectors.ndim == 1:
        return store.vector_search(vectors, k, paths)
    return [row for v in vectors for row in store.vector_search(v, k, paths)]


def representatives(
    file_rows: list[dict[str, Any]], keyword_rows: list[dict[str, Any]], vector_rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each whole-file hit as the chunk that stands for its file in fusion, in file order.

    A file enters at its best chunk by keyword score among ``keyword_rows`` (the pooled BM25
    chunk hits), else at its nearest chunk among ``vector_rows``, else at its first chunk (the
    row the whole-file document lives on). Each returned row is a copy carrying ``file_score``.
    """
    best: dict[str, dict[str, Any]] = {}
    for r in keyword_rows:
        best.setdefault(r["path"], r)
    for r in vector_rows:
        best.setdefault(r["path"], r)
    out = []
    for f in file_rows:
        row = dict(best.get(f["path"], f))
        row["file_score"] = float(f.get("_score") or 0.0)
        out.append(row)
    return out


def _first_rows(
    store: IndexStore, paths: list[str], keyword_rows: list[dict[str, Any]], vector_rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """A row per path, in order, for ``representatives``: the file's first chunk row when no
    search row of it is at hand (fetched), a bare ``{"path"}`` otherwise (never used)."""
    have = {r["path"] for r in keyword_rows} | {r["path"] for r in vector_rows}
    first = {r["path"]: r for r in store.first_rows([p for p in paths if p not in have])}
    return [first.get(p, {"path": p}) for p in paths if p in have or p in first]


def to_candidates(rows: list[dict[str, Any]]) -> list[Candidate]:
    """The fused rows of a ``SearchResult`` as ``Candidate`` messages, in order."""
    return [
        Candidate(
            chunk_id=r["chunk_id"], path=r["path"], start_line=int(r["start_line"]), end_line=int(r["end_line"]),
            text=r["text"], language=r.get("language"), fused_score=float(r["fused_score"]), ranks=r["ranks"],
            weight=float(r.get("weight", 1.0)), role_weight=float(r.get("role_weight", r.get("weight", 1.0))),
            quotes_question=bool(r.get("quotes_question", False)),
        )
        for r in rows
    ]


def settings_search(store: IndexStore, qplan: QueryPlan, query_vector: np.ndarray | None, focus_paths: list[str] | None,
                    s: Settings) -> SearchResult:
    """``hybrid_search`` of one question's plan with ``question_params(s, qplan)``."""
    return hybrid_search(store, qplan.keyword_query, query_vector, focus_paths, question_params(s, qplan))
