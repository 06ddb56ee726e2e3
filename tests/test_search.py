"""hybrid_search over a real LanceDB table: the lists it fuses, and the two file-ranked keyword lists."""
from __future__ import annotations

import numpy as np
import pytest

from daemons.lib.fusion import FILE_BM25, FILE_KEYWORD, KEYWORD, MENTIONED, VECTOR
from daemons.lib.mentions import mentions
from daemons.lib.roles import role_weights
from daemons.lib.search import SearchParams, hybrid_search, representatives
from daemons.lib.store import FILE_KEYWORDS, IndexStore
from tests.support import index_row

DIM = 8
META = {"model_id": "m@1", "dim": DIM, "chunker_version": "1", "chunk_max_chars": 1000}


@pytest.fixture
def store(tmp_path) -> IndexStore:
    """A table where ``src/session.py`` matches the question's words in two different chunks and
    ``src/codes.py`` holds the single best chunk for one of them."""
    rng = np.random.default_rng(5)
    s = IndexStore.open_writer(tmp_path / "ix", META)
    s.replace_file("src/session.py", [
        index_row("src/session.py", 0, "session redirect history", rng.standard_normal(DIM)),
        index_row("src/session.py", 1, "session cookie jar merge", rng.standard_normal(DIM)),
        index_row("src/session.py", 2, "session close adapters", rng.standard_normal(DIM)),
    ])
    s.replace_file("src/codes.py", [index_row("src/codes.py", 0, "redirect redirect status codes", rng.standard_normal(DIM))])
    for k in range(6):
        s.replace_file(f"src/other{k}.py", [index_row(f"src/other{k}.py", 0, f"unrelated{k} filler words", rng.standard_normal(DIM))])
    return s


@pytest.mark.timeout(120)
def test_file_keyword_list_votes_for_the_file_matching_more_of_the_question(store: IndexStore) -> None:
    """The fifth list ranks files by their two best keyword chunks, so a file matching two question words rises by file."""
    res = hybrid_search(store, "redirect cookie", None, params=SearchParams(file_list="chunks"))
    assert set(res.lists) == {KEYWORD, FILE_KEYWORD}
    files = [store_row_path(cid) for cid in res.lists[FILE_KEYWORD]]
    assert files[0] == "src/session.py"
    assert len(files) == len(set(files))  # one entry per file
    by_id = {c["chunk_id"]: c for c in res.candidates}
    best = by_id[res.lists[FILE_KEYWORD][0]]
    assert best["path"] == "src/session.py" and best["ranks"][FILE_KEYWORD] == 1
    # the strongest single chunk still leads on its own keyword rank; session's best chunk is next
    assert [c["path"] for c in res.candidates[:2]] == ["src/codes.py", "src/session.py"]


@pytest.mark.timeout(120)
def test_file_pool_zero_fuses_the_four_searches_alone(store: IndexStore) -> None:
    """With ``file_pool=0`` only the SPEC's lists are fused and no candidate carries a file-list rank."""
    q = np.random.default_rng(1).standard_normal(DIM).astype(np.float32)
    res = hybrid_search(store, "redirect cookie", q, params=SearchParams(file_pool=0))
    assert set(res.lists) == {VECTOR, KEYWORD}
    assert all(FILE_KEYWORD not in c["ranks"] and FILE_BM25 not in c["ranks"] for c in res.candidates)
    assert len(res.lists[KEYWORD]) <= 20


@pytest.mark.timeout(120)
def test_keyword_list_keeps_keyword_k_rows_while_the_pool_is_wider(store: IndexStore) -> None:
    """The keyword list is cut to ``keyword_k`` even though the search fetched the wider file pool."""
    res = hybrid_search(store, "session redirect cookie unrelated0 unrelated1", None, params=SearchParams(keyword_k=2, file_pool=50))
    assert len(res.lists[KEYWORD]) == 2
    assert len(res.lists[FILE_KEYWORD]) == 2 and len(res.lists[FILE_BM25]) == 2
    ids = {c["chunk_id"] for c in res.candidates}
    assert set(res.lists[FILE_KEYWORD]) | set(res.lists[FILE_BM25]) <= ids


@pytest.mark.timeout(120)
def test_whole_file_list_ranks_files_by_all_their_text_each_at_its_best_chunk(store: IndexStore) -> None:
    """The whole-file BM25 list puts the file holding both question words first, entered at its best keyword chunk."""
    res = hybrid_search(store, "redirect cookie", None, params=SearchParams(file_list="files"))
    assert set(res.lists) == {KEYWORD, FILE_BM25}
    files = [store_row_path(cid) for cid in res.lists[FILE_BM25]]
    assert files[0] == "src/session.py" and len(files) == len(set(files))
    assert res.lists[FILE_BM25][0] in res.lists[KEYWORD]  # a chunk that matched, not the file's first row by default


@pytest.mark.timeout(120)
def test_whole_file_list_weighs_tests_below_source_unless_asked(tmp_path) -> None:
    """A test file repeating the question's words more than the source ranks below it in the whole-file list, unless the question asks for tests."""
    rng = np.random.default_rng(7)
    s = IndexStore.open_writer(tmp_path / "ix", META)
    s.replace_file("tests/test_retry.py", [index_row("tests/test_retry.py", 0, "retry backoff retry backoff retry", rng.standard_normal(DIM))])
    s.replace_file("src/retry.py", [index_row("src/retry.py", 0, "retry backoff", rng.standard_normal(DIM))])
    weighted = hybrid_search(s, "retry backoff", None, params=SearchParams(file_list="files", role_weights=role_weights("where is retry backoff?", 0.5, 0.5)))
    assert [store_row_path(c) for c in weighted.lists[FILE_BM25]] == ["src/retry.py", "tests/test_retry.py"]
    asked = hybrid_search(s, "retry backoff", None, params=SearchParams(file_list="files", role_weights=role_weights("how is retry backoff tested?", 0.5, 0.5)))
    assert [store_row_path(c) for c in asked.lists[FILE_BM25]][0] == "tests/test_retry.py"


@pytest.mark.timeout(120)
def test_a_table_without_the_whole_file_column_still_answers_with_the_pooled_list(store: IndexStore) -> None:
    """Until the writer adds the whole-file column, a reader fuses the pooled file list alone."""
    store.table.drop_columns([FILE_KEYWORDS])
    reader = IndexStore.open_reader(store.folder)
    res = hybrid_search(reader, "redirect cookie", None)
    assert set(res.lists) == {KEYWORD, FILE_KEYWORD}


def test_representatives_prefer_keyword_then_vector_chunks_then_the_first_row() -> None:
    """A file enters at its best keyword chunk, else its nearest vector chunk, else the row its document lives on."""
    files = [{"path": p, "chunk_id": f"{p}|h|0", "_score": 3.0 - i} for i, p in enumerate(["a.py", "b.py", "c.py"])]
    keyword = [{"path": "a.py", "chunk_id": "a.py|h|4"}, {"path": "a.py", "chunk_id": "a.py|h|2"}]
    vector = [{"path": "b.py", "chunk_id": "b.py|h|7"}, {"path": "a.py", "chunk_id": "a.py|h|9"}]
    out = representatives(files, keyword, vector)
    assert [r["chunk_id"] for r in out] == ["a.py|h|4", "b.py|h|7", "c.py|h|0"]
    assert [r["file_score"] for r in out] == [3.0, 2.0, 1.0]
    assert "file_score" not in keyword[0]  # copies


@pytest.mark.timeout(120)
def test_a_file_the_question_names_is_fused_at_its_best_chunk_or_its_first(store: IndexStore) -> None:
    """Files named in the question (a traceback path, a dotted module) form the ``mentioned`` list in order of mention."""
    q = 'redirect fails:\n  File "/home/me/proj/src/other3.py", line 4\nsee src.codes.STATUS'
    res = hybrid_search(store, "redirect", None, params=SearchParams(file_list="chunks", mentioned=mentions(q)))
    assert [store_row_path(c) for c in res.lists[MENTIONED]] == ["src/other3.py", "src/codes.py"]
    by_id = {c["chunk_id"]: c for c in res.candidates}
    assert res.lists[MENTIONED][0] == "src/other3.py|h|0"  # no search row of it: its first chunk
    assert by_id[res.lists[MENTIONED][0]]["ranks"] == {MENTIONED: 1}
    assert by_id[res.lists[MENTIONED][1]]["ranks"][KEYWORD] == 1  # the keyword hit stands for it
    assert MENTIONED in res.timings_ms
    plain = hybrid_search(store, "redirect", None, params=SearchParams(file_list="chunks", mentioned=mentions("why does redirect fail?")))
    assert MENTIONED not in plain.lists and "src/other3.py" not in {c["path"] for c in plain.candidates}


@pytest.mark.timeout(120)
def test_the_path_set_follows_writes(store: IndexStore) -> None:
    """``paths`` lists every indexed file and changes when a file is added or deleted; ``first_rows`` finds chunk 0."""
    before = store.paths()
    assert before == {"src/session.py", "src/codes.py", *(f"src/other{k}.py" for k in range(6))}
    assert store.paths() is before  # cached while the table is unchanged
    store.delete_file("src/codes.py")
    store.replace_file("src/new.py", [index_row("src/new.py", 0, "fresh", np.ones(DIM))])
    assert store.paths() == (before - {"src/codes.py"}) | {"src/new.py"}
    rows = store.first_rows(["src/session.py", "src/gone.py"])
    assert [(r["path"], r["chunk_index"]) for r in rows] == [("src/session.py", 0)]


def store_row_path(chunk_id: str) -> str:
    return chunk_id.split("|", 1)[0]


def test_an_unknown_file_list_is_refused_by_settings_and_search(store: IndexStore) -> None:
    """``file_list`` must be both, chunks or files: the settings loader and hybrid_search both say so."""
    from daemons.lib.config import load_settings

    with pytest.raises(ValueError, match="file_list"):
        load_settings(config_file="/nonexistent.toml", env={"WSCTX_FILE_LIST": "whole"})
    with pytest.raises(ValueError, match="file_list"):
        hybrid_search(store, "redirect", None, params=SearchParams(file_list="whole"))
    assert load_settings(config_file="/nonexistent.toml", env={"WSCTX_FILE_LIST": "chunks"}).file_list == "chunks"
