"""Shared by the quality and speed benchmarks: building an index with the product's own library
path (WorkspaceFilter -> read_file -> file_chunks -> plan_rows -> embed_documents ->
IndexStore), an on-disk embedding cache, a whole-file BM25 floor, and file-level metrics.

The embedding cache (``<cache>/embcache/<model_id>.sqlite``, key = sha1 of the exact string handed
to ``embed_documents``) only saves recomputation across sdist versions of the same repository;
the vectors are the ones the embedder produced for that string, so a cached index is identical to
an uncached one. ``bench/speed.py`` builds without it when it measures index time.
"""
from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from daemons.lib.chunking import CHUNKER_VERSION, file_chunks
from daemons.lib.config import Settings
from daemons.lib.filtering import content_hash, indexable_files
from daemons.lib.bm25 import WholeFileBM25 as _WholeFileBM25
from daemons.lib.indexing import index_meta, plan_rows
from daemons.lib.metrics import METRIC_NAMES
from daemons.lib.store import IndexStore, RebuildNeeded

# ---------------------------------------------------------------------------------- settings


def bench_settings() -> Settings:
    """SPEC defaults, ignoring any user config file or WSCTX_* environment."""
    return Settings()


def index_key(name: str, version: str, model_id: str, settings: Settings) -> str:
    shape = hashlib.sha1(json.dumps(settings.index_shape(), sort_keys=True).encode()).hexdigest()[:8]
    model = re.sub(r"[^A-Za-z0-9_.-]+", "_", model_id)
    return f"{name}-{version}/{model}-c{CHUNKER_VERSION}-{shape}"


# ---------------------------------------------------------------------------------- files


def workspace_files(tree: Path, settings: Settings) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """What the product would index: (rel path, bytes) for each file, and {rel: reason} skipped
    (the bench's ``.complete`` marker left out)."""
    kept, skipped = indexable_files(tree, settings.include_globs, settings.exclude_globs, settings.max_file_bytes)
    return [(rel, data) for rel, data in kept if rel != ".complete"], skipped


_TEST_RE = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*$|_tests?\.py$|(^|/)conftest\.py$")


def is_test_file(rel: str) -> bool:
    return _TEST_RE.search(rel) is not None


# ---------------------------------------------------------------------------------- embedding cache


class EmbedCache:
    """sha1(text) -> float32 vector, one sqlite file per model id."""

    def __init__(self, cache_dir: Path, model_id: str, dim: int) -> None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model_id)
        self.db = sqlite3.connect(str(cache_dir / f"{safe}.sqlite"), timeout=60)
        self.db.execute("CREATE TABLE IF NOT EXISTS v (k TEXT PRIMARY KEY, vec BLOB)")
        self.dim = dim

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for s in range(0, len(keys), 500):
            part = keys[s : s + 500]
            q = "SELECT k, vec FROM v WHERE k IN (" + ",".join("?" * len(part)) + ")"
            for k, blob in self.db.execute(q, part):
                out[k] = np.frombuffer(blob, dtype=np.float32)
        return out

    def put_many(self, items: list[tuple[str, np.ndarray]]) -> None:
        self.db.executemany("INSERT OR REPLACE INTO v VALUES (?, ?)", [(k, v.astype(np.float32).tobytes()) for k, v in items])
        self.db.commit()


def settings_embedder(settings: Settings) -> Any:
    """The settings' embedding model, batched by the settings' bounds, as the embedder daemon loads it."""
    from models.embedding import load_embedder

    return load_embedder(settings.embedder_model, batch_tokens=settings.embed_batch_tokens, batch_max=settings.embed_batch)


def embed_with_cache(embedder: Any, texts: list[str], cache: EmbedCache | None) -> tuple[np.ndarray, int]:
    """Vectors for ``texts`` (document side, the embedder's own batching); returns (vectors, how
    many were computed)."""
    if cache is None:
        return embedder.embed_documents(texts), len(texts)
    keys = [cache.key(t) for t in texts]
    have = cache.get_many(list(set(keys)))
    todo = sorted({k: i for i, k in enumerate(keys) if k not in have}.items(), key=lambda kv: kv[1])
    if todo:
        vecs = embedder.embed_documents([texts[i] for _, i in todo])
        new = [(k, vecs[j]) for j, (k, _) in enumerate(todo)]
        cache.put_many(new)
        have.update(new)
    return np.stack([have[k] for k in keys]).astype(np.float32), len(todo)


# ---------------------------------------------------------------------------------- building


@dataclass
class BuildStats:
    files: int = 0
    skipped_files: int = 0
    chunks: int = 0
    rows: int = 0
    embedded: int = 0  # rows actually run through the model (rest: embedding cache)
    seconds: dict[str, float] = field(default_factory=lambda: {"list": 0.0, "chunk": 0.0, "embed": 0.0, "write": 0.0, "optimize": 0.0})

    def as_dict(self) -> dict[str, Any]:
        total = sum(self.seconds.values())
        return {
            "files": self.files, "skipped_files": self.skipped_files, "chunks": self.chunks, "rows": self.rows,
            "embedded": self.embedded, "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "total_s": round(total, 3),
            "share": {k: round(v / total, 3) if total else 0.0 for k, v in self.seconds.items()},
            "files_per_s": round(self.files / total, 2) if total else 0.0,
            "rows_per_s": round(self.rows / total, 2) if total else 0.0,
        }


def build_index(
    tree: Path, folder: Path, settings: Settings, embedder: Any, *, cache: EmbedCache | None,
    write: str = "batch", progress: Callable[[str], None] | None = None, batch_files: int = 64,
) -> tuple[IndexStore, BuildStats]:
    """Index ``tree`` into a fresh table at ``folder`` with the product's library path.

    ``write="replace_file"`` writes each file with ``IndexStore.replace_file`` (the embedder
    daemon's call, one merge-insert per file); ``write="batch"`` writes many files per commit with
    ``IndexStore.replace_files`` (the daemon's keywords-first burst: same rows, fewer commits; used
    for the quality indexes). Then ``optimize``
    (compaction, FTS/btree fold, and the store's own vector-index rule).
    """
    st = BuildStats()
    t0 = time.perf_counter()
    files, skipped = workspace_files(tree, settings)
    st.seconds["list"] += time.perf_counter() - t0
    st.files, st.skipped_files = len(files), len(skipped)
    meta = index_meta(settings, embedder, str(tree))
    IndexStore.destroy(folder)
    store = IndexStore.open_writer(folder, meta)
    cs = settings.chunk_settings()
    pending: list[dict[str, Any]] = []
    pending_texts: list[str] = []
    per_file: list[tuple[str, int]] = []

    def flush() -> None:
        if not pending:
            return
        t = time.perf_counter()
        vecs, n = embed_with_cache(embedder, pending_texts, cache)
        st.embedded += n
        for r, v in zip(pending, vecs):
            r["vector"] = v
        st.seconds["embed"] += time.perf_counter() - t
        t = time.perf_counter()
        by_file: dict[str, list[dict[str, Any]]] = {}
        pos = 0
        for path, n_rows in per_file:
            by_file[path] = pending[pos : pos + n_rows]
            pos += n_rows
        if write == "replace_file":
            for path, file_rows in by_file.items():
                store.replace_file(path, file_rows)
        else:
            store.replace_files(by_file)
        st.seconds["write"] += time.perf_counter() - t
        pending.clear()
        pending_texts.clear()
        per_file.clear()

    for i, (rel, data) in enumerate(files):
        t = time.perf_counter()
        text = data.decode("utf-8")
        chunks = file_chunks(text, rel, cs)
        rows, texts = plan_rows(rel, content_hash(data), chunks, settings)
        st.seconds["chunk"] += time.perf_counter() - t
        st.chunks += len(chunks)
        st.rows += len(rows)
        if rows:
            pending.extend(rows)
            pending_texts.extend(texts)
            per_file.append((rel, len(rows)))
        if len(per_file) >= batch_files or len(pending) >= 2000:
            flush()
            if progress:
                progress(f"{i + 1}/{len(files)} files, {st.rows} rows, embedded {st.embedded}")
    flush()
    t = time.perf_counter()
    store.optimize()
    st.seconds["optimize"] += time.perf_counter() - t
    return store, st


def open_or_build(tree: Path, cache_dir: Path, name: str, version: str, settings: Settings, embedder: Any,
                  emb_cache: EmbedCache | None, log: Callable[[str], None] = print) -> tuple[IndexStore, dict[str, Any]]:
    folder = cache_dir / "indexes" / index_key(name, version, embedder.model_id, settings)
    done = folder / "build.json"
    if done.is_file():
        try:
            store = IndexStore.open_writer(folder, index_meta(settings, embedder, str(tree)))
            return store, json.loads(done.read_text())
        except RebuildNeeded as e:
            log(f"  {name}-{version}: {e}; rebuilding")
    log(f"  building index {name}-{version} -> {folder}")
    store, st = build_index(tree, folder, settings, embedder, cache=emb_cache, progress=lambda m: log(f"    {name}-{version}: {m}"))
    info = st.as_dict()
    done.write_text(json.dumps(info, indent=1))
    log(f"  built {name}-{version}: {info['files']} files, {info['rows']} rows in {info['total_s']} s (embedded {info['embedded']})")
    return store, info


# ---------------------------------------------------------------------------------- BM25 floor


class WholeFileBM25(_WholeFileBM25):
    """Whole-file BM25 over the non-test files with one of ``suffixes`` (``.py`` by default; with that
    file set it reproduces the eval README's floor on commits.jsonl within ~2 points)."""

    def __init__(self, files: list[tuple[str, bytes]], suffixes: tuple[str, ...] | None = (".py",)) -> None:
        super().__init__(files, keep=lambda rel: not is_test_file(rel) and (not suffixes or rel.endswith(suffixes)))


def write_result(out: str | Path, doc: Any, log: Callable[[str], None] = print) -> None:
    """Write a benchmark's JSON result *doc* to *out*, making its folder, and say where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    log(f"wrote {path}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


def robustness(per_repo: dict[str, dict], methods: list[str], min_cases: int = 5) -> dict[str, dict[str, Any]]:
    """Per method, over the repositories with at least *min_cases* cases: the mean of the
    per-repository means (each repository counts once), the worst repository by MRR and by
    recall@5, and the spread (population standard deviation) of per-repository MRR. A change that
    lifts the case mean but sinks one repository shows here."""
    repos = {r: v for r, v in per_repo.items() if v["n"] >= min_cases}
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        have = {r: v[m] for r, v in repos.items() if v.get(m)}
        if not have:
            continue
        mrr = {r: v["mrr"] for r, v in have.items()}
        r5 = {r: v["recall@5"] for r, v in have.items()}
        worst_mrr, worst_r5 = min(mrr, key=mrr.get), min(r5, key=r5.get)
        out[m] = {
            "repos": len(have),
            "repo_mean": {k: round(float(np.mean([v[k] for v in have.values()])), 2) for k in METRIC_NAMES},
            "worst_mrr": [worst_mrr, mrr[worst_mrr]], "worst_recall@5": [worst_r5, r5[worst_r5]],
            "mrr_spread": round(float(np.std(list(mrr.values()))), 2),
        }
    return out


def robustness_table(rob: dict[str, dict[str, Any]]) -> str:
    """``robustness`` as printed lines: repository mean, worst repository, spread."""
    lines = [f"{'method':14s} {'repos':>5s} {'repo-mean r@5':>13s} {'repo-mean MRR':>13s}  {'worst MRR':30s} {'worst r@5':30s} {'MRR sd':>6s}"]
    for m, v in rob.items():
        wm, wr = v["worst_mrr"], v["worst_recall@5"]
        lines.append(f"{m:14s} {v['repos']:5d} {v['repo_mean']['recall@5']:13.1f} {v['repo_mean']['mrr']:13.1f}  "
                     f"{f'{wm[0]} {wm[1]:.1f}':30s} {f'{wr[0]} {wr[1]:.1f}':30s} {v['mrr_spread']:6.1f}")
    return "\n".join(lines)



class QuestionKind(NamedTuple):
    """How the product tells a question apart (``QueryPlan.long``, ``QueryPlan.traceback``)."""

    long: bool
    traceback: bool


def question_kind(question: str, settings: Settings) -> QuestionKind:
    """Whether *question* gets a long question's blend (``pipeline.blend``) and a traceback
    question's list votes (``Settings.list_weights``), as the front and searcher decide: analysis
    on, and ``question.Analysis.is_long`` / ``has_traceback``; one analysis for both."""
    from daemons.lib.question import analyse

    if not settings.question_analysis:
        return QuestionKind(False, False)
    a = analyse(question)
    return QuestionKind(a.is_long, a.has_traceback)


def question_queries(q: str, settings: Settings, embedder: Any, store: IndexStore) -> tuple[Any, str, Any, list[str]]:
    """The product's queries for question *q* under *settings* in *store*'s workspace, as the
    searcher and front make them (``question.plan``): ``(plan, keyword query, query vector(s),
    mentions)``."""
    from daemons.lib import question

    counts = store.document_frequencies(wait=True)
    p = question.plan_for(q, settings, counts[0] if counts else None)
    vectors = np.stack([embedder.embed_query(t) for t in p.dense_texts])
    return p, p.keyword_query, question.combine_vectors(vectors, p.dense), (p.mentions if settings.path_mentions else [])


def apply_overrides(settings: Settings, items: list[str], allowed: tuple[str, ...]) -> str:
    """Set each ``NAME=VALUE`` of *items* on *settings* (typed as the field is); the first problem
    as a message, or ''."""
    for item in items:
        name, _, value = item.partition("=")
        if name not in allowed:
            return f"--set {name}: not one of {', '.join(allowed)}"
        kind = type(getattr(settings, name))
        setattr(settings, name, value.lower() in ("1", "true", "yes", "on") if kind is bool else kind(value))
    return ""
