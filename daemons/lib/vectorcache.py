"""Window vectors by content: a window whose text one model has embedded before is never embedded again.

Switching a workspace to a branch that changes 50 files, adding a second version of the same
repository, or appending a function to a long file re-embeds only the windows whose text is new.
The key is a digest of (model id, the exact text the model reads), so nothing from another model
or another window shape can be returned. Vectors are kept as float32 bytes in one SQLite file
(``<data_dir>/vectors/<model>.sqlite``, WAL, one writer: the embedder), at most ``max_rows`` of
them; past that the oldest inserted go first. A cache that cannot be opened or written is logged
by the caller and indexing goes on without it. No sockets here.
"""
from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

#: SQLite's limit on host parameters in one statement is 32,766; lookups go in chunks well below.
LOOKUP_CHUNK = 500


def window_key(model_id: str, text: str) -> bytes:
    """The cache key of *text* as embedded by *model_id*."""
    h = hashlib.blake2b(digest_size=20)
    model = model_id.encode("utf-8")
    h.update(len(model).to_bytes(4, "little"))
    h.update(model)
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.digest()


def cache_file(data_dir: str | Path, model_id: str) -> Path:
    """Where *model_id*'s window vectors live under *data_dir*."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)[:120] or "model"
    return Path(data_dir) / "vectors" / f"{safe}.sqlite"


class VectorCache:
    """One model's window vectors (``dim`` float32 each), at most ``max_rows``."""

    def __init__(self, path: str | Path, model_id: str, dim: int, max_rows: int) -> None:
        self.path = Path(path)
        self.model_id = model_id
        self.dim = int(dim)
        self.max_rows = int(max_rows)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vec BLOB NOT NULL)")
        self.rows = self.db.execute("SELECT COUNT(*) FROM vectors").fetchone()[0]

    def close(self) -> None:
        self.db.close()

    def keys(self, texts: Iterable[str]) -> list[bytes]:
        return [window_key(self.model_id, t) for t in texts]

    def get_many(self, keys: list[bytes]) -> dict[bytes, np.ndarray]:
        """The vectors held for any of *keys* (a wrong-sized entry counts as absent)."""
        found: dict[bytes, np.ndarray] = {}
        want = list(dict.fromkeys(keys))
        for i in range(0, len(want), LOOKUP_CHUNK):
            part = want[i : i + LOOKUP_CHUNK]
            marks = ",".join("?" * len(part))
            for key, blob in self.db.execute(f"SELECT key, vec FROM vectors WHERE key IN ({marks})", part):
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape[0] == self.dim:
                    found[bytes(key)] = vec
        return found

    def put_many(self, items: list[tuple[bytes, np.ndarray]]) -> None:
        """Keep these vectors, then drop the oldest past ``max_rows``."""
        if not items or self.max_rows <= 0:
            return
        with self.db:
            self.db.execute("BEGIN")
            cur = self.db.executemany(
                "INSERT OR IGNORE INTO vectors (key, vec) VALUES (?, ?)",
                [(key, np.ascontiguousarray(vec, dtype=np.float32).tobytes()) for key, vec in items],
            )
            self.rows += max(0, cur.rowcount)
            if self.rows > self.max_rows:
                excess = self.rows - self.max_rows
                self.db.execute("DELETE FROM vectors WHERE rowid IN (SELECT rowid FROM vectors ORDER BY rowid LIMIT ?)", (excess,))
                self.rows -= excess

    def holds_all(self, texts: list[str]) -> bool:
        """Whether a vector is kept for every one of *texts* (then embedding them costs nothing)."""
        keys = set(self.keys(texts))
        return len(self.get_many(list(keys))) == len(keys)

    def embed(self, texts: list[str], embed: Callable[[list[str]], np.ndarray]) -> tuple[np.ndarray, int]:
        """Vectors for *texts* (in order): held ones from the cache, the rest from *embed* (each
        distinct text once), which are then kept. Returns the vectors and how many were not
        embedded (held, or repeated in *texts*)."""
        keys = self.keys(texts)
        held = self.get_many(keys)
        # each text not held is embedded once, however often it occurs here
        first: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in held:
                first.setdefault(k, i)
        if first:
            fresh = embed([texts[i] for i in first.values()])
            new = dict(zip(first, fresh))
            self.put_many(list(new.items()))
            held = {**held, **new}
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, k in enumerate(keys):
            out[i] = held[k]
        return out, len(texts) - len(first)

