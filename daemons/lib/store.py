"""One LanceDB table per workspace: the rows, their identity, the FTS index, and the searches.

A row is one embedded window of one chunk, keyed by ``id = path|content_hash|chunk|window``.
Each file's first row (lowest chunk index, window 0) also carries ``file_keywords``, the
keyword text of the whole file, with its own FTS index: one BM25 document per file, written in
the same commit as the file's rows (every other row holds ``''``, which BM25 does not count as a
document). A table made before that column existed gains it on ``open_writer``, filled from the
rows' texts, without re-embedding.
The table's schema metadata (key ``wsctx``) records the embedding model id, its dimension, the
chunker version and the index-shaping settings; ``IndexStore.mismatch`` compares them with what
the running daemons would write, and a difference means "rebuild needed", never mixed rows.
Only the embedder writes (single writer per workspace); any process may read.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.index import FTS, BTree, HnswSq

from daemons.lib.config import INDEX_CACHE_MB, METADATA_CACHE_MB
from daemons.lib.indexing import PENDING_PREFIX
from daemons.lib.keywords import file_keyword_text

TABLE = "chunks"
#: Past this many rows a flat vector scan gets slow (~100 ms at 50k rows on 2 cores): build HNSW.
VECTOR_INDEX_MIN_ROWS = 50_000
#: Term counts (``document_frequencies``) are recounted at most this often after writes.
DF_REFRESH_S = 60.0
META_KEY = b"wsctx"
FTS_CONFIG = dict(
    with_position=True, base_tokenizer="simple", language="English", lower_case=True, stem=True,
    remove_stop_words=False, ascii_folding=True,
)
#: The whole-file column is only ever searched by terms, never by phrase: no positions.
FILE_FTS_CONFIG = {**FTS_CONFIG, "with_position": False}
FILE_KEYWORDS = "file_keywords"
_session_lock = threading.Lock()
_session: Any = None


def _new_session(index_mb: int, metadata_mb: int) -> Any:
    sizes = {}
    if index_mb:
        sizes["index_cache_size_bytes"] = int(index_mb) << 20
    if metadata_mb:
        sizes["metadata_cache_size_bytes"] = int(metadata_mb) << 20
    return lancedb.Session(**sizes)


def configure_caches(index_mb: int = INDEX_CACHE_MB, metadata_mb: int = METADATA_CACHE_MB) -> None:
    """Bound the LanceDB caches of every table this process opens from now on (0: LanceDB's own
    default for that cache). Tables opened before keep the caches they were opened with."""
    global _session
    with _session_lock:
        _session = _new_session(index_mb, metadata_mb)


def _lance_session() -> Any:
    """The session every connection of this process shares (made with the defaults on first use)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = _new_session(INDEX_CACHE_MB, METADATA_CACHE_MB)
        return _session


def cache_usage() -> dict[str, int]:
    """``{"bytes": …, "items": …}`` held by this process's LanceDB caches now."""
    session = _lance_session()
    return {"bytes": int(session.size_bytes), "items": int(session.approx_num_items)}


def arrow_memory() -> dict[str, Any]:
    """``{"pool": …, "bytes": …}``: this process's Arrow memory pool (``runtime.use_arrow_pool``)
    and the bytes Arrow has allocated in it now."""
    pool = pa.default_memory_pool()
    return {"pool": pool.backend_name, "bytes": int(pool.bytes_allocated())}


class RebuildNeeded(RuntimeError):
    """The table was built with other settings or another model; it must be rebuilt before use."""


def schema_for(dim: int, meta: dict[str, Any]) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string()),
            pa.field("chunk_id", pa.string()),
            pa.field("path", pa.string()),
            pa.field("content_hash", pa.string()),
            pa.field("chunk_index", pa.int32()),
            pa.field("window", pa.int32()),
            pa.field("start_line", pa.int32()),
            pa.field("end_line", pa.int32()),
            pa.field("language", pa.string()),
            pa.field("text", pa.string()),
            pa.field("keywords", pa.string()),
            pa.field("file_keywords", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dim)),
        ],
        metadata={META_KEY: json.dumps(meta, sort_keys=True).encode()},
    )


def attach_file_keywords(path: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give ``rows`` (all of one file's rows) their ``file_keywords``: the whole-file keyword text
    on the first row (lowest chunk index, window 0), ``''`` on the others. Mutates and returns."""
    firsts = sorted((r for r in rows if int(r["window"]) == 0), key=lambda r: int(r["chunk_index"]))
    for r in rows:
        r[FILE_KEYWORDS] = ""
    if firsts:
        firsts[0][FILE_KEYWORDS] = file_keyword_text([r["text"] for r in firsts], path)
    return rows


def sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def path_filter(paths: Iterable[str]) -> str:
    return "path IN (" + ", ".join(sql_str(p) for p in paths) + ")"


#: The SQL ``LIKE`` pattern of the rows written before their vectors (``indexing.PENDING_PREFIX``).
PENDING_LIKE = PENDING_PREFIX + "%"

SEARCH_COLUMNS = ["id", "chunk_id", "path", "content_hash", "chunk_index", "window", "start_line", "end_line", "language", "text"]


def table_mtime(folder: Path) -> float | None:
    """When the table in ``folder`` last got a new version (its ``_versions`` folder changes on
    every commit), or None when there is none."""
    try:
        return (Path(folder) / f"{TABLE}.lance" / "_versions").stat().st_mtime
    except OSError:
        return None


def _half_created(folder: Path) -> bool:
    """True when the table folder exists but no version of it was ever committed."""
    versions = folder / f"{TABLE}.lance" / "_versions"
    try:
        return not any(versions.iterdir())
    except FileNotFoundError:
        return True
    except OSError:
        return False  # unreadable: let opening it say why


class IndexStore:
    """A workspace's table. Open with ``open_writer`` (creates) or ``open_reader`` (None if absent)."""

    def __init__(self, folder: Path, table: Any, db: Any) -> None:
        self.folder = folder
        self.table = table
        self.db = db
        self._lock = threading.Lock()
        self._writes_since_optimize = 0
        #: when the table last changed: its last commit's time on disk when opened (so a restart
        #: does not read as "never"), then the time of each write
        self.last_update = table_mtime(folder) or 0.0
        #: files given their whole-file document when the writer opened the table (an older table)
        self.file_keywords_filled = 0
        self._paths: tuple[int, frozenset[str]] | None = None
        self._pending: tuple[int, int] | None = None
        #: (table version, monotonic time when counted, (term -> files, files)) of document_frequencies
        self._df: tuple[int, float, tuple[dict[str, int], int]] | None = None
        self._df_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ opening

    @classmethod
    def open_writer(cls, folder: str | Path, meta: dict[str, Any]) -> "IndexStore":
        """Open or create the table; raise RebuildNeeded when it was made with other settings."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        db = lancedb.connect(str(folder), session=_lance_session())
        if TABLE in db.list_tables().tables and not _half_created(folder):
            store = cls(folder, db.open_table(TABLE), db)
            problems = store.mismatch(meta)
            if problems:
                raise RebuildNeeded("rebuild needed: " + "; ".join(problems))
            store.file_keywords_filled = store.add_file_keywords()
            return store
        # a creation cut short (full disk, kill) leaves a table folder with no committed version,
        # which lancedb lists but cannot open: it holds no rows, so it is made again
        shutil.rmtree(folder / f"{TABLE}.lance", ignore_errors=True)
        table = db.create_table(TABLE, schema=schema_for(int(meta["dim"]), meta))
        store = cls(folder, table, db)
        store.ensure_indexes()
        return store

    @classmethod
    def open_reader(cls, folder: str | Path) -> "IndexStore | None":
        folder = Path(folder)
        if not folder.is_dir():
            return None
        db = lancedb.connect(str(folder), read_consistency_interval=timedelta(seconds=0), session=_lance_session())
        if TABLE not in db.list_tables().tables or _half_created(folder):
            return None
        return cls(folder, db.open_table(TABLE), db)

    @staticmethod
    def destroy(folder: str | Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ identity

    @property
    def meta(self) -> dict[str, Any]:
        raw = (self.table.schema.metadata or {}).get(META_KEY)
        return json.loads(raw) if raw else {}

    def mismatch(self, expected: dict[str, Any]) -> list[str]:
        """Human descriptions of every recorded setting that differs from ``expected``."""
        have = self.meta
        return [f"{k} is {have.get(k)!r} in the index but {v!r} now" for k, v in expected.items() if have.get(k) != v]

    # ------------------------------------------------------------------ writing

    @property
    def has_file_keywords(self) -> bool:
        return FILE_KEYWORDS in self.table.schema.names

    def add_file_keywords(self, batch_files: int = 2000) -> int:
        """Give a table made before the whole-file column its column, filled from the rows' own
        texts, and its index; returns the number of files filled (0 when there was nothing to do).

        The column is added empty in one commit, then filled a batch of files per commit; a crash
        in between leaves files without a whole-file document (they still have every chunk row),
        and the next open fills the rest. Readers meanwhile see fewer files in that list only.
        """
        filled = 0
        with self._lock:
            if not self.has_file_keywords:
                self.table.add_columns({FILE_KEYWORDS: "CAST('' AS STRING)"})
            empty = f"window = 0 AND chunk_index = 0 AND ({FILE_KEYWORDS} = '' OR {FILE_KEYWORDS} IS NULL)"
            todo = sorted(set(self.table.search().where(empty).select(["path"]).limit(None).to_arrow().column("path").to_pylist()))
            for start in range(0, len(todo), batch_files):
                paths = todo[start:start + batch_files]
                rows = (
                    self.table.search().where(f"window = 0 AND {path_filter(paths)}")
                    .select(["id", "path", "chunk_index", "window", "text"]).limit(None).to_arrow().to_pylist()
                )
                by_path: dict[str, list[dict[str, Any]]] = {}
                for r in rows:
                    by_path.setdefault(r["path"], []).append(r)
                ids, texts = [], []
                for path, file_rows in by_path.items():
                    for r in attach_file_keywords(path, file_rows):
                        if r[FILE_KEYWORDS]:
                            ids.append(r["id"])
                            texts.append(r[FILE_KEYWORDS])
                if ids:
                    self.table.merge_insert("id").when_matched_update_all().execute(pa.table({"id": ids, FILE_KEYWORDS: texts}))
                    filled += len(ids)
        self.ensure_indexes()
        if filled:
            # the filled rows were rewritten: fold them into both FTS indexes now, so that BM25
            # scores come from one index and not from an index plus a flat scan of the rest
            self.optimize()
        return filled

    def ensure_indexes(self) -> None:
        names = {i.name for i in self.table.list_indices()}
        if "keywords_idx" not in names:
            self.table.create_index("keywords", config=FTS(**FTS_CONFIG), replace=True)
        if f"{FILE_KEYWORDS}_idx" not in names and self.has_file_keywords:
            self.table.create_index(FILE_KEYWORDS, config=FTS(**FILE_FTS_CONFIG), replace=True)
        if "path_idx" not in names:
            self.table.create_index("path", config=BTree(), replace=True)

    def replace_file(self, path: str, rows: list[dict[str, Any]]) -> None:
        """Make ``rows`` the file's only rows, in one commit (no moment with both or neither)."""
        self.replace_files({path: rows})

    def replace_files(self, files: dict[str, list[dict[str, Any]]]) -> None:
        """Make each file's rows its only rows, all in one commit: a commit scans the table, so
        many small files written together cost one scan instead of one each."""
        with self._lock:
            empty = [p for p, rows in files.items() if not rows]
            full = {p: rows for p, rows in files.items() if rows}
            if full:
                data = pa.Table.from_pylist([r for p, rows in full.items() for r in attach_file_keywords(p, rows)], schema=self.table.schema)
                condition = f"path = {sql_str(next(iter(full)))}" if len(full) == 1 else path_filter(full)
                (
                    self.table.merge_insert("id")
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .when_not_matched_by_source_delete(condition)
                    .execute(data)
                )
                self._wrote()
            for path in empty:
                self.delete_file(path)

    def delete_file(self, path: str) -> None:
        self.table.delete(f"path = {sql_str(path)}")
        self._wrote()

    def _wrote(self) -> None:
        self._writes_since_optimize += 1
        self.last_update = time.time()

    @property
    def writes_since_optimize(self) -> int:
        """Writes not yet folded into the indexes and compacted (``optimize``)."""
        return self._writes_since_optimize

    def optimize_if_due(self, every: int) -> bool:
        """Fold new rows into the FTS/btree indexes and compact once ``every`` writes have piled up."""
        if self._writes_since_optimize < every:
            return False
        self.optimize()
        return True

    def optimize(self) -> None:
        with self._lock:
            self.table.optimize(cleanup_older_than=timedelta(minutes=10))
            self._writes_since_optimize = 0

    def needs_vector_index(self, min_rows: int = VECTOR_INDEX_MIN_ROWS) -> bool:
        return self.table.count_rows() >= min_rows and not any(i.name == "vector_idx" for i in self.table.list_indices())

    def ensure_vector_index(self, min_rows: int = VECTOR_INDEX_MIN_ROWS) -> bool:
        """Build the HNSW (scalar-quantised) vector index once the table is large enough.

        Rows added later are searched flat until the next ``optimize`` folds them in. The build
        takes minutes at a million rows, so callers run it off the write path (it does not take
        the writer lock: LanceDB commits it as its own version beside concurrent writes).
        """
        if not self.needs_vector_index(min_rows):
            return False
        self.table.create_index("vector", config=HnswSq(distance_type="cosine"), replace=True)
        return True

    # ------------------------------------------------------------------ reading

    def catalog(self) -> dict[str, str]:
        """``{path: content_hash}`` of every file with rows (read from window-0 rows)."""
        tbl = self.table.search().where("window = 0").select(["path", "content_hash"]).limit(None).to_arrow()
        return dict(zip(tbl.column("path").to_pylist(), tbl.column("content_hash").to_pylist()))

    def paths(self) -> frozenset[str]:
        """Every indexed file's path, cached until the table's version changes (a write)."""
        version = self.table.version
        cached = self._paths
        if cached is None or cached[0] != version:
            tbl = self.table.search().where("chunk_index = 0 AND window = 0").select(["path"]).limit(None).to_arrow()
            cached = self._paths = (version, frozenset(tbl.column("path").to_pylist()))
        return cached[1]

    def document_frequencies(self, wait: bool = False) -> tuple[dict[str, int], int] | None:
        """``(term -> number of files whose keyword text holds it, number of files)`` from the
        whole-file column, for weighing a long question's terms by rarity.

        Counting a big workspace takes a second or more, so it is cached: after a write, a call
        returns the previous counts and recounts in a background thread, at most once per
        ``DF_REFRESH_S``. Without counts yet (first call, or a table without the column) it returns
        None and starts the count, unless *wait* (benchmarks), which counts now when stale.
        """
        cached = self._df
        fresh = cached is not None and (cached[0] == self.table.version or time.monotonic() - cached[1] < DF_REFRESH_S)
        if not fresh and self.has_file_keywords:
            if wait:
                self._count_terms()
                cached = self._df
            else:
                with self._lock:
                    if self._df_thread is None or not self._df_thread.is_alive():
                        self._df_thread = threading.Thread(target=self._count_terms, name="term-count", daemon=True)
                        self._df_thread.start()
        return cached[2] if cached else None  # without waiting: the counts from before the recount

    def _count_terms(self) -> None:
        version, started = self.table.version, time.monotonic()
        try:
            col = self.table.search().where(f"{FILE_KEYWORDS} IS NOT NULL AND {FILE_KEYWORDS} != ''").select([FILE_KEYWORDS]).limit(None).to_arrow()
        except (OSError, ValueError, RuntimeError):
            return  # the table changed under us; the next call tries again
        df: Counter[str] = Counter()
        texts = col.column(FILE_KEYWORDS).to_pylist()
        for text in texts:
            df.update(set(text.split()))
        self._df = (version, started, (dict(df), len(texts)))

    def first_rows(self, paths: list[str]) -> list[dict[str, Any]]:
        """Each of ``paths``' first chunk row (chunk 0, window 0), in no particular order."""
        if not paths:
            return []
        q = self.table.search().where(f"{path_filter(paths)} AND chunk_index = 0 AND window = 0", prefilter=True)
        return q.select(SEARCH_COLUMNS).limit(len(paths) * 2).to_list()

    def counts(self) -> dict[str, int]:
        rows = self.table.count_rows()
        chunks = self.table.count_rows("window = 0") if rows else 0
        files = len(self.catalog()) if rows else 0
        return {"files": files, "chunks": chunks, "rows": rows}

    def vectors_pending(self) -> int:
        """Files whose rows are written but wait for their vectors (``indexing.PENDING_PREFIX``),
        counted once per table version."""
        version = self.table.version
        cached = self._pending
        if cached is None or cached[0] != version:
            n = self.table.count_rows(f"window = 0 AND chunk_index = 0 AND content_hash LIKE '{PENDING_LIKE}'")
            cached = self._pending = (version, n)
        return cached[1]

    def pending_paths(self, paths: list[str]) -> list[str]:
        """Those of *paths* whose rows wait for their vectors (written keywords first), in the
        order given; none without a read when no file waits."""
        if not paths or not self.vectors_pending():
            return []
        tbl = (self.table.search().where(f"window = 0 AND chunk_index = 0 AND content_hash LIKE '{PENDING_LIKE}' AND ({path_filter(paths)})")
               .select(["path"]).limit(None).to_arrow())
        waiting = set(tbl.column("path").to_pylist())
        return [p for p in paths if p in waiting]

    def vector_search(self, vector: np.ndarray, k: int, paths: list[str] | None = None) -> list[dict[str, Any]]:
        q = self.table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector").distance_type("cosine")
        if not paths:
            # With an ANN index, re-rank a wider pool exactly so recall stays near a flat scan.
            q = q.refine_factor(4) if hasattr(q, "refine_factor") else q
        where = [path_filter(paths)] if paths else []
        if self.vectors_pending():  # rows still waiting for their vectors hold a stand-in: never a vector hit
            where.append(f"content_hash NOT LIKE '{PENDING_LIKE}'")
        if where:
            q = q.where(" AND ".join(f"({w})" for w in where), prefilter=True)
        # Over-fetch windows: results are folded to one hit per chunk afterwards.
        return q.select([*SEARCH_COLUMNS, "_distance"]).limit(k * 3).to_list()

    def keyword_search(self, query: str, k: int, paths: list[str] | None = None) -> list[dict[str, Any]]:
        if not query.strip():
            return []
        q = self.table.search(query, query_type="fts", fts_columns="keywords")
        if paths:
            q = q.where(path_filter(paths), prefilter=True)
        return q.select([*SEARCH_COLUMNS, "_score"]).limit(k).to_list()

    def file_keyword_search(self, query: str, k: int) -> list[dict[str, Any]] | None:
        """The ``k`` files whose whole text best matches ``query`` (BM25 over ``file_keywords``),
        best first, one row per file (its first row, with ``_score``); None when the table has no
        such column (made by an older version and not yet opened by the writer)."""
        if not self.has_file_keywords:
            return None
        if not query.strip():
            return []
        q = self.table.search(query, query_type="fts", fts_columns=FILE_KEYWORDS)
        return q.select([*SEARCH_COLUMNS, "_score"]).limit(k).to_list()

    def rows_for_path(self, path: str) -> list[dict[str, Any]]:
        return self.table.search().where(f"path = {sql_str(path)}").select(SEARCH_COLUMNS).limit(None).to_list()
