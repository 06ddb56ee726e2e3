"""An in-memory BM25 (k1 1.2, b 0.75, as the product's full-text index) over the product's keyword
texts, for mining hard negatives: the chunks the product's keyword search would rank high.

``Bm25(docs)`` indexes token lists; ``scores(query_tokens)`` is a dense array of scores;
``top(query_tokens, k, exclude)`` the best ``k`` document numbers not in ``exclude`` (score > 0).
``score_with(query_tokens, doc_tokens)`` scores a document outside the index with the index's
statistics (a file read at another commit).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Sequence

import numpy as np

K1 = 1.2
B = 0.75


class Bm25:
    def __init__(self, docs: Sequence[Sequence[str]]) -> None:
        self.n = len(docs)
        self.lengths = np.array([len(d) for d in docs], dtype=np.float32)
        self.avg = float(self.lengths.mean()) if self.n else 1.0
        self.postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        acc: dict[str, tuple[list[int], list[int]]] = {}
        for i, d in enumerate(docs):
            for tok, tf in Counter(d).items():
                ids, tfs = acc.setdefault(tok, ([], []))
                ids.append(i)
                tfs.append(tf)
        for tok, (ids, tfs) in acc.items():
            self.postings[tok] = (np.array(ids, dtype=np.int32), np.array(tfs, dtype=np.float32))

    def idf(self, tok: str) -> float:
        df = len(self.postings[tok][0]) if tok in self.postings else 0
        return math.log(1 + (self.n - df + 0.5) / (df + 0.5))

    def scores(self, query: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.float32)
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
