"""Tests for daemons.lib.chunking (SPEC section 1, chunking along syntax)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from daemons.lib.chunking import (
    CHUNKER_VERSION,
    EXTENSION_LANGUAGES,
    FILENAME_LANGUAGES,
    Chunk,
    ChunkSettings,
    _merge_small,
    chunk_text,
    get_parser,
    language_for_path,
    parse,
)

_WS = re.compile(r"\s+")


def assert_covers(text: str, chunks: list[Chunk], settings: ChunkSettings = ChunkSettings()) -> None:
    """Check the chunks cover every non-blank character once, in order, with sane line numbers."""
    assert _WS.sub("", "".join(c.text for c in chunks)) == _WS.sub("", text)
    lines = text.split("\n")
    prev_end = 0
    for i, c in enumerate(chunks):
        assert c.index == i
        assert c.text.strip()
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        assert c.start_line >= prev_end  # equal only when a long line was cut by characters
        if c.start_line == c.end_line:
            assert c.text in lines[c.start_line - 1]
        else:
            # a line cut by characters can leave a chunk starting or ending inside a line, so the
            # text is: the end of its first line, the lines between whole, the start of its last
            first, *middle, last = c.text.split("\n")
            assert lines[c.start_line - 1].endswith(first) and lines[c.end_line - 1].startswith(last)
            assert middle == lines[c.start_line:c.end_line - 1]
        assert len(c.context) <= settings.context_chars
        assert c.full_text == c.context + c.text
        prev_end = c.end_line


def _functions(lang: str, count: int = 6) -> tuple[str, set[int]]:
    """Build a file of ``count`` functions in ``lang``; return text and 1-based start lines."""
    head, tail = "", ""
    if lang == "python":
        fn = lambda i: "def f%d(a, b):\n%s    return x0\n" % (
            i, "".join("    x%d = a + b * %d  # step %d\n" % (j, j, j) for j in range(10)))
    elif lang in ("typescript", "tsx"):
        fn = lambda i: "function f%d(a: number, b: number): number {\n%s  return x0;\n}\n" % (
            i, "".join("  const x%d = a + b * %d; // step %d\n" % (j, j, j) for j in range(10)))
    elif lang == "javascript":
        fn = lambda i: "function f%d(a, b) {\n%s  return x0;\n}\n" % (
            i, "".join("  const x%d = a + b * %d; // step %d\n" % (j, j, j) for j in range(10)))
    elif lang == "go":
        head = "package main\n\n"
        fn = lambda i: "func f%d(a int, b int) int {\n%s\treturn a\n}\n" % (
            i, "".join("\tx%d := a + b*%d // step %d\n" % (j, j, j) for j in range(10)))
    elif lang == "rust":
        fn = lambda i: "fn f%d(a: i64, b: i64) -> i64 {\n%s    a\n}\n" % (
            i, "".join("    let x%d = a + b * %d; // step %d\n" % (j, j, j) for j in range(10)))
    elif lang == "java":
        head, tail = "public class C {\n", "}\n"
        fn = lambda i: "    int f%d(int a, int b) {\n%s        return a;\n    }\n" % (
            i, "".join("        int x%d = a + b * %d; // step %d\n" % (j, j, j) for j in range(10)))
    elif lang in ("c", "cpp"):
        if lang == "cpp":
            head, tail = "namespace ns {\n", "}  // namespace ns\n"
        fn = lambda i: "int f%d(int a, int b) {\n%s    return a;\n}\n" % (
            i, "".join("    int x%d = a + b * %d; /* step %d */\n" % (j, j, j) for j in range(10)))
    elif lang == "ruby":
        fn = lambda i: "def f%d(a, b)\n%s  a\nend\n" % (
            i, "".join("  x%d = a + b * %d # step %d\n" % (j, j, j) for j in range(10)))
    else:  # pragma: no cover
        raise AssertionError(lang)
    text = head
    starts: set[int] = set()
    for i in range(count):
        starts.add(text.count("\n") + 1)
        text += fn(i) + "\n"
    return text + tail, starts


LANG_FILES = {
    "python": "pkg/mod.py", "typescript": "src/a.ts", "tsx": "src/a.tsx",
    "javascript": "src/a.js", "go": "main.go", "rust": "src/lib.rs", "java": "src/C.java",
    "c": "src/a.c", "cpp": "src/a.cpp", "ruby": "lib/a.rb",
}


def test_defaults_match_spec() -> None:
    """The default settings are the SPEC numbers and the chunker version is a string."""
    s = ChunkSettings()
    assert (s.max_chars, s.min_chars, s.context_chars) == (1000, 100, 100)
    assert CHUNKER_VERSION == "1"


@pytest.mark.parametrize(
    "path,lang",
    [("a.py", "python"), ("a.pyi", "python"), ("a.ts", "typescript"), ("a.mts", "typescript"),
     ("a.cts", "typescript"), ("a.tsx", "tsx"), ("a.js", "javascript"), ("a.jsx", "javascript"),
     ("a.mjs", "javascript"), ("a.cjs", "javascript"), ("a.go", "go"), ("a.rs", "rust"),
     ("A.java", "java"), ("a.c", "c"), ("a.h", "c"), ("a.cc", "cpp"), ("a.cpp", "cpp"),
     ("a.cxx", "cpp"), ("a.hpp", "cpp"), ("a.hh", "cpp"), ("a.hxx", "cpp"), ("a.rb", "ruby"),
     ("README.md", "markdown"), ("x.markdown", "markdown"), ("Dockerfile", "dockerfile"),
     ("src/Makefile", "make"), ("a.CS", "csharp"), ("notes.txt", None), ("LICENSE", None),
     (".bashrc", None), ("weird.", None)],
)
def test_language_for_path(path: str, lang: str | None) -> None:
    """Extensions and file names map to the tree-sitter-language-pack name, unknown to None."""
    assert language_for_path(path) == lang


def test_every_mapped_language_loads_offline() -> None:
    """Every language the map can return loads from the installed pack and parses text."""
    for lang in sorted(set(EXTENSION_LANGUAGES.values()) | set(FILENAME_LANGUAGES.values())):
        assert get_parser(lang) is get_parser(lang)
        tree = parse("x\n", lang)
        assert tree is not None, lang


def test_parse_unknown_language_is_none() -> None:
    """Parsing with a language the pack does not know gives None instead of raising."""
    assert parse("x = 1", "no-such-language") is None


def test_empty_and_blank_text_give_no_chunks() -> None:
    """An empty or whitespace-only file gives no chunks."""
    assert chunk_text("", "a.py") == []
    assert chunk_text(" \n\n\t\n", "a.md") == []


def test_small_file_is_one_chunk_with_lines_and_language() -> None:
    """A file under the maximum is one chunk keeping its lines and language."""
    text = "\n\nimport os\n\ndef f():\n    return os.sep\n\n"
    [c] = chunk_text(text, "pkg/a.py")
    assert (c.start_line, c.end_line, c.language, c.context) == (3, 6, "python", "")
    assert c.text == "import os\n\ndef f():\n    return os.sep"


@pytest.mark.parametrize("lang", sorted(LANG_FILES))
def test_languages_chunk_along_function_boundaries(lang: str) -> None:
    """Each listed language parses and its chunks start at function boundaries."""
    text, starts = _functions(lang)
    assert parse(text, lang) is not None
    chunks = chunk_text(text, LANG_FILES[lang])
    assert len(chunks) >= 2
    assert_covers(text, chunks)
    for c in chunks:
        assert c.language == lang
        assert c.start_line in starts or c.start_line == 1, (lang, c.start_line, c.text[:60])
        assert len(c.text) <= 1000


def test_small_siblings_are_packed_up_to_max() -> None:
    """Many short statements are packed into few chunks near the maximum, not one each."""
    text = "".join("value_%04d = compute(%d)  # a short statement\n" % (i, i) for i in range(200))
    chunks = chunk_text(text, "a.py")
    assert_covers(text, chunks)
    assert len(chunks) <= len(text) // 900 + 2
    assert all(len(c.text) <= 1000 for c in chunks)


def test_class_is_opened_into_methods() -> None:
    """A class larger than the maximum is opened and cut between its methods."""
    methods = "".join(
        "    def m%d(self, a):\n%s        return a\n\n"
        % (i, "".join("        a = a + %d  # keep going %d\n" % (j, j) for j in range(12)))
        for i in range(5))
    text = "class Big:\n    '''A big class.'''\n\n" + methods
    chunks = chunk_text(text, "big.py")
    assert_covers(text, chunks)
    assert len(chunks) >= 3
    for c in chunks[1:]:
        assert c.text.startswith("    def m")


def test_small_pieces_merge_into_a_neighbour() -> None:
    """No chunk is under the minimum when the file has more than one chunk."""
    big = "def big():\n" + "".join("    y = %d + %d  # padding line\n" % (j, j) for j in range(40))
    text = "x = 1\n\n" + big + "\nz = 2\n\n" + big.replace("big", "big2") + "\nw = 3\n"
    chunks = chunk_text(text, "a.py")
    assert_covers(text, chunks)
    assert len(chunks) > 1
    for c in chunks:
        assert len(c.text.strip()) >= 100
        assert len(c.text) <= 1000 + 100


def test_merge_prefers_the_neighbour_that_stays_within_max() -> None:
    """A tiny piece goes to the neighbour whose merge fits the maximum, else the smaller merge."""
    cs = ChunkSettings(max_chars=200, min_chars=50, context_chars=0)
    text = "A" * 190 + "\nc=1\n" + "B" * 197 + "\n"
    spans = [(0, 191), (191, 195), (195, len(text))]
    assert _merge_small(text, spans, cs) == [(0, 195), (195, len(text))]  # right would be 201
    text = "A" * 190 + "\nc=1\n" + "B" * 60 + "\n"
    spans = [(0, 191), (191, 195), (195, len(text))]
    assert _merge_small(text, spans, cs) == [(0, 191), (191, len(text))]  # both fit: smaller
    text = "A" * 199 + "\nc=1\n" + "B" * 199 + "\n"
    spans = [(0, 200), (200, 204), (204, len(text))]
    assert len(_merge_small(text, spans, cs)) == 2  # neither fits: merged anyway


def test_context_holds_preceding_lines_up_to_100_chars() -> None:
    """Each chunk's context is whole lines just before it, at most 100 characters."""
    text, _ = _functions("python", 8)
    lines = text.split("\n")
    chunks = chunk_text(text, "a.py")
    assert chunks[0].context == ""
    for c in chunks[1:]:
        assert 0 < len(c.context) <= 100
        assert c.context.endswith("\n")
        before = "\n".join(lines[:c.start_line - 1]).rstrip()
        assert before.endswith(c.context.strip())


def test_context_setting_is_respected() -> None:
    """A smaller context setting gives shorter contexts and zero gives none."""
    text, _ = _functions("go", 8)
    for n in (0, 30):
        for c in chunk_text(text, "a.go", ChunkSettings(context_chars=n)):
            assert len(c.context) <= n


def test_oversized_leaf_is_cut_by_line_splitter() -> None:
    """A long string literal over the maximum is cut into line-packed chunks."""
    blob = "".join("line %d of a very long embedded data blob\n" % i for i in range(150))
    text = 'DATA = """\n' + blob + '"""\n\n\ndef after():\n    return DATA\n'
    chunks = chunk_text(text, "data.py")
    assert_covers(text, chunks)
    assert len(chunks) >= 5
    assert all(len(c.text) <= 1000 for c in chunks)


def test_single_long_line_is_cut_by_characters() -> None:
    """A single line longer than the maximum is cut into pieces of at most max characters."""
    line = "x = [" + ", ".join(str(i) for i in range(2000)) + "]"
    chunks = chunk_text(line + "\n", "a.py")
    assert "".join(c.text for c in chunks) == line
    assert all(len(c.text) <= 1000 and c.start_line == c.end_line == 1 for c in chunks)
    assert chunks[1].context == line[1000 - 100:1000]


def test_plain_text_splits_at_blank_lines() -> None:
    """A file with no grammar is cut at blank lines and packed up to the maximum."""
    paras = ["Paragraph %d. " % i + "word " * 70 for i in range(8)]  # ~365 chars each
    text = "\n\n".join(paras) + "\n"
    chunks = chunk_text(text, "notes.txt")
    assert_covers(text, chunks)
    assert all(c.language is None for c in chunks)
    for c in chunks:
        assert len(c.text) <= 1000
        assert c.text.startswith("Paragraph") and c.text.endswith("word ")
    assert len(chunks) == 4


def test_markdown_splits_at_headings_not_in_code_fences() -> None:
    """Markdown sections start new chunks at headings, and '#' lines inside fences are not headings."""
    sections = []
    for i in range(5):
        sections.append(
            "## Section %d\n\nSome prose about section %d. " % (i, i) + "text " * 60
            + "\n\n```bash\n# not a heading %d\necho hi\n```\n" % i)
    text = "# Title\n\n" + "\n".join(sections)
    chunks = chunk_text(text, "docs/guide.md")
    assert_covers(text, chunks)
    assert all(c.language == "markdown" for c in chunks)
    for c in chunks[1:]:
        assert c.text.startswith("## Section")
    assert all(len(c.text) <= 1000 for c in chunks)


def test_deeply_nested_code_does_not_raise() -> None:
    """A pathologically deep tree is chunked without recursion errors."""
    text = "x = " + "(\n" * 3000 + "1" + "\n)" * 3000 + "\n"
    chunks = chunk_text(text, "deep.py")
    assert_covers(text, chunks)


def test_5000_line_python_file_is_fast() -> None:
    """Chunking a 5,000-line Python file stays well under a second."""
    text, _ = _functions("python", 400)  # 13 lines each -> ~5,200 lines
    assert text.count("\n") >= 5000
    t0 = time.perf_counter()
    chunks = chunk_text(text, "big.py")
    elapsed = time.perf_counter() - t0
    assert_covers(text, chunks)
    assert elapsed < 1.5, elapsed  # ~0.1 s on an idle core; slack for a shared machine


def test_short_line_joins_the_first_cut_of_a_long_line() -> None:
    """A line under min_chars before a line cut by characters joins its first cut, so that chunk ends inside line 2."""
    text = "x = 1\n" + "y" * 2500 + "\nz = 2\n"
    for path in ("a.py", "a.txt"):
        chunks = chunk_text(text, path)
        assert [(c.start_line, c.end_line) for c in chunks] == [(1, 2), (2, 2), (2, 3)]
        assert chunks[0].text == "x = 1\n" + "y" * 1000
        assert_covers(text, chunks)


_PATHS = ["a.py", "a.ts", "a.go", "a.md", "a.txt", "a.json", "a.rb", "a.c"]
_ALPHABET = st.sampled_from(list("ab ({[]})\n\n\t#:=;'\"\\`é\u2028\r\x00") + ["def ", "\n# h\n", "```"])


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.one_of(st.text(max_size=400), st.lists(_ALPHABET, max_size=300).map("".join)),
    path=st.sampled_from(_PATHS),
    max_chars=st.integers(min_value=1, max_value=120),
    min_chars=st.integers(min_value=0, max_value=60),
    context_chars=st.integers(min_value=0, max_value=40),
)
def test_fuzz_never_raises_and_covers(text: str, path: str, max_chars: int, min_chars: int,
                                      context_chars: int) -> None:
    """Any text, path and settings give chunks that cover the file in order without raising."""
    cs = ChunkSettings(max_chars=max_chars, min_chars=min_chars, context_chars=context_chars)
    chunks = chunk_text(text, path, cs)
    if not text.strip():
        assert chunks == []
    else:
        assert_covers(text, chunks, cs)


def test_file_chunks_fall_back_to_plain_text_when_the_grammar_path_fails(monkeypatch) -> None:
    """A grammar bug is reported through on_error and the file is still chunked as plain text; a blank file is one chunk."""
    from daemons.lib import chunking

    real = chunking.chunk_text
    calls: list[str] = []

    def broken_for_python(text: str, path: str, settings=chunking.DEFAULT_SETTINGS):
        if path.endswith(".py"):
            raise RuntimeError("grammar bug")  # the fault under test
        return real(text, path, settings)

    monkeypatch.setattr(chunking, "chunk_text", broken_for_python)
    source = "def f():\n    return 1\n"
    chunks = chunking.file_chunks(source, "pkg/mod.py", on_error=lambda: calls.append("failed"))
    assert calls == ["failed"] and chunks and "return 1" in chunks[0].text
    monkeypatch.setattr(chunking, "chunk_text", real)
    blank = chunking.file_chunks("   \n\n", "empty.py")
    assert [(c.start_line, c.end_line, c.language) for c in blank] == [(1, 2, "python")]


def test_the_chunker_daemon_loads_neither_lancedb_nor_onnxruntime() -> None:
    """The chunker only cuts text, so its process loads no table or model library (they cost other daemons about 100 MB each)."""
    import subprocess
    import sys

    from tests.support import REPO

    code = "import sys, daemons.chunker.service\nprint(sorted(m for m in ('lancedb', 'pyarrow', 'onnxruntime', 'tokenizers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
