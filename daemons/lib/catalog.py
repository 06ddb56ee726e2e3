"""A table's file list, ``{path: content hash}``, published beside it as a small JSON file.

The embedder, the table's one writer, keeps the list in memory (``Catalog``) and writes it out
(``publish``) when it opens a table and after each change (at most every ``PUBLISH_EVERY_S``
while a backlog is being written). The watcher
reads it (``read``) to compare the disk with the table, so it never loads LanceDB and pyarrow
(about 100 MB resident) for that.

The file may lag the table, never lead it: it is written from what was committed, after the
commit. A lagging file only makes the watcher send a file again (the embedder skips it as
unchanged) or wait a moment longer for what it sent to show. A table dropped (rebuild, remove)
goes with its folder, the file included, and the embedder publishes the new empty list at once.
"""
from __future__ import annotations

import os
from pathlib import Path

import msgspec

CATALOG_FILE = "catalog.json"
#: While more chunker messages wait, the file is rewritten at most this often (a rewrite costs
#: about a millisecond per thousand files); otherwise after each change.
PUBLISH_EVERY_S = 1.0


class Catalog(dict[str, str]):
    """``{path: content hash}`` that counts its own changes, so that a writer knows when to publish."""

    changes: int = 0

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        self.changes += 1

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.changes += 1

    def pop(self, key: str, *default: str | None) -> str | None:  # type: ignore[override]
        self.changes += 1
        return super().pop(key, *default)


def publish(folder: str | Path, catalog: dict[str, str]) -> None:
    """Write *catalog* to ``<folder>/catalog.json`` atomically (a reader sees the old file or the
    new one, never a part). Raises OSError (a full disk); the previous file then stays."""
    path = Path(folder) / CATALOG_FILE
    tmp = path.with_name(f".{CATALOG_FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(msgspec.json.encode(catalog))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read(folder: str | Path) -> dict[str, str] | None:
    """The published list of the table in *folder*; None when there is none (no table yet, or an
    index made before lists were published). Raises ValueError for a file that is not a list of
    paths and hashes."""
    try:
        raw = (Path(folder) / CATALOG_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(raw, type=dict[str, str])
    except msgspec.DecodeError as exc:
        raise ValueError(f"{CATALOG_FILE} in {folder} is unreadable: {exc}") from exc
