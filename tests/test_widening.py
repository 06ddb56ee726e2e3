"""Tests for daemons.lib.widening (SPEC §3 Widening)."""

from daemons.lib.widening import IMPORTS_MAX_CHARS, WIDEN_MAX_CHARS, imports_block, widen


def _method(name: str, body_lines: int) -> str:
    body = "".join(f"        x{i} = {i}  # filler line for {name}\n" for i in range(body_lines))
    return f"    def {name}(self):\n{body}        return x0\n"


def _big_file(class_text: str) -> str:
    """A class followed by enough unrelated code that the file exceeds the widening cap."""
    tail = "".join(f"def other_{i}():\n    return {i}  # some padding text here\n\n" for i in range(80))
    return "import os\n\n\n" + class_text + "\n\n" + tail


def test_defaults_match_spec():
    """Widening stops at 3,000 characters and imports are cut to 1,200."""
    assert WIDEN_MAX_CHARS == 3000
    assert IMPORTS_MAX_CHARS == 1200


def test_method_grows_to_small_class():
    """A hit inside a method of a small class widens to the whole class."""
    cls = "class Small:\n" + _method("a", 3) + "\n" + _method("b", 3)
    text = _big_file(cls)
    assert len(text) > 3000
    lines = text.split("\n")
    cls_start = lines.index("class Small:") + 1
    b_start = lines.index("    def b(self):") + 1
    got = widen(text, "python", b_start + 1, b_start + 2)
    assert got == (cls_start, cls_start + cls.count("\n") - 1)


def test_method_does_not_grow_to_class_over_limit():
    """When the class is over 3,000 characters the hit widens only to its method."""
    cls = "class Big:\n" + _method("a", 80) + "\n" + _method("b", 3)
    assert len(cls) > 3000
    text = _big_file(cls)
    lines = text.split("\n")
    b_start = lines.index("    def b(self):") + 1
    got = widen(text, "python", b_start + 1, b_start + 2)
    assert got == (b_start, b_start + 4)


def test_tiny_file_grows_to_whole_file():
    """A hit in a file that fits the cap widens to the whole file."""
    text = "import os\n\n\ndef f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert widen(text, "python", 5, 5) == (1, 9)


def test_nothing_fits_keeps_hit():
    """When no containing node fits, the hit keeps its own range."""
    text = "x = [\n" + "".join(f"    {i},  # a long line of padding text\n" for i in range(200)) + "]\n"
    assert widen(text, "python", 10, 12, max_chars=100) == (10, 12)


def test_no_grammar_keeps_hit():
    """A file with no grammar is never widened."""
    text = "line one\nline two\nline three\n"
    assert widen(text, None, 2, 2) == (2, 2)
    assert widen(text, "markdown", 2, 2) == (2, 2)
    assert imports_block("import os\n", None) is None


def test_buffer_text_is_used_so_unsaved_edits_count():
    """Widening works on the text passed in, so an unsaved edit changes the result."""
    saved = "class Small:\n" + _method("a", 2)
    on_disk = _big_file(saved)
    lines = on_disk.split("\n")
    a_start = lines.index("    def a(self):") + 1
    assert widen(on_disk, "python", a_start + 1, a_start + 1)[0] == a_start - 1  # class
    edited = _big_file("class Small:\n" + _method("a", 2) + _method("pad", 90))
    assert widen(edited, "python", a_start + 1, a_start + 1) == (a_start, a_start + 3)  # method only


def test_imports_block_python_skips_docstring_and_comments():
    """The leading run of imports is found after comments and the docstring."""
    text = '#!/usr/bin/env python\n"""Doc."""\n\nimport os\nfrom a import (\n    b,\n)\n# note\nimport sys\n\nx = 1\nimport late\n'
    assert imports_block(text, "python") == (4, 9)


def test_imports_block_other_languages():
    """JS/TS, Go, Rust, Java, C/C++ and Ruby imports are recognised."""
    assert imports_block('"use strict";\nimport a from "a";\nimport {b} from "b";\nconst x = 1;\n', "typescript") == (2, 3)
    assert imports_block('package main\n\nimport (\n\t"fmt"\n)\n\nfunc main() {}\n', "go") == (1, 5)
    assert imports_block("//! crate doc\nuse std::io;\nuse std::fs;\nfn main() {}\n", "rust") == (2, 3)
    assert imports_block("package a.b;\nimport x.Y;\nclass A {}\n", "java") == (1, 2)
    assert imports_block("#ifndef A_H\n#define A_H\n#include <stdio.h>\n#include \"a.h\"\nint x;\n#endif\n", "c") == (3, 4)
    assert imports_block("#pragma once\n#include <vector>\nint x;\n", "cpp") == (2, 2)
    assert imports_block("require 'json'\nrequire_relative 'x'\nclass A; end\n", "ruby") == (1, 2)
    assert imports_block("def f():\n    import os\n", "python") is None


def test_imports_block_capped_at_1200_whole_lines():
    """A long import run is cut to whole lines totalling at most 1,200 characters."""
    text = "".join(f"import module_number_{i:03d}_with_a_long_name\n" for i in range(60)) + "x = 1\n"
    start, end = imports_block(text, "python")
    kept = "".join(text.splitlines(keepends=True)[start - 1 : end])
    assert start == 1 and len(kept) <= 1200
    assert len(kept) + len(text.splitlines(keepends=True)[end]) > 1200


def test_a_parsed_tree_is_kept_once_for_every_thread_and_each_reader_gets_its_own_copy():
    """A file parsed by one thread is not parsed again by another; each caller gets a distinct copy of the same tree, and at most TREES_KEPT trees are kept."""
    import threading

    from daemons.lib import widening

    text = _big_file("class Shared:\n" + _method("a", 3))
    first = widening.parse_tree(text, "python")
    hits = widening._trees.hits
    seen = []
    t = threading.Thread(target=lambda: seen.append(widening.parse_tree(text, "python")))
    t.start()
    t.join(10)
    assert widening._trees.hits == hits + 1
    assert seen[0] is not first and str(seen[0].root_node) == str(first.root_node)
    for i in range(widening.TREES_KEPT + 5):
        widening.parse_tree(f"x_{i} = {i}\n", "python")
    assert len(widening._trees) == widening.TREES_KEPT


def test_threads_widening_the_same_files_at_once_get_the_answers_one_thread_gets():
    """Sixteen threads widening and collecting imports from the same files at once, through the shared trees, give exactly the single-threaded answers."""
    import threading

    texts = [_big_file(f"class C{i}:\n" + _method("a", 3) + "\n" + _method("b", 3)) for i in range(6)]
    spans = [(t, t.split("\n").index("    def b(self):") + 2) for t in texts]
    expected = [(widen(t, "python", line, line + 1), imports_block(t, "python")) for t, line in spans]
    errors: list[BaseException] = []
    results: list[list] = []

    def work() -> None:
        try:
            results.append([(widen(t, "python", line, line + 1), imports_block(t, "python")) for _ in range(20) for t, line in spans][-len(spans):])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 16
    assert all(r == expected for r in results)
