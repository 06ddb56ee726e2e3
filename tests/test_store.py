"""The LanceDB table wrapper: identity, one-commit replacement, searches and the ANN index."""
from __future__ import annotations

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from daemons.lib import store as store_mod
from daemons.lib.keywords import file_keyword_text
from daemons.lib.store import FILE_KEYWORDS, TABLE, IndexStore, RebuildNeeded, schema_for

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


@pytest.mark.timeout(120)
def test_each_file_gets_one_whole_file_document_on_its_first_row(tmp_path) -> None:
    """The first row of a file carries its whole-file keywords and every other row carries none."""
    rng = np.random.default_rng(2)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    file_rows = rows("pkg/a.py", "h", 3, rng)
    second_window = dict(file_rows[0], id="pkg/a.py|h|0|1", window=1)
    store.replace_file("pkg/a.py", [file_rows[2], second_window, file_rows[1], file_rows[0]])
    got = {r["id"]: r[FILE_KEYWORDS] for r in store.table.to_arrow().to_pylist()}
    assert got.pop("pkg/a.py|h|0|0") == file_keyword_text(["def f0(): pass", "def f1(): pass", "def f2(): pass"], "pkg/a.py")
    assert set(got.values()) == {""}
    assert [r["path"] for r in store.file_keyword_search("f1 f2", 5)] == ["pkg/a.py"]


@pytest.mark.timeout(120)
def test_a_table_without_the_whole_file_column_gains_it_on_open_without_reembedding(tmp_path) -> None:
    """A table made before ``file_keywords`` existed is searchable by file after the writer opens it, vectors untouched."""
    rng = np.random.default_rng(3)
    folder = tmp_path / "ix"
    old_schema = pa.schema([f for f in schema_for(DIM, META) if f.name != FILE_KEYWORDS], metadata=schema_for(DIM, META).metadata)
    db = lancedb.connect(str(folder))
    old = [*rows("a.py", "h", 2, rng), *rows("b.py", "h", 2, rng)]
    old[0]["text"], old[3]["text"] = "def retry_request(): pass", "def backoff_delay(): pass"
    db.create_table(TABLE, data=pa.Table.from_pylist(old, schema=old_schema))
    reader = IndexStore.open_reader(folder)
    assert reader.file_keyword_search("retry", 5) is None  # no column yet: callers fall back
    store = IndexStore.open_writer(folder, META)
    assert store.has_file_keywords
    assert [r["path"] for r in store.file_keyword_search("backoff", 5)] == ["b.py"]
    assert [r["path"] for r in reader.file_keyword_search("retry", 5)] == ["a.py"]  # a reader sees it too
    before = {r["id"]: r["vector"] for r in old}
    after = store.table.search().select(["id", "vector"]).limit(None).to_list()
    assert all(np.allclose(r["vector"], before[r["id"]]) for r in after) and len(after) == len(old)
    assert store.add_file_keywords() == 0  # nothing left to fill


@pytest.mark.timeout(120)
def test_files_left_without_a_whole_file_document_are_filled_at_the_next_open(tmp_path) -> None:
    """A file whose whole-file document is empty (a fill cut short) gets it when the writer next opens the table."""
    rng = np.random.default_rng(4)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    store.replace_file("a.py", rows("a.py", "h", 2, rng))
    store.replace_file("b.py", rows("b.py", "h", 2, rng))
    store.table.update(where="path = 'b.py'", values={FILE_KEYWORDS: ""})
    assert [r["path"] for r in store.file_keyword_search("f1", 5)] == ["a.py"]
    reopened = IndexStore.open_writer(tmp_path / "ix", META)
    assert sorted(r["path"] for r in reopened.file_keyword_search("f1", 5)) == ["a.py", "b.py"]


@pytest.mark.timeout(120)
def test_a_reopened_table_reports_its_last_write_not_never(tmp_path) -> None:
    """After a restart the store's last update is its table's last commit time, not 0 ("never"); a new table's is its creation."""
    import os
    import time

    rng = np.random.default_rng(0)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    store.replace_file("a.py", rows("a.py", "h1", 2, rng))
    written = store.last_update
    versions = tmp_path / "ix" / f"{TABLE}.lance" / "_versions"
    past = time.time() - 3600
    os.utime(versions, (past, past))  # as if written an hour ago, before the restart
    for reopened in (IndexStore.open_writer(tmp_path / "ix", META), IndexStore.open_reader(tmp_path / "ix")):
        assert reopened.last_update == pytest.approx(past, abs=1)
    assert written > past


@pytest.mark.timeout(120)
def test_document_frequencies_count_files_per_term_and_follow_writes(tmp_path, monkeypatch) -> None:
    """Term counts are files per keyword term; after a write a call returns the old counts and recounts in the background."""
    rng = np.random.default_rng(3)
    store = IndexStore.open_writer(tmp_path / "ix", META)
    store.replace_file("a.py", rows("a.py", "h1", 2, rng))
    store.replace_file("b.py", rows("b.py", "h1", 1, rng))
    df, files = store.document_frequencies(wait=True)
    assert files == 2
    assert df["f0"] == 2 and df["f1"] == 1 and df["py"] == 2 and "c" not in df
    store.replace_file("c.py", rows("c.py", "h1", 1, rng))
    monkeypatch.setattr(store_mod, "DF_REFRESH_S", 0.0)  # any change is stale at once
    stale = store.document_frequencies()
    assert stale is not None and "c" not in stale[0]
    store._df_thread.join(30)
    df, files = store.document_frequencies()
    assert files == 3 and df["c"] == 1


def _write_and_search(folder, rng: np.random.Generator, writes: int) -> None:
    """``writes`` one-file rewrites, each with an optimize every 10 and a keyword and vector search
    through a reader that follows every version, as the embedder and the searcher do."""
    writer = IndexStore.open_writer(folder, META)
    for k in range(40):
        writer.replace_file(f"src/f{k}.py", rows(f"src/f{k}.py", "h0", 5, rng, word=f"w{k % 7}"))
    reader = IndexStore.open_reader(folder)
    for n in range(1, writes + 1):
        writer.replace_file(f"src/f{n % 40}.py", rows(f"src/f{n % 40}.py", f"h{n}", 5, rng, word=f"w{n % 7}"))
        if n % 10 == 0:
            writer.optimize()
        reader.keyword_search(f"w{n % 7} chunk1", 10)
        reader.vector_search(rows("q", "q", 1, rng)[0]["vector"], 10)


@pytest.fixture
def restore_caches():
    yield
    store_mod.configure_caches()


@pytest.mark.timeout(300)
def test_lancedb_caches_stay_within_their_bounds_over_many_table_versions(tmp_path, restore_caches) -> None:
    """Every write makes a table version whose pages LanceDB caches; bounded caches stay under their bound, LanceDB's own do not."""
    store_mod.configure_caches(1, 1)
    _write_and_search(tmp_path / "bounded", np.random.default_rng(3), 80)
    bounded = store_mod.cache_usage()
    assert 0 < bounded["bytes"] <= 2 << 20, bounded
    store_mod.configure_caches(0, 0)  # LanceDB's own sizes: 6 GiB and 1 GiB
    _write_and_search(tmp_path / "default", np.random.default_rng(3), 80)
    assert store_mod.cache_usage()["bytes"] > 2 * bounded["bytes"], (store_mod.cache_usage(), bounded)
