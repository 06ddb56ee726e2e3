"""Widening a hit to its enclosing syntax node, and finding a file's imports (SPEC §3 "Widening").

Lines are 1-based and inclusive throughout. The caller passes the file text
(the editor's buffer when one was sent, so unsaved edits count). Files whose
language has no grammar are never widened and have no imports block.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from daemons.lib.lru import LRU

#: A hit widens to an enclosing node only while that node fits this many characters.
WIDEN_MAX_CHARS = 3000
#: The leading run of imports is cut to this many characters (whole lines).
IMPORTS_MAX_CHARS = 1200

_COMMENTS = frozenset({"comment", "line_comment", "block_comment", "doc_comment"})

# Top-level node types that belong to a file's leading run of imports.
_IMPORT_TYPES: dict[str, frozenset[str]] = {
    "python": frozenset({"import_statement", "import_from_statement", "future_import_statement"}),
    "javascript": frozenset({"import_statement"}),
    "typescript": frozenset({"import_statement"}),
    "tsx": frozenset({"import_statement"}),
    "go": frozenset({"package_clause", "import_declaration"}),
    "rust": frozenset({"use_declaration", "extern_crate_declaration"}),
    "java": frozenset({"package_declaration", "import_declaration"}),
    "kotlin": frozenset({"package_header", "import_list", "import_header"}),
    "scala": frozenset({"package_clause", "import_declaration"}),
    "c": frozenset({"preproc_include"}),
    "cpp": frozenset({"preproc_include"}),
    "csharp": frozenset({"using_directive"}),
    "php": frozenset({"namespace_use_declaration"}),
    "ruby": frozenset(),  # require calls, see _is_import
}
_RUBY_REQUIRES = frozenset({"require", "require_relative", "load"})


_local = threading.local()


def _fallback_parser(language: str) -> Any:
    """A per-thread cached parser from tree-sitter-language-pack, or None."""
    cache: dict[str, Any] = getattr(_local, "parsers", None) or {}
    _local.parsers = cache
    if language not in cache:
        try:
            from tree_sitter_language_pack import get_parser

            cache[language] = get_parser(language)  # type: ignore[arg-type]
        except Exception:
            cache[language] = None
    return cache[language]


#: Parsed trees the process keeps, shared by the front's threads: a question widens and then
#: collects imports from the same files, and the next questions mostly land in the same files
#: again. Kept per thread, 16 threads held up to 16 copies of a file's tree.
TREES_KEPT = 64
_trees: LRU[tuple[str, bytes], Any] = LRU(TREES_KEPT)
_trees_lock = threading.Lock()


def parse_tree(text: str, language: str | None) -> Any:
    """Parse *text* as *language*; None when there is no grammar or parsing fails.

    Uses ``daemons.lib.chunking.parse`` (cached parsers) when that module is
    present, else tree-sitter-language-pack directly. Languages the chunker
    treats as having no grammar (``chunking.NO_GRAMMAR_LANGUAGES``, e.g.
    markdown) give None. The last ``TREES_KEPT`` trees are kept by (language,
    text digest) for every thread, and each caller gets its own shallow copy
    (``Tree.copy``, cheap): tree-sitter trees must not be read by two threads at once.
    """
    if not language:
        return None
    key = (language, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
    with _trees_lock:
        tree = _trees.get(key)
        if tree is not None:
            return tree.copy()
    tree = _parse_tree(text, language)
    if tree is None:
        return None
    with _trees_lock:
        _trees.put(key, tree)
        return tree.copy()


def _parse_tree(text: str, language: str) -> Any:
    try:
        from daemons.lib import chunking
    except Exception:
        chunking = None  # type: ignore[assignment]
    parse = getattr(chunking, "parse", None)
    if language in getattr(chunking, "NO_GRAMMAR_LANGUAGES", frozenset()):
        return None
    try:
        if parse is not None:
            return parse(text, language)
        parser = _fallback_parser(language)
        return parser.parse(text.encode("utf-8")) if parser is not None else None
    except Exception:
        return None


def split_lines(text: str) -> list[str]:
    """Lines of *text* split at ``\\n`` only (as tree-sitter counts rows), newlines kept."""
    if not text:
        return []
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    if lines[-1] == "":
        lines.pop()
    return lines


def lines_text(lines: list[str], start_line: int, end_line: int) -> str:
    """Text of 1-based inclusive lines *start_line*..*end_line* of *lines*."""
    return "".join(lines[max(start_line, 1) - 1 : max(end_line, 0)])


def _span(lines: list[str], start_line: int, end_line: int) -> int:
    """Character count of lines *start_line*..*end_line*."""
    return len(lines_text(lines, start_line, end_line))


def node_lines(node: Any) -> tuple[int, int]:
    """1-based inclusive line range of a tree-sitter node (a trailing newline adds no line)."""
    start = node.start_point[0] + 1
    end_row, end_col = node.end_point[0], node.end_point[1]
    end = end_row if end_col == 0 and end_row > node.start_point[0] else end_row + 1
    return start, max(start, end)


def widen(
    text: str,
    language: str | None,
    start_line: int,
    end_line: int,
    max_chars: int = WIDEN_MAX_CHARS,
) -> tuple[int, int]:
    """Widen the hit *start_line*..*end_line* to an enclosing syntax node.

    Walks down from the root (which stands for the whole file) through the
    nodes whose line range contains the hit; the first, i.e. outermost, such
    node whose lines fit *max_chars* characters is the widened range. Nodes
    that add no lines to the hit end the walk with the hit's own range, as does
    reaching a node no child of which contains the hit. So a method grows to
    its class when the class fits, a hit in a tiny file grows to the whole
    file, and nothing is ever narrowed. Without a grammar the hit (clamped to
    the file) is returned unchanged.
    """
    lines = split_lines(text)
    n = len(lines)
    if n == 0:
        return start_line, end_line
    start = min(max(1, start_line), n)
    end = min(max(start, end_line), n)
    tree = parse_tree(text, language)
    if tree is None:
        return start, end
    if _span(lines, 1, n) <= max_chars:
        return 1, n
    node = tree.root_node
    while True:
        best = None
        best_size = -1
        for child in node.children:
            c_start, c_end = node_lines(child)
            if c_start <= start and c_end >= end and c_end - c_start > best_size:
                best, best_size = child, c_end - c_start
        if best is None:
            return start, end
        b_start, b_end = node_lines(best)
        if (b_start, b_end) == (start, end):
            return start, end
        if _span(lines, b_start, b_end) <= max_chars:
            return b_start, b_end
        node = best


def _is_import(node: Any, language: str) -> bool:
    """Whether a top-level *node* is an import-like statement of *language*."""
    if node.type in _IMPORT_TYPES.get(language, frozenset()):
        return True
    if language == "ruby" and node.type == "call":
        method = node.child_by_field_name("method")
        return method is not None and method.text.decode("utf-8", "replace") in _RUBY_REQUIRES
    if language in ("javascript", "typescript", "tsx") and node.type in (
        "lexical_declaration",
        "variable_declaration",
    ):
        return b"require(" in (node.text or b"")
    return False


def _is_preamble(node: Any, language: str) -> bool:
    """Nodes skipped before the first import: comments, a docstring, directives, tags."""
    if node.type in _COMMENTS:
        return True
    if language == "python" and node.type == "string":
        return True
    if node.type == "expression_statement" and node.named_child_count == 1:
        only = node.named_children[0]
        if only.type == "string":  # python docstring, JS "use strict"
            return True
    if node.type in ("php_tag", "preproc_call", "shebang", "hash_bang_line"):
        return True
    return False


def _top_level(root: Any, language: str) -> list[Any]:
    """Top-level nodes, looking inside a C/C++ include guard that wraps the file."""
    children = [c for c in root.children if c.type not in _COMMENTS]
    if language in ("c", "cpp") and children and children[0].type in ("preproc_ifdef", "preproc_ifndef"):
        inner = [c for c in children[0].children if c.is_named]
        # skip the guard's name and its #define
        inner = [c for c in inner if c.type not in ("identifier", "preproc_def")]
        return inner
    return list(root.children)


def imports_block(
    text: str, language: str | None, max_chars: int = IMPORTS_MAX_CHARS
) -> tuple[int, int] | None:
    """Line range of the file's leading run of imports, or None.

    Leading comments, a docstring and blank lines are skipped; the run is the
    consecutive import statements after them (comments between imports are
    allowed, anything else ends it). The range is cut to whole lines totalling
    at most *max_chars* characters; None when there is no grammar, no imports,
    or not even the first line fits.
    """
    tree = parse_tree(text, language)
    if tree is None or language is None:
        return None
    lines = split_lines(text)
    first: int | None = None
    last: int | None = None
    for node in _top_level(tree.root_node, language):
        if _is_import(node, language):
            s, e = node_lines(node)
            first = s if first is None else first
            last = e
        elif first is None and _is_preamble(node, language):
            continue
        elif first is not None and node.type in _COMMENTS:
            continue
        else:
            break
    if first is None or last is None:
        return None
    end = first - 1
    total = 0
    for line_no in range(first, last + 1):
        total += len(lines[line_no - 1]) if line_no <= len(lines) else 0
        if total > max_chars:
            break
        end = line_no
    return (first, end) if end >= first else None
