"""File-level retrieval metrics, as ``../shared/eval`` scores its cases: a chunk hit counts for its
file at its first occurrence; recall@k is the share of gold files in the top k, acc@k whether all
of them are, MRR the reciprocal rank of the first gold file. Shared by ``wsctx eval`` and the benches."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

METRIC_NAMES = ["recall@1", "recall@5", "recall@10", "acc@1", "acc@3", "acc@5", "mrr"]


def files_in_order(rows: Iterable[dict[str, Any] | str]) -> list[str]:
    """Each path once, at its first occurrence (rows are dicts with ``path`` or paths)."""
    out: list[str] = []
    seen: set[str] = set()
    for r in rows:
        p = r["path"] if isinstance(r, dict) else r
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def file_metrics(ranked: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    """One case's metrics (fractions in [0, 1]) for files ranked best first against its gold files."""
    g = set(gold)
    m: dict[str, float] = {}
    for k in (1, 5, 10):
        m[f"recall@{k}"] = len(g & set(ranked[:k])) / len(g)
    for k in (1, 3, 5):
        m[f"acc@{k}"] = float(g <= set(ranked[:k]))
    m["mrr"] = next((1.0 / (i + 1) for i, p in enumerate(ranked) if p in g), 0.0)
    return m


def mean_metrics(ms: Sequence[dict[str, float]]) -> dict[str, float]:
    """The cases' mean of each metric, in percent with one decimal ({} for no case)."""
    if not ms:
        return {}
    return {k: round(100 * sum(m[k] for m in ms) / len(ms), 1) for k in METRIC_NAMES}
