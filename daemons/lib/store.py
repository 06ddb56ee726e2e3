"""One LanceDB table per workspace: the rows, their identity, the FTS index, and the searches.

A row is one embedded window of one chunk, keyed by ``id = path|content_hash|chunk|window``.
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
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.index import FTS, BTree, HnswSq

TABLE = "chunks"
#: Past this many rows a flat vector scan gets slow (~100 ms at 50k rows on 2 cores): build HNSW.
VECTOR_INDEX_MIN_ROWS = 50_000
META_KEY = b"wsctx"
FTS_CONFIG = dict(
    with_position=True, base_tokenizer="simple", language="English", lower_case=True, stem=True,
    remove_stop_words=False, ascii_folding=True,
)


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
            pa.field("vector", pa.list_(pa.float32(), dim)),
        ],
        metadata={META_KEY: json.dumps(meta, sort_keys=True).encode()},
    )


def sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def path_filter(paths: Iterable[str]) -> str:
    return "path IN (" + ", ".join(sql_str(p) for p in paths) + ")"


SEARCH_COLUMNS = ["id", "chunk_id", "path", "content_hash", "chunk_index", "window", "start_line", "end_line", "language", "text"]


class IndexStore:
    """A workspace's table. Open with ``open_writer`` (creates) or ``open_reader`` (None if absent)."""

    def __init__(self, folder: Path, table: Any, db: Any) -> None:
        self.folder = folder
        self.table = table
        self.db = db
        self._lock = threading.Lock()
        self._writes_since_optimize = 0
        self.last_update = 0.0

    # ------------------------------------------------------------------ opening

    @classmethod
    def open_writer(cls, folder: str | Path, meta: dict[str, Any]) -> "IndexStore":
        """Open or create the table; raise RebuildNeeded when it was made with other settings."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        db = lancedb.connect(str(folder))
        if TABLE in db.list_tables().tables:
            store = cls(folder, db.open_table(TABLE), db)
            problems = store.mismatch(meta)
            if problems:
                raise RebuildNeeded("rebuild needed: " + "; ".join(problems))
            return store
        table = db.create_table(TABLE, schema=schema_for(int(meta["dim"]), meta))
        store = cls(folder, table, db)
        store.ensure_indexes()
        return store

    @classmethod
    def open_reader(cls, folder: str | Path) -> "IndexStore | None":
        folder = Path(folder)
        if not folder.is_dir():
            return None
        db = lancedb.connect(str(folder), read_consistency_interval=timedelta(seconds=0))
        if TABLE not in db.list_tables().tables:
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

    def ensure_indexes(self) -> None:
        names = {i.name for i in self.table.list_indices()}
        if "keywords_idx" not in names:
            self.table.create_index("keywords", config=FTS(**FTS_CONFIG), replace=True)
        if "path_idx" not in names:
            self.table.create_index("path", config=BTree(), replace=True)

    def replace_file(self, path: str, rows: list[dict[str, Any]]) -> None:
        """Make ``rows`` the file's only rows, in one commit (no moment with both or neither)."""
        with self._lock:
            if not rows:
                self.delete_file(path)
                return
            data = pa.Table.from_pylist(rows, schema=self.table.schema)
            (
                self.table.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .when_not_matched_by_source_delete(f"path = {sql_str(path)}")
                .execute(data)
            )
            self._wrote()

    def delete_file(self, path: str) -> None:
        self.table.delete(f"path = {sql_str(path)}")
        self._wrote()

    def _wrote(self) -> None:
        self._writes_since_optimize += 1
        self.last_update = time.time()

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

    def counts(self) -> dict[str, int]:
        rows = self.table.count_rows()
        chunks = self.table.count_rows("window = 0") if rows else 0
        files = len(self.catalog()) if rows else 0
        return {"files": files, "chunks": chunks, "rows": rows}

    def vector_search(self, vector: np.ndarray, k: int, paths: list[str] | None = None) -> list[dict[str, Any]]:
        q = self.table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector").distance_type("cosine")
        if not paths:
            # With an ANN index, re-rank a wider pool exactly so recall stays near a flat scan.
            q = q.refine_factor(4) if hasattr(q, "refine_factor") else q
        if paths:
            q = q.where(path_filter(paths), prefilter=True)
        # Over-fetch windows: results are folded to one hit per chunk afterwards.
        return q.select([*SEARCH_COLUMNS, "_distance"]).limit(k * 3).to_list()

    def keyword_search(self, query: str, k: int, paths: list[str] | None = None) -> list[dict[str, Any]]:
        if not query.strip():
            return []
        q = self.table.search(query, query_type="fts", fts_columns="keywords")
        if paths:
            q = q.where(path_filter(paths), prefilter=True)
        return q.select([*SEARCH_COLUMNS, "_score"]).limit(k).to_list()

    def rows_for_path(self, path: str) -> list[dict[str, Any]]:
        return self.table.search().where(f"path = {sql_str(path)}").select(SEARCH_COLUMNS).limit(None).to_list()
