"""The table's file list published beside it (daemons/lib/catalog.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemons.lib import catalog


def test_a_catalog_counts_every_change_and_nothing_else() -> None:
    """Setting, deleting and popping an entry each count as a change; reading does not."""
    c = catalog.Catalog({"a.py": "h1"})
    assert c.changes == 0 and c == {"a.py": "h1"}
    c["b.py"] = "h2"
    c["a.py"] = "h3"
    assert c.changes == 2
    assert c.get("a.py") == "h3" and "b.py" in c and list(c) == ["a.py", "b.py"]
    assert c.changes == 2
    del c["b.py"]
    assert c.pop("missing", None) is None
    assert c.pop("a.py") == "h3"
    assert c.changes == 5 and c == {}


def test_a_published_list_reads_back_whole(tmp_path: Path) -> None:
    """What is published reads back equal, paths with spaces, unicode and escaped bytes included."""
    files = {"src/a b.py": "3f" * 32, "docs/caf\u00e9.md": "pending:" + "0a" * 32, "odd\\x.py": "ab" * 32}
    catalog.publish(tmp_path, files)
    assert catalog.read(tmp_path) == files
    catalog.publish(tmp_path, {})
    assert catalog.read(tmp_path) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == [catalog.CATALOG_FILE]  # no temporary file left


def test_no_list_reads_as_none_and_a_damaged_one_says_so(tmp_path: Path) -> None:
    """A folder without a list reads as None (the caller decides), and a file that is not a list of paths and hashes is a ValueError naming it."""
    assert catalog.read(tmp_path) is None
    assert catalog.read(tmp_path / "no-such-folder") is None
    (tmp_path / catalog.CATALOG_FILE).write_text('{"a.py": 3')
    with pytest.raises(ValueError, match="catalog.json"):
        catalog.read(tmp_path)
    (tmp_path / catalog.CATALOG_FILE).write_text('["a.py"]')
    with pytest.raises(ValueError, match="catalog.json"):
        catalog.read(tmp_path)


def test_a_failed_publish_keeps_the_previous_list(tmp_path: Path, monkeypatch) -> None:
    """When the new list cannot be put in place (a full disk), the error is raised, the previous list stays readable and no temporary file is left."""
    catalog.publish(tmp_path, {"a.py": "h1"})

    def no_space(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError, match="No space"):
        catalog.publish(tmp_path, {"a.py": "h2", "b.py": "h3"})
    monkeypatch.undo()
    assert catalog.read(tmp_path) == {"a.py": "h1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [catalog.CATALOG_FILE]
