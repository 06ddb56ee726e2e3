"""Okapi BM25 in memory (k1 1.2, b 0.75, as the product's full-text index), and the whole-file BM25
that retrieval is measured against.

* ``Bm25(docs)`` indexes token lists; ``scores(query_tokens)`` is a dense array of scores;
  ``top(query_tokens, k, exclude)`` the best ``k`` document numbers not in ``exclude`` (score > 0);
  ``score_with(query_tokens, doc_tokens)`` scores a document outside the index with the index's
  statistics. The training miner uses it for hard negatives.
* ``WholeFileBM25(files, keep)`` ranks whole files for a question: documents are ``bm25_tokens(text,
  path)`` (identifiers whole and split into parts, lowercased, plus the path's words; no stemming),
  the query is ``query_keywords(question)``. It is the floor that ``wsctx eval`` and the benches
  print beside the product: plain keyword search over whole files, as grep-like tools rank them.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Container, Iterable, Sequence

import numpy as np

from daemons.lib.keywords import _expand, identifiers, query_keywords

K1 = 1.2
B = 0.75


class Bm25:
    def __init__(self, docs: Sequence[Sequence[str]], dtype: type = np.float32) -> None:
        self.n = len(docs)
        self.lengths = np.array([len(d) for d in docs], dtype=dtype)
        self.avg = float(self.lengths.mean()) if self.n else 1.0
        self.dtype = dtype
        self.postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        acc: dict[str, tuple[list[int], list[int]]] = {}
        for i, d in enumerate(docs):
            for tok, tf in Counter(d).items():
                ids, tfs = acc.setdefault(tok, ([], []))
                ids.append(i)
                tfs.append(tf)
        for tok, (ids, tfs) in acc.items():
            self.postings[tok] = (np.array(ids, dtype=np.int32), np.array(tfs, dtype=dtype))

    def idf(self, tok: str) -> float:
        df = len(self.postings[tok][0]) if tok in self.postings else 0
        return math.log(1 + (self.n - df + 0.5) / (df + 0.5))

    def scores(self, query: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.n, dtype=self.dtype)
        norm = K1 * (1 - B + B * self.lengths / self.avg)
        for tok in set(query):
            hit = self.postings.get(tok)
            if hit is None:
                continue
            ids, tfs = hit
            out[ids] += self.idf(tok) * tfs * (K1 + 1) / (tfs + norm[ids])
        return out

    def top(self, query: Sequence[str], k: int, exclude: Container[int] = ()) -> list[int]:
        s = self.scores(query)
        order = np.argsort(-s, kind="stable")
        out: list[int] = []
        for i in order:
            if s[i] <= 0 or len(out) >= k:
                break
            if int(i) not in exclude:
                out.append(int(i))
        return out

    def score_with(self, query: Sequence[str], doc: Sequence[str]) -> float:
        tf = Counter(doc)
        norm = K1 * (1 - B + B * len(doc) / self.avg)
        return sum(self.idf(t) * tf[t] * (K1 + 1) / (tf[t] + norm) for t in set(query) if tf[t])


def bm25_tokens(text: str, path: str = "") -> list[str]:
    """Identifiers lowercased whole and split into their parts, as the keyword column does, but
    without its per-chunk repeat cap (a whole file's term frequencies count), plus path words."""
    out = [t for ident in identifiers(text) for t in _expand(ident)]
    for ident in identifiers(path):
        out.extend(_expand(ident))
    return out


class WholeFileBM25:
    """Whole files ranked by BM25 for a question (see the module contract); ``keep(path)`` chooses
    the files (all by default)."""

    def __init__(self, files: Iterable[tuple[str, bytes]], keep: Callable[[str], bool] | None = None) -> None:
        kept = [(rel, data) for rel, data in files if keep is None or keep(rel)]
        self.paths = [rel for rel, _ in kept]
        self.index = Bm25([bm25_tokens(data.decode("utf-8", "replace"), rel) for rel, data in kept], dtype=np.float64)

    def search(self, question: str, k: int = 50) -> list[str]:
        """The ``k`` best files' paths, best first; only files sharing a term with the question."""
        return [self.paths[i] for i in self.index.top(query_keywords(question).split(), k)]
