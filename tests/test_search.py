"""hybrid_search over a real LanceDB table: the lists it fuses, and the file-ranked keyword list."""
from __future__ import annotations

import numpy as np
import pytest

from daemons.lib.fusion import FILE_KEYWORD, KEYWORD, VECTOR
from daemons.lib.search import hybrid_search
from daemons.lib.store import IndexStore
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
    res = hybrid_search(store, "redirect cookie", None)
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
    res = hybrid_search(store, "redirect cookie", q, file_pool=0)
    assert set(res.lists) == {VECTOR, KEYWORD}
    assert all(FILE_KEYWORD not in c["ranks"] for c in res.candidates)
    assert len(res.lists[KEYWORD]) <= 20


@pytest.mark.timeout(120)
def test_keyword_list_keeps_keyword_k_rows_while_the_pool_is_wider(store: IndexStore) -> None:
    """The keyword list is cut to ``keyword_k`` even though the search fetched the wider file pool."""
    res = hybrid_search(store, "session redirect cookie unrelated0 unrelated1", None, keyword_k=2, file_pool=50)
    assert len(res.lists[KEYWORD]) == 2
    assert len(res.lists[FILE_KEYWORD]) == 2
    ids = {c["chunk_id"] for c in res.candidates}
    assert set(res.lists[FILE_KEYWORD]) <= ids


def store_row_path(chunk_id: str) -> str:
    return chunk_id.split("|", 1)[0]
