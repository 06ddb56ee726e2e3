"""Folding vector windows to chunks, reciprocal rank fusion, and the final order of reranked
candidates (SPEC §1 "Windows", §2 "Fusion", "The cross-encoder")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

#: Reciprocal rank fusion constant: each list gives each member weight/(k + rank). Chosen on the
#: validation cases (bench/tune.py; README "Settings chosen on validation cases"); SPEC §2: 60.
RRF_K = 30
#: How many fused candidates go on to the reranker.
RERANK_TOP = 12
#: How many for a long question that quotes no traceback (``question.QueryPlan.long`` and not
#: ``traceback``): its condensed form tells the cross-encoder enough to use a deeper list. Chosen
#: on the 115 validation-long questions (12, 16, 20: repository-mean MRR 86.2, 87.6, 87.6); a
#: traceback question keeps 12 (its named files lead already; 16 and 20 lose on validation-traceback).
RERANK_TOP_LONG = 16
#: Nearest chunks by vector distance.
VECTOR_K = 20
#: Best chunks by BM25.
KEYWORD_K = 20
#: Rows of each search restricted to the focus files.
FOCUS_K = 6
#: BM25 chunk hits pooled to rank files by their keyword evidence (0: no file list).
FILE_KEYWORD_POOL = 100
#: Best chunk scores of a file summed into its file score.
FILE_KEYWORD_CHUNKS = 2
#: Rank constant of the fused-order/cross-encoder blend (:func:`rerank_order`; chosen on the validation cases).
RERANK_FUSION_K = 60
#: The cross-encoder's vote in that blend; the fused order's is 1 (0.5 chosen on the validation
#: cases with cross-encoder version 4: 0.25, 0.5 and 1 gave MRR 73.5, 74.4 and 73.7).
RERANK_FUSION_WEIGHT = 0.5

#: Conventional retriever names (the keys of the dict given to :func:`rrf`).
VECTOR = "vector"
KEYWORD = "keyword"
FOCUS_VECTOR = "focus_vector"
FOCUS_KEYWORD = "focus_keyword"
FILE_KEYWORD = "file_keyword"
FILE_BM25 = "file_bm25"
MENTIONED = "mentioned"
TESTED = "tested"

#: Each list's vote in the fusion (``rrf`` weights; settings ``list_weight_<name>``), chosen on the
#: validation cases; SPEC §2: 1 each.
LIST_WEIGHTS: dict[str, float] = {VECTOR: 0.5, KEYWORD: 0.5, FILE_KEYWORD: 1.0, FILE_BM25: 1.0, MENTIONED: 2.0, TESTED: 0.5}
#: A question that quotes a traceback (``question.Analysis.has_traceback``) gets these votes for the
#: two file-ranked keyword lists instead (settings ``list_weight_<name>_traceback``): its frames'
#: files are the mentioned list already, and its many identifiers and paths lift the biggest files
#: of the project up those two lists. Chosen on the 180 validation-traceback questions
#: (``bench.tune --lists-for traceback``).
TRACEBACK_LIST_WEIGHTS: dict[str, float] = {FILE_KEYWORD: 0.25, FILE_BM25: 0.5}
#: The suffix of a list's traceback vote, in a weights dict and in the settings' names.
TRACEBACK = "_traceback"

#: ``file_list`` values (the setting and ``hybrid_search``): which file-ranked keyword lists are fused.
BOTH, CHUNKS, FILES = "both", "chunks", "files"
FILE_LISTS = (BOTH, CHUNKS, FILES)


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


def rrf(ranked: Mapping[str, Sequence[str]], k: int = RRF_K, weights: Mapping[str, float] | None = None) -> list[Fused]:
    """Reciprocal rank fusion of named ranked id lists.

    Each list gives each member ``weight / (k + rank)`` with 1-based ranks, its weight from
    *weights* (1.0 for a list not named there, or without weights; a list of weight 0 is left
    out, ranks included); an id
    repeated within one list counts at its first position only. Sorted by score
    descending (compared to 12 decimals, so float summation order
    cannot matter), ties broken by best (smallest) rank, then by id, so the result
    is deterministic.
    """
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for retriever, ids in ranked.items():
        w = 1.0 if weights is None else float(weights.get(retriever, 1.0))
        if w <= 0:
            continue
        seen: set[str] = set()
        for rank, cid in enumerate(ids, start=1):
            if cid in seen:
                continue
            seen.add(cid)
            scores[cid] = scores.get(cid, 0.0) + w / (k + rank)
            ranks.setdefault(cid, {})[retriever] = rank
    fused = [Fused(cid, scores[cid], ranks[cid]) for cid in scores]
    fused.sort(key=lambda f: (-round(f.score, 12), min(f.ranks.values()), str(f.id)))
    return fused


def weighted_fuse(
    ranked: Mapping[str, Sequence[str]],
    role_weight: Callable[[str], float],
    k: int = RRF_K,
    weights: Mapping[str, float] | None = None,
) -> list[tuple[Fused, float, float]]:
    """:func:`rrf` with each id's score multiplied by ``role_weight(id)``: ``(fused, role weight,
    weighted score)`` triples, best first; equal weighted scores keep rrf's deterministic order."""
    out = []
    for f in rrf(ranked, k=k, weights=weights):
        w = role_weight(f.id)
        out.append((f, w, f.score * w))
    out.sort(key=lambda t: -round(t[2], 12))
    return out


def kind_weights(weights: Mapping[str, float], traceback: bool) -> dict[str, float]:
    """The list votes a question gets from *weights*: for a traceback question (*traceback*) each
    ``<name>_traceback`` entry (``TRACEBACK``) takes the place of ``<name>``'s; the suffixed entries
    themselves stay (``rrf`` ignores names that are no list)."""
    out = dict(weights)
    if traceback:
        out.update({name[: -len(TRACEBACK)]: w for name, w in weights.items() if name.endswith(TRACEBACK)})
    return out


def file_keyword_list(
    rows: Iterable[Mapping[str, Any]],
    limit: int,
    per_file: int = FILE_KEYWORD_CHUNKS,
    score: str = "_score",
) -> list[dict[str, Any]]:
    """Rank files by their keyword evidence: one row per file, its best chunk's, best file first.

    ``rows`` are BM25 chunk hits, best first. A file's score is the sum of its ``per_file`` best
    chunk scores, so a file whose chunks match different query words (one the class name, one
    the error message) can outrank a file with a single strong chunk: the file-level evidence
    whole-file BM25 sees and chunk-level BM25 alone misses. Ties keep the order of each file's
    first hit. Returns copies of each file's best row, cut to ``limit``.
    """
    per: dict[str, list[float]] = {}
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        path = row["path"]
        per.setdefault(path, []).append(float(row.get(score) or 0.0))
        best.setdefault(path, dict(row))
    totals = {p: sum(sorted(v, reverse=True)[:per_file]) for p, v in per.items()}
    order = sorted(best, key=lambda p: -round(totals[p], 12))  # stable: first-hit order on ties
    out = []
    for p in order[:limit]:
        row = best[p]
        row["file_score"] = totals[p]
        out.append(row)
    return out


def rerank_order(
    paths: Sequence[str],
    weighted_probs: Sequence[float],
    k: int = RERANK_FUSION_K,
    weight: float = RERANK_FUSION_WEIGHT,
) -> list[float]:
    """Order keys for reranked candidates, one per candidate: higher goes first.

    The candidates are given in fused order: *paths* holds each one's file, *weighted_probs* its
    cross-encoder probability times its role weight. Files are ranked twice, by their first
    candidate's fused position and by their best weighted probability (ties keep the fused order),
    and every candidate gets its file's key ``1/(k + 1 + fused rank) + weight / (k + 1 +
    cross-encoder rank)`` (ranks from 0). So the cross-encoder is one more vote rather than the
    last word: on the eval cases its order alone loses to the fused one on real commit subjects
    and issue texts, while this blend beats both; blending per chunk instead of per file lost
    recall@1 (README "Benchmarks"). ``weight = 0`` keeps the fused order; a weight far above 1
    orders files by probability alone, as SPEC §2 reads. Equal keys (chunks of one file) are for
    the caller to order, e.g. by probability.
    """
    if len(paths) != len(weighted_probs):
        raise ValueError(f"{len(paths)} paths but {len(weighted_probs)} probabilities")
    files: list[str] = []
    best: dict[str, float] = {}
    for path, p in zip(paths, weighted_probs):
        if path not in best:
            files.append(path)
            best[path] = p
        else:
            best[path] = max(best[path], p)
    by_prob = sorted(range(len(files)), key=lambda i: (-best[files[i]], i))
    key: dict[str, float] = {f: 1.0 / (k + 1 + i) for i, f in enumerate(files)}
    for r, i in enumerate(by_prob):
        key[files[i]] += weight / (k + 1 + r)
    return [key[path] for path in paths]
