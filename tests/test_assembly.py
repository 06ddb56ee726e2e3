"""Tests for daemons.lib.assembly (SPEC §2 cross-encoder threshold, §3 merging, budget, labels, context line)."""

from daemons.lib.assembly import (
    BUDGET_CHARS,
    CODE,
    DEGRADED_FUSED_ORDER,
    DEGRADED_KEYWORDS_ONLY,
    IMPORTS,
    MAX_BLOCK_CHARS,
    NEAR_MISS_COUNT,
    RERANK_THRESHOLD,
    SNIPPET_COUNT,
    Block,
    Hit,
    add_imports,
    budget,
    context_line,
    label,
    merge_hits,
    prompt_text,
)
from daemons.lib.pipeline import named_positions, select_by_threshold

FILE = "".join(f"line {i:03d} of the file\n" for i in range(1, 401))  # 21 chars a line


def _lines(a: int, b: int, text: str = FILE) -> str:
    return "".join(text.splitlines(keepends=True)[a - 1 : b])


def _hit(a, b, score=0.5, path="f.py", retrievers=("vector",), text=FILE, **kw):
    return Hit(path, a, b, _lines(a, b, text), score, list(retrievers), **kw)


def _block(path, n_chars, kind=CODE, score=0.5):
    return Block(path, 1, 1, "x" * n_chars, score, [], kind=kind)


def test_defaults_match_spec():
    """Blocks cap at 4,000, six snippets, 12,000 characters, threshold 0.08, three near misses."""
    assert (MAX_BLOCK_CHARS, SNIPPET_COUNT, BUDGET_CHARS) == (4000, 6, 12000)
    assert (RERANK_THRESHOLD, NEAR_MISS_COUNT) == (0.08, 3)


def test_overlapping_and_touching_hits_merge():
    """Hits that overlap or touch join into one block with the higher score and all retrievers."""
    hits = [_hit(10, 20, 0.3, retrievers=["vector"]), _hit(21, 30, 0.9, retrievers=["keyword"]), _hit(25, 28, 0.1)]
    (block,) = merge_hits(hits, {"f.py": FILE})
    assert (block.start_line, block.end_line) == (10, 30)
    assert block.score == 0.9 and block.retrievers == ["vector", "keyword"]
    assert block.text == _lines(10, 30)


def test_gap_keeps_hits_apart_and_other_files_never_merge():
    """Hits with a line between them, or in different files, stay separate blocks."""
    hits = [_hit(10, 20, 0.3), _hit(22, 30, 0.9), _hit(21, 21, 0.5, path="g.py")]
    blocks = merge_hits(hits, {"f.py": FILE, "g.py": FILE})
    assert [(b.path, b.start_line, b.score) for b in blocks] == [("f.py", 22, 0.9), ("g.py", 21, 0.5), ("f.py", 10, 0.3)]


def test_merge_up_to_4000_chars_not_beyond():
    """A join that would exceed 4,000 characters is not made."""
    # 21 chars a line: lines 1-150 = 3,150 chars; 151-190 adds 840 -> 3,990 fits; 151-200 -> 4,200 does not
    (ok,) = merge_hits([_hit(1, 150), _hit(151, 190)], {"f.py": FILE})
    assert len(ok.text) == 3990 and ok.end_line == 190
    apart = merge_hits([_hit(1, 150, 0.6), _hit(151, 200, 0.4)], {"f.py": FILE})
    assert [(b.start_line, b.end_line) for b in apart] == [(1, 150), (151, 200)]


def test_merge_without_file_text_stitches_hit_texts():
    """Without the file text, a merged block is stitched from the hits' texts."""
    (block,) = merge_hits([_hit(5, 8), _hit(7, 12)], {})
    assert block.text == _lines(5, 12)


def test_team_hits_after_local_and_labelled():
    """Team hits never merge with local ones, come after them and carry a team label."""
    blocks = merge_hits([_hit(1, 5, 0.99, team=True, team_name="core"), _hit(1, 5, 0.2)], {"f.py": FILE})
    assert [b.team for b in blocks] == [False, True]
    assert label(blocks[0]) == "f.py:1-5"
    assert label(blocks[1]) == "team:core:f.py:1-5"


def test_label_format():
    """A label is the file and its line range."""
    assert label(Block("src/auth/token.py", 10, 42, "", 0.5)) == "src/auth/token.py:10-42"


PY = "import os\nimport sys\n\n\n" + "".join(f"def f{i}():\n    return {i}\n\n" for i in range(100))


def test_imports_added_once_per_file_after_its_code():
    """The imports block is added once per file, right after that file's last code block."""
    hits = [_hit(40, 41, 0.9, text=PY), _hit(100, 101, 0.8, path="g.py"), _hit(60, 61, 0.7, text=PY)]
    blocks = add_imports(merge_hits(hits, {"f.py": PY, "g.py": FILE}), {"f.py": PY, "g.py": FILE}, {"f.py": "python", "g.py": None})
    assert [(b.path, b.kind) for b in blocks] == [("f.py", CODE), ("g.py", CODE), ("f.py", CODE), ("f.py", IMPORTS)]
    assert (blocks[-1].start_line, blocks[-1].end_line) == (1, 2)
    assert blocks[-1].text == "import os\nimport sys\n"


def test_imports_not_added_when_a_hit_covers_them():
    """No imports block is added when a hit already covers the imports."""
    blocks = add_imports(merge_hits([_hit(1, 8, text=PY)], {"f.py": PY}), {"f.py": PY}, {"f.py": "python"})
    assert [b.kind for b in blocks] == [CODE]


def test_imports_joined_into_touching_block():
    """Imports touching a code block are folded into that block."""
    blocks = add_imports(merge_hits([_hit(3, 8, text=PY)], {"f.py": PY}), {"f.py": PY}, {"f.py": "python"})
    assert [(b.kind, b.start_line, b.end_line) for b in blocks] == [(CODE, 1, 8)]


def test_imports_block_capped_at_1200():
    """The added imports block is at most 1,200 characters."""
    text = "".join(f"import module_number_{i:03d}_with_a_long_name\n" for i in range(60)) + "\n\n" + PY[22:]
    hit = Hit("f.py", 200, 201, _lines(200, 201, text), 0.5, [])
    blocks = add_imports(merge_hits([hit], {"f.py": text}), {"f.py": text}, {"f.py": "python"})
    assert blocks[-1].kind == IMPORTS and 1100 < len(blocks[-1].text) <= 1200


def test_snippet_count_six_imports_not_counted():
    """Only six code blocks are kept; imports blocks do not count as snippets."""
    blocks = []
    for i in range(8):
        blocks.append(_block(f"p{i}.py", 100))
        blocks.append(_block(f"p{i}.py", 50, kind=IMPORTS))
    kept = budget(blocks)
    assert [b.path for b in kept if b.kind == CODE] == [f"p{i}.py" for i in range(6)]
    assert sum(b.kind == IMPORTS for b in kept) == 6


def test_budget_skips_block_that_does_not_fit():
    """A block over the remaining 12,000-character budget is skipped, not the end of the list."""
    blocks = [_block("a", 5000), _block("b", 4000), _block("c", 3500), _block("d", 2500), _block("e", 500)]
    kept = budget(blocks)
    assert [b.path for b in kept] == ["a", "b", "d", "e"]
    assert sum(len(b.text) for b in kept) <= 12000


def test_imports_count_against_budget_and_need_their_code():
    """Imports text counts against the budget and is dropped when its file's code is dropped."""
    blocks = [_block("a", 11900), _block("a", 200, kind=IMPORTS), _block("b", 13000), _block("b", 50, kind=IMPORTS)]
    assert [(b.path, b.kind) for b in budget(blocks)] == [("a", CODE)]


def test_prompt_text_instruction_and_fenced_labels():
    """The prompt tells the model to cite labels and ignore unrelated blocks, then fences each block under its label."""
    blocks = [Block("a.py", 1, 2, "x = 1\ny = 2\n", 0.9, [], language="python"), Block("b.md", 3, 3, "has ``` inside", 0.4, [])]
    text = prompt_text("where is x?", blocks)
    assert "cite" in text.lower() and "ignore any block that does not bear on the question" in text.lower()
    assert "where is x?" in text
    assert "a.py:1-2\n```python\nx = 1\ny = 2\n```\n" in text
    assert "b.md:3-3\n````\nhas ``` inside\n````" in text


def test_context_line_contents():
    """The context line names the searched query, reranked count, kept probabilities, near misses and degraded modes."""
    line = context_line(
        "retry logic backoff", 12, [("a.py:1-20", 0.912), ("b.py:4-9", 0.33)], [("c.py:1-9", 0.07)], [DEGRADED_KEYWORDS_ONLY]
    )
    assert line == (
        'searched "retry logic backoff" · reranked 12 · kept a.py:1-20 0.91, b.py:4-9 0.33'
        " · near misses c.py:1-9 0.07 · keywords only (embedder unavailable)"
    )
    other = context_line("q\nx", 0, [], [], [DEGRADED_FUSED_ORDER])
    assert "\n" not in other and "kept none" in other and "near misses" not in other
    assert "fused order" in other


def test_select_by_threshold_and_three_near_misses():
    """Probabilities at or over 0.08 are kept; the three best of the rest are near misses; both descending."""
    scored = [("a", 0.5), ("b", 0.07), ("c", 0.08), ("d", 0.01), ("e", 0.9), ("f", 0.05), ("g", 0.02)]
    kept, near = select_by_threshold(scored)
    assert kept == [("e", 0.9), ("a", 0.5), ("c", 0.08)]
    assert near == [("b", 0.07), ("f", 0.05), ("g", 0.02)]


def test_the_best_chunk_of_each_named_file_is_kept_below_the_threshold():
    """A file the question names keeps its most probable chunk whatever the probability; its other chunks follow the threshold."""
    cands = [("a.py", {"vector": 1}, 0.5), ("n.py", {"keyword": 2}, 0.01), ("n.py", {"mentioned": 1}, 0.03),
             ("m.py", {"mentioned": 2}, 0.02), ("z.py", {"vector": 2}, 0.04)]
    always = named_positions(cands)
    assert always == {2, 3}
    kept, near = select_by_threshold([(p, prob) for p, _, prob in cands], always=always)
    assert kept == [("a.py", 0.5), ("n.py", 0.03), ("m.py", 0.02)]
    assert near == [("z.py", 0.04), ("n.py", 0.01)]


def test_a_newline_in_a_file_name_cannot_split_a_label():
    """Control characters of a path are written as escapes in labels, so a header stays one line; ordinary names are unchanged."""
    from daemons.lib.assembly import span_label

    assert span_label("src/a b/é.py", 3, 9) == "src/a b/é.py:3-9"
    odd = span_label("names/new\nline\tand\rcr.py", 1, 2)
    assert odd == "names/new\\nline\\tand\\rcr.py:1-2" and odd.isprintable()


def test_focus_note_names_the_focus_files_and_counts_those_used():
    """The context line names the first three focus files, counts the rest, and says how many gave a candidate through a focus list."""
    from daemons.lib.notes import focus_note

    cands = [("src/a.py", {"focus_vector": 1, "vector": 3}), ("src/b.py", {"keyword": 1}), ("src/c.py", {"focus_keyword": 2})]
    assert focus_note(["src/a.py", "src/b.py", "src/c.py", "src/d.py", "src/e.py"], cands) == "focus src/a.py, src/b.py, src/c.py (+2), 2 used"
    assert focus_note(["src/b.py"], cands) == "focus src/b.py, 0 used"
    assert focus_note([], cands) == ""


def test_file_change_tells_disk_editor_and_gone_apart():
    """A file is unchanged when its bytes (or the editor's buffer) hash to the indexed hash; else changed on disk, unsaved in the editor, or deleted."""
    from daemons.lib.notes import CHANGED_GONE, CHANGED_IN_EDITOR, CHANGED_ON_DISK, changed_note, file_change
    from daemons.lib.filtering import content_hash

    indexed = b"def f():\r\n    return 1\r\n"
    h = content_hash(indexed)
    assert file_change(h, indexed, None) == ""
    assert file_change(h, indexed + b"# more\r\n", None) == CHANGED_ON_DISK
    assert file_change(h, None, None) == CHANGED_GONE
    assert file_change(h, indexed, indexed.decode()) == ""  # the buffer is the indexed text
    assert file_change(h, indexed, "def f():\n    return 2\n") == CHANGED_IN_EDITOR
    newer = b"def f():\r\n    return 3\r\n"
    assert file_change(h, newer, "def f():\n    return 3\n") == CHANGED_ON_DISK  # the buffer shows what disk holds
    assert changed_note(["", CHANGED_ON_DISK, CHANGED_IN_EDITOR, CHANGED_ON_DISK]) == "3 blocks changed since indexed (2 on disk, 1 unsaved in the editor)"
    assert changed_note([CHANGED_GONE]) == "1 block changed since indexed (1 deleted)"
    assert changed_note(["", ""]) == ""


def test_chunk_content_hash_reads_the_hash_back_from_a_chunk_id():
    """The content hash a chunk id was made with comes back, also for a path holding '|'."""
    from daemons.lib.indexing import chunk_content_hash, chunk_id

    assert chunk_content_hash(chunk_id("a|b.py", "abc123", 4)) == "abc123"
    assert chunk_content_hash("no-separators") == ""


def test_progress_notes_tell_a_building_index_from_missing_vectors():
    """Files not in the table give 'index N% built'; files in it with keyword text only give 'vectors N% built'; none when all is done."""
    from daemons.lib.notes import progress_notes

    assert progress_notes({"files": 10, "indexed_files": 4, "pending": 6, "vectors_pending": 2}) == ["index 40% built (4 of 10 files, 6 pending)"]
    assert progress_notes({"files": 10, "indexed_files": 7, "pending": 3, "vectors_pending": 3}) == ["vectors 70% built (3 of 10 files searched by keywords only)"]
    assert progress_notes({"files": 10, "indexed_files": 10, "pending": 0, "vectors_pending": 0}) == []
    assert progress_notes({}) == []
