"""Documented definitions of a source file: the doc text, and the definition with the doc removed.

``definitions(text, path)`` yields a ``Definition`` for each function, method, class or type that
carries documentation:

* Python: the first statement of the body is a string (the docstring); the passage is the
  definition (decorators included) with that statement's lines removed.
* JavaScript/TypeScript: a ``/** ... */`` comment right before it (an ``export`` wrapper counts
  as the definition); Go: ``//`` comment lines right before it; Rust: ``///`` lines right before
  it, attributes between allowed. The comment lies outside the definition, so the passage is the
  definition itself.

The doc is cleaned of comment markers and common indentation; passages are cut to
``MAX_PASSAGE_CHARS`` at a line boundary (the product's chunk size), so that training sees what
the index holds.
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from daemons.lib.chunking import DEFAULT_SETTINGS, language_for_path, parse

MAX_PASSAGE_CHARS = DEFAULT_SETTINGS.max_chars
MAX_DOC_CHARS = 1000

_DEFS = {
    "python": {"function_definition", "class_definition"},
    "javascript": {"function_declaration", "class_declaration", "method_definition", "lexical_declaration",
                   "generator_function_declaration"},
    "typescript": {"function_declaration", "class_declaration", "method_definition", "lexical_declaration",
                   "interface_declaration", "type_alias_declaration", "abstract_class_declaration", "enum_declaration",
                   "function_signature", "method_signature"},
    "go": {"function_declaration", "method_declaration", "type_declaration"},
    "rust": {"function_item", "struct_item", "enum_item", "trait_item", "impl_item", "type_item", "macro_definition",
             "function_signature_item"},
}
_DEFS["tsx"] = _DEFS["typescript"]
_SKIP_BETWEEN = {"attribute_item", "decorator"}


@dataclass(frozen=True)
class Definition:
    start_line: int  # 1-based, inclusive, of the definition (not its leading comment)
    end_line: int
    doc: str
    passage: str


def _clean_block_comment(text: str) -> str:
    text = re.sub(r"^/\*\*?|\*/$", "", text.strip())
    lines = [re.sub(r"^\s*\* ?", "", ln) for ln in text.split("\n")]
    return textwrap.dedent("\n".join(lines)).strip()


def _clean_line_comments(lines: list[str]) -> str:
    return textwrap.dedent("\n".join(re.sub(r"^\s*//+!? ?", "", ln) for ln in lines)).strip()


def _python_doc(node: Any) -> tuple[str, Any] | None:
    body = node.child_by_field_name("body")
    if body is None or not body.named_children:
        return None
    first = body.named_children[0]
    string = first.named_children[0] if first.type == "expression_statement" and first.named_children else first
    if string.type != "string":
        return None
    raw = string.text.decode("utf-8", "replace")
    raw = re.sub(r'^[rRbBuUfF]*("""|\'\'\'|"|\')', "", raw)
    raw = re.sub(r'("""|\'\'\'|"|\')$', "", raw)
    first_line, _, rest = raw.partition("\n")
    return (first_line.strip() + "\n" + textwrap.dedent(rest)).strip(), first


def _leading_comment(node: Any, language: str) -> str | None:
    prev = node.prev_sibling
    while prev is not None and prev.type in _SKIP_BETWEEN:
        prev = prev.prev_sibling
    if prev is None or "comment" not in prev.type:
        return None
    text = prev.text.decode("utf-8", "replace")
    if language in ("javascript", "typescript", "tsx"):
        if not text.startswith("/**") or prev.end_point[0] + 1 < node.start_point[0]:
            return None
        return _clean_block_comment(text)
    # Go and Rust: a run of line comments, each on the line right above the next
    marker = "///" if language == "rust" else "//"
    lines: list[str] = []
    row = node.start_point[0]
    cur = node.prev_sibling
    while cur is not None and (cur.type in _SKIP_BETWEEN or "comment" in cur.type):
        if cur.type in _SKIP_BETWEEN:
            row = cur.start_point[0]
            cur = cur.prev_sibling
            continue
        t = cur.text.decode("utf-8", "replace")
        if not t.startswith(marker) or (language == "rust" and t.startswith("////")) or cur.end_point[0] + 1 < row - (
                1 if cur.type == "line_comment" and t.endswith("\n") else 0):
            break
        lines.insert(0, t.rstrip("\n"))
        row = cur.start_point[0]
        cur = cur.prev_sibling
    return _clean_line_comments(lines) if lines else None


def _cut(text: str, limit: int = MAX_PASSAGE_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[:cut if cut > limit // 2 else limit]


def definitions(text: str, path: str) -> Iterator[Definition]:
    """Every documented definition of one file (see the module contract)."""
    language = language_for_path(path)
    kinds = _DEFS.get(language or "")
    if not kinds:
        return
    tree = parse(text, language)  # type: ignore[arg-type]
    if tree is None:
        return
    data = text.encode("utf-8", "surrogatepass")
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        stack.extend(reversed(node.children))
        if node.type not in kinds:
            continue
        outer = node.parent if node.parent is not None and node.parent.type in ("decorated_definition", "export_statement") else node
        if language == "python":
            found = _python_doc(node)
            if found is None:
                continue
            doc, stmt = found
            s, e = outer.start_byte, outer.end_byte
            line_start = data.rfind(b"\n", 0, stmt.start_byte) + 1
            line_end = data.find(b"\n", stmt.end_byte)
            line_end = len(data) if line_end < 0 else line_end + 1
            passage = (data[s:line_start] + data[line_end:e]).decode("utf-8", "replace")
        else:
            doc = _leading_comment(outer, language)  # type: ignore[arg-type]
            if doc is None:
                continue
            passage = data[outer.start_byte:outer.end_byte].decode("utf-8", "replace")
        indent = outer.start_point[1]
        passage = " " * indent + passage if indent else passage
        if not doc.strip() or not passage.strip():
            continue
        yield Definition(outer.start_point[0] + 1, outer.end_point[0] + 1, doc[:MAX_DOC_CHARS].strip(),
                         _cut(textwrap.dedent(passage)))
