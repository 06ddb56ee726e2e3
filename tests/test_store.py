"""The LanceDB table wrapper: identity, one-commit replacement, searches and the ANN index."""
from __future__ import annotations

import numpy as np
import pytest

from daemons.lib.store import IndexStore, RebuildNeeded

DIM = 16
META = {"model_id": "m@1", "dim": DIM, "chunker_version": "1", "chunk_max_chars": 1000}


def rows(path: str, h: str, n: int, rng: np.random.Generator, word: str = "alpha") -> list[dict]:
    out = []
    for i in range(n):
        v = rng.standard_normal(DIM).astype(np.float32)
        out.append({
            "id": f"{path}|{h}|{i}|0", "chunk_id": f"{path}|{h}|{i}", "path": path, "content_hash": h,
            "chunk_index": i, "window": 0, "start_line": i * 10 + 1, "end_line": i * 10 + 9, "language": "python",
            "text": f"def f{i}(): pass", "keywords": f"{word} chunk{i}", "vector": v / np.linalg.norm(v),
        })
    return out


@pytest.mark.timeout(120)
def test_replace_file_swaps_a_files_rows_and_catalog_follows(tmp_path) -> None:
    """Replacing a file's rows leaves only the new version's rows, and the catalog shows its hash."""
    rng = np.random.default_rng(0)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    store.replace_file("a.py", rows("a.py", "h1", 3, rng))
    store.replace_file("b.py", rows("b.py", "h1", 2, rng))
    store.replace_file("a.py", rows("a.py", "h2", 1, rng, word="beta"))
    assert store.catalog() == {"a.py": "h2", "b.py": "h1"}
    assert store.counts() == {"files": 2, "chunks": 3, "rows": 3}
    assert [r["path"] for r in store.keyword_search("beta", 5)] == ["a.py"]
    store.delete_file("b.py")
    assert store.catalog() == {"a.py": "h2"}


@pytest.mark.timeout(120)
def test_other_settings_mean_rebuild_needed(tmp_path) -> None:
    """Opening a table made with other settings raises RebuildNeeded naming the difference."""
    IndexStore.open_writer(tmp_path / "ix", META)
    with pytest.raises(RebuildNeeded, match="chunk_max_chars"):
        IndexStore.open_writer(tmp_path / "ix", {**META, "chunk_max_chars": 500})


@pytest.mark.timeout(300)
def test_vector_index_built_past_threshold_and_searches_still_find_rows(tmp_path) -> None:
    """Past the row threshold an HNSW index is built once, and vector and focus searches still work."""
    rng = np.random.default_rng(1)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    for f in range(6):
        store.replace_file(f"f{f}.py", rows(f"f{f}.py", "h", 100, rng))
    assert not store.needs_vector_index(min_rows=10_000)
    assert store.needs_vector_index(min_rows=500)
    assert store.ensure_vector_index(min_rows=500)
    assert not store.ensure_vector_index(min_rows=500)
    vec = np.asarray(store.table.search().where("id = 'f3.py|h|0|0'").limit(1).to_list()[0]["vector"], dtype=np.float32)
    hits = store.vector_search(vec, 5)
    assert hits[0]["chunk_id"] == "f3.py|h|0"
    focus = store.vector_search(vec, 3, paths=["f5.py"])
    assert focus and all(h["path"] == "f5.py" for h in focus)
