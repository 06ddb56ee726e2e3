"""Folding vector windows to chunks and reciprocal rank fusion (SPEC §1 "Windows", §2 "Fusion")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

#: Reciprocal rank fusion constant: each list gives each member 1/(k + rank).
RRF_K = 60
#: How many fused candidates go on to the reranker.
RERANK_TOP = 12
#: Nearest chunks by vector distance.
VECTOR_K = 20
#: Best chunks by BM25.
KEYWORD_K = 20
#: Rows of each search restricted to the focus files.
FOCUS_K = 6

#: Conventional retriever names (the keys of the dict given to :func:`rrf`).
VECTOR = "vector"
KEYWORD = "keyword"
FOCUS_VECTOR = "focus_vector"
FOCUS_KEYWORD = "focus_keyword"


class Fused(NamedTuple):
    """One fused candidate: its id, RRF score and 1-based rank in each list it was in.

    A NamedTuple, so it also unpacks as ``(id, score, ranks)``.
    """

    id: str
    score: float
    ranks: dict[str, int]


def fold_windows(
    rows: Iterable[Mapping[str, Any]],
    key: str = "chunk_id",
    distance: str = "_distance",
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Fold vector-search rows (one per window) to one row per chunk.

    Each chunk keeps the row of its nearest window (smallest *distance*; when a
    row has no distance, the first row seen) and is placed at that window's
    rank. Rows are ordered by their distance when every row has one, ties (and
    rows without distances) keeping input order. Returns copies, cut to *limit*.
    """
    rows = list(rows)
    best: dict[Any, tuple[int, dict[str, Any]]] = {}
    for pos, row in enumerate(rows):
        cid = row[key]
        if cid not in best:
            best[cid] = (pos, dict(row))
            continue
        d_new, d_old = row.get(distance), best[cid][1].get(distance)
        if d_new is not None and d_old is not None and d_new < d_old:
            best[cid] = (pos, dict(row))

    def order(item: tuple[int, dict[str, Any]]) -> tuple[float, int]:
        pos, row = item
        d = row.get(distance)
        return (float(d) if d is not None else float("inf"), pos)

    items = list(best.values())
    if all(r.get(distance) is not None for _, r in items):
        items.sort(key=order)
    else:
        items.sort(key=lambda it: it[0])
    out = [r for _, r in items]
    return out[:limit] if limit is not None else out


def rrf(ranked: Mapping[str, Sequence[str]], k: int = RRF_K) -> list[Fused]:
    """Reciprocal rank fusion of named ranked id lists.

    Each list gives each member ``1 / (k + rank)`` with 1-based ranks; an id
    repeated within one list counts at its first position only. Sorted by score
    descending (compared to 12 decimals, so float summation order
    cannot matter), ties broken by best (smallest) rank, then by id, so the result
    is deterministic.
    """
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for retriever, ids in ranked.items():
        seen: set[str] = set()
        for rank, cid in enumerate(ids, start=1):
            if cid in seen:
                continue
            seen.add(cid)
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (k + rank)
            ranks.setdefault(cid, {})[retriever] = rank
    fused = [Fused(cid, scores[cid], ranks[cid]) for cid in scores]
    fused.sort(key=lambda f: (-round(f.score, 12), min(f.ranks.values()), str(f.id)))
    return fused
