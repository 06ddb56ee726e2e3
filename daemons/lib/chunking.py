"""Syntax-aware chunking of source files (SPEC section 1, "Chunking along syntax").

Contract
--------
``chunk_text(text, path, settings)`` cuts one file's text into ``Chunk`` objects:

* A file whose language tree-sitter knows is parsed and the tree is walked from the root: a node
  whose lines fit ``max_chars`` (1,000) becomes one piece; a larger node is opened and its
  children are considered in turn.  Adjacent small siblings are packed together up to
  ``max_chars`` (as the Continue / LlamaIndex code splitters do), so a module of short
  statements does not give one chunk per statement.  Lines between children (gaps not covered
  by any node) go with the following child, and trailing lines with the last piece, so nothing is
  lost.  A node (or leaf) still too large that cannot be opened further is cut by a plain line
  splitter; a single line longer than ``max_chars`` is cut by characters.
* A file with no grammar (or whose parse fails) is cut at blank lines and, for markdown, at
  headings outside fenced code blocks; the pieces are packed up to ``max_chars``; pieces too big
  go through the line splitter.
* **Markdown** is deliberately routed through the heading splitter and not through its
  tree-sitter grammar (which does load): the heading/paragraph splitter keeps a heading with its
  section text and gives better retrieval units.  ``Chunk.language`` still says ``"markdown"``.
* Pieces whose non-whitespace extent is under ``min_chars`` (100) are merged into a neighbour,
  preferring the neighbour for which the merge stays within ``max_chars`` (the smaller result if
  both do); if neither does, the smaller neighbour is used anyway (the only way a chunk can
  exceed ``max_chars``, by less than ``min_chars`` plus whitespace).  A file with a single
  piece keeps it whatever its size.
* Each chunk's ``text`` is its span with leading and trailing blank lines removed;
  ``start_line``/``end_line`` (1-based, inclusive) are those of ``text`` alone.  The chunks
  cover every non-blank line of the file exactly once, in order.  ``context`` holds up to
  ``context_chars`` (100) characters of the whole lines just before the chunk (taken from the
  nearest line backwards while they fit, so it is the tail of the preceding text; blank lines at
  its edges are dropped; ``''`` when the nearest line alone does not fit; for a chunk that
  starts mid-line, the characters of that line before it); ``full_text`` is
  ``context + text`` and is what gets embedded and keyword-indexed.
* Empty or whitespace-only text gives ``[]``.  ``chunk_text`` never raises on any ``str``; if
  something unexpected happens in the syntax path it falls back to the plain splitter.

Line numbering follows ``'\\n'`` only (as tree-sitter does); a ``'\\r'`` stays part of its line.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

# the languages and parsers live in languages.py; chunking's callers import them from here too
from daemons.lib.languages import (
    EXTENSION_LANGUAGES, FILENAME_LANGUAGES, NO_GRAMMAR_LANGUAGES, PARSE_TIME_LIMIT_MS, GrammarTimeLimit, get_parser,
    language_for_path, parse,
)

__all__ = [
    "CHUNKER_VERSION",
    "Chunk",
    "ChunkSettings",
    "EXTENSION_LANGUAGES",
    "FILENAME_LANGUAGES",
    "NO_GRAMMAR_LANGUAGES",
    "chunk_text",
    "get_parser",
    "language_for_path",
    "parse",
]

#: Bump whenever the chunking output for the same input and settings may change (forces rebuild).
CHUNKER_VERSION = "1"


@dataclass(frozen=True)
class ChunkSettings:
    """Sizes in characters: maximum chunk, minimum chunk (smaller ones merge), context prefix;
    and the CPU milliseconds a grammar may take on one file (0: no limit; ``languages.parse``)."""

    max_chars: int = 1000
    min_chars: int = 100
    context_chars: int = 100
    parse_time_limit_ms: int = PARSE_TIME_LIMIT_MS


DEFAULT_SETTINGS = ChunkSettings()


@dataclass(frozen=True)
class Chunk:
    """One chunk of a file.

    ``start_line``/``end_line`` are 1-based and inclusive and describe ``text`` only (not
    ``context``).  ``context`` is up to ``context_chars`` characters of the lines just before.
    """

    index: int
    text: str
    start_line: int
    end_line: int
    language: str | None
    context: str = ""

    @property
    def full_text(self) -> str:
        """Context followed by the chunk text: what is embedded and indexed."""
        return self.context + self.text


_MARKDOWN_LANGUAGES = frozenset({"markdown"})


# --------------------------------------------------------------------------------------------
# Chunking

_HEADING_RE = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")
_FENCE_RE = re.compile(r"^ {0,3}(```+|~~~+)")


class _Doc:
    """The text split into '\\n' lines with line-start offsets (``starts[n] == len(text)``)."""

    __slots__ = ("text", "lines", "starts", "n")

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.split("\n")
        starts = [0] * (len(self.lines) + 1)
        pos = 0
        for i, line in enumerate(self.lines):
            starts[i] = pos
            pos += len(line) + 1
        starts[-1] = len(text)
        self.starts = starts
        self.n = len(self.lines)

    def size(self, lo: int, hi: int) -> int:
        return self.starts[hi] - self.starts[lo]

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        return (self.starts[lo], self.starts[hi])

    def line_of(self, offset: int) -> int:
        """0-based line index containing character ``offset``."""
        return max(0, bisect.bisect_right(self.starts, offset, 0, self.n) - 1)


Span = tuple[int, int]


def _char_cut(doc: _Doc, i: int, max_chars: int, out: list[Span]) -> None:
    s, e = doc.starts[i], doc.starts[i + 1]
    while s < e:
        out.append((s, min(e, s + max_chars)))
        s += max_chars


def _line_split(doc: _Doc, lo: int, hi: int, max_chars: int, out: list[Span]) -> None:
    """Pack whole lines of [lo, hi) greedily up to ``max_chars``; cut over-long lines by chars."""
    group_lo = -1
    for i in range(lo, hi):
        if doc.size(i, i + 1) > max_chars:
            if group_lo >= 0:
                out.append(doc.span(group_lo, i))
                group_lo = -1
            _char_cut(doc, i, max_chars, out)
            continue
        if group_lo >= 0 and doc.size(group_lo, i + 1) > max_chars:
            out.append(doc.span(group_lo, i))
            group_lo = -1
        if group_lo < 0:
            group_lo = i
    if group_lo >= 0:
        out.append(doc.span(group_lo, hi))


def _last_row(node: Any) -> int:
    end = node.end_point
    start_row = node.start_point.row
    if end.column == 0 and end.row > start_row:
        return end.row - 1
    return end.row


class _Frame:
    __slots__ = ("node", "lo", "hi", "children", "i", "cur", "group")

    def __init__(self, node: Any, lo: int, hi: int) -> None:
        self.node = node
        self.lo = lo
        self.hi = hi
        self.children: list[Any] | None = None
        self.i = 0
        self.cur = lo
        self.group: tuple[int, int] | None = None


def _syntax_spans(doc: _Doc, root: Any, max_chars: int, min_chars: int = 0) -> list[Span]:
    """Walk the tree (iteratively, so deep trees cannot overflow the stack) into line spans."""
    out: list[Span] = []
    stack = [_Frame(root, 0, doc.n)]

    def add(f: _Frame, lo: int, hi: int) -> None:
        # Pack [lo, hi) (which fits) with the frame's current group of siblings.
        if f.group is not None and doc.size(f.group[0], hi) <= max_chars:
            f.group = (f.group[0], hi)
        else:
            flush(f)
            f.group = (lo, hi)

    def flush(f: _Frame) -> None:
        if f.group is not None:
            out.append(doc.span(*f.group))
            f.group = None

    while stack:
        f = stack[-1]
        if f.children is None:
            if f.lo >= f.hi:
                stack.pop()
                continue
            if doc.size(f.lo, f.hi) <= max_chars:
                out.append(doc.span(f.lo, f.hi))
                stack.pop()
                continue
            children = list(f.node.children) if f.hi - f.lo > 1 else []
            if not children:
                _line_split(doc, f.lo, f.hi, max_chars, out)
                stack.pop()
                continue
            f.children = children
        children = f.children
        if f.i < len(children) and f.cur < f.hi:
            child = children[f.i]
            f.i += 1
            end = min(_last_row(child) + 1, f.hi)
            if end <= f.cur:
                continue  # child lies on lines already taken
            lo = f.cur
            f.cur = end
            if doc.size(lo, end) <= max_chars:
                add(f, lo, end)
            else:
                if f.group is not None and doc.size(*f.group) < min_chars:
                    # A small header (``def f():``, ``DATA = """``) is carried into the large
                    # child's range so it is packed with the child's first piece instead of
                    # becoming a tiny chunk that must later overflow a neighbour.
                    lo, f.group = f.group[0], None
                flush(f)
                if child.child_count == 0:
                    _line_split(doc, lo, end, max_chars, out)
                else:
                    stack.append(_Frame(child, lo, end))
            continue
        # Children done: the trailing lines go with the last piece when they fit.
        if f.cur < f.hi:
            if doc.size(f.cur, f.hi) <= max_chars:
                add(f, f.cur, f.hi)
            else:
                flush(f)
                _line_split(doc, f.cur, f.hi, max_chars, out)
        flush(f)
        stack.pop()
    return out


def _plain_spans(doc: _Doc, markdown: bool, settings: ChunkSettings) -> list[Span]:
    """Cut at blank lines (and markdown headings), pack paragraphs up to ``max_chars``."""
    max_chars = settings.max_chars
    # Paragraph units as line ranges; each unit carries the blank lines that follow it.
    units: list[tuple[int, int, bool]] = []  # (lo, hi, starts_with_heading)
    lo = 0
    in_fence = False
    prev_blank = True
    fence_mark = ""
    unit_heading = False
    for i, line in enumerate(doc.lines):
        blank = not line.strip()
        heading = False
        if markdown:
            m = _FENCE_RE.match(line)
            if m:
                mark = m.group(1)
                if not in_fence:
                    in_fence, fence_mark = True, mark[0] * 3
                elif mark.startswith(fence_mark):
                    in_fence = False
            elif not in_fence and _HEADING_RE.match(line):
                heading = True
        starts_new = (not blank) and (prev_blank or heading)
        if starts_new and i > lo:
            units.append((lo, i, unit_heading))
            lo = i
        if starts_new or i == 0:
            unit_heading = heading
        prev_blank = blank
    if lo < doc.n:
        units.append((lo, doc.n, unit_heading))

    out: list[Span] = []
    group: tuple[int, int] | None = None
    for ulo, uhi, is_heading in units:
        if doc.size(ulo, uhi) > max_chars:
            if group is not None:
                out.append(doc.span(*group))
                group = None
            _line_split(doc, ulo, uhi, max_chars, out)
            continue
        if group is not None:
            group_content = len(doc.text[doc.starts[group[0]]:doc.starts[group[1]]].strip())
            if (is_heading and group_content >= settings.min_chars) or doc.size(
                group[0], uhi
            ) > max_chars:
                out.append(doc.span(*group))
                group = None
        group = (ulo, uhi) if group is None else (group[0], uhi)
    if group is not None:
        out.append(doc.span(*group))
    return out


def _content_bounds(text: str, s: int, e: int) -> tuple[int, int] | None:
    """First and one-past-last non-whitespace offsets of text[s:e], or None if blank."""
    piece = text[s:e]
    stripped = piece.lstrip()
    if not stripped:
        return None
    cs = s + (len(piece) - len(stripped))
    ce = s + len(piece.rstrip())
    return cs, ce


def _merge_small(text: str, spans: list[Span], settings: ChunkSettings) -> list[Span]:
    """Merge whitespace-only spans into a neighbour, then spans under ``min_chars``."""
    # Drop blank spans into the previous (or next) span: they hold no lines to cover.
    items: list[list[int]] = []  # [s, e, cs, ce]
    pending_start: int | None = None
    for s, e in spans:
        b = _content_bounds(text, s, e)
        if b is None:
            if items:
                items[-1][1] = e
            elif pending_start is None:
                pending_start = s
            continue
        if pending_start is not None:
            s, pending_start = pending_start, None
        items.append([s, e, b[0], b[1]])
    if len(items) <= 1:
        return [(it[0], it[1]) for it in items]

    max_chars, min_chars = settings.max_chars, settings.min_chars
    i = 0
    while i < len(items) and len(items) > 1:
        s, e, cs, ce = items[i]
        if ce - cs >= min_chars:
            i += 1
            continue
        left = items[i - 1] if i > 0 else None
        right = items[i + 1] if i + 1 < len(items) else None
        left_size = ce - left[2] if left else None
        right_size = right[3] - cs if right else None
        options: list[tuple[int, int, str]] = []
        if left_size is not None:
            options.append((0 if left_size <= max_chars else 1, left_size, "L"))
        if right_size is not None:
            options.append((0 if right_size <= max_chars else 1, right_size, "R"))
        options.sort()
        side = options[0][2]
        if side == "L":
            assert left is not None
            left[1], left[3] = e, ce
            del items[i]
            # The grown left neighbour cannot have become small; step back only if it was.
            if left[3] - left[2] < min_chars:
                i -= 1
        else:
            assert right is not None
            right[0], right[2] = s, cs
            del items[i]
    return [(it[0], it[1]) for it in items]


def _make_chunks(doc: _Doc, spans: list[Span], language: str | None,
                 settings: ChunkSettings) -> list[Chunk]:
    text = doc.text
    chunks: list[Chunk] = []
    for s, e in spans:
        first_line = doc.line_of(s)
        parts = text[s:e].split("\n")
        lead = 0
        while lead < len(parts) and not parts[lead].strip():
            lead += 1
        if lead == len(parts):
            continue
        tail = len(parts)
        while tail > lead and not parts[tail - 1].strip():
            tail -= 1
        kept = parts[lead:tail]
        start_line = first_line + lead  # 0-based
        body_start = s + sum(len(p) + 1 for p in parts[:lead])
        chunks.append(
            Chunk(
                index=len(chunks),
                text="\n".join(kept),
                start_line=start_line + 1,
                end_line=start_line + len(kept),
                language=language,
                context=_context(doc, start_line, body_start, settings.context_chars),
            )
        )
    return chunks


def _context(doc: _Doc, line: int, offset: int, limit: int) -> str:
    """Up to ``limit`` characters of whole lines before ``line`` (or, for a chunk starting
    mid-line, the tail of that line before ``offset``)."""
    if limit <= 0:
        return ""
    line_start = doc.starts[line]
    if offset > line_start:
        return doc.text[max(line_start, offset - limit):offset]
    taken: list[str] = []
    total = 0
    k = line - 1
    while k >= 0:
        piece = doc.lines[k]
        if total + len(piece) + 1 > limit:
            break
        taken.append(piece)
        total += len(piece) + 1
        k -= 1
    # Blank lines at either edge add nothing (they still counted against the budget).
    while taken and not taken[-1].strip():
        taken.pop()
    while taken and not taken[0].strip():
        taken.pop(0)
    if not taken:
        return ""
    return "\n".join(reversed(taken)) + "\n"


def chunk_text(text: str, path: str, settings: ChunkSettings = DEFAULT_SETTINGS,
               on_plain: Callable[[str], None] | None = None) -> list[Chunk]:
    """Cut one file's ``text`` into chunks (see the module docstring for the full contract).

    ``path`` (relative path) selects the language.  Returns ``[]`` for blank text; never
    raises for any ``str``. A file of a language with a grammar that the grammar cannot cut
    (its time limit, a tree too deep to walk, a grammar error) is split as plain text, and
    *on_plain* is called with the reason.
    """
    try:
        if not isinstance(text, str) or not text.strip():
            return []
        language = language_for_path(path)
    except Exception:
        return []
    max_chars = max(1, int(settings.max_chars))
    if max_chars != settings.max_chars:
        settings = ChunkSettings(max_chars, settings.min_chars, settings.context_chars, settings.parse_time_limit_ms)
    doc = _Doc(text)
    spans: list[Span] | None = None
    if language is not None and language not in NO_GRAMMAR_LANGUAGES:
        reason = ""
        try:
            tree = parse(text, language, settings.parse_time_limit_ms)
            if tree is not None:
                spans = _syntax_spans(doc, tree.root_node, max_chars, settings.min_chars)
        except GrammarTimeLimit as exc:
            reason = str(exc)
        except RecursionError:
            reason = "the syntax tree is too deep to walk"
        except Exception as exc:
            reason = f"the grammar failed ({type(exc).__name__}: {exc})"
        if reason:
            spans = None
            if on_plain is not None:
                try:
                    on_plain(reason)
                except Exception:  # the caller's logging must not lose the file
                    pass
    try:
        if spans is None:
            spans = _plain_spans(doc, language in _MARKDOWN_LANGUAGES, settings)
        spans = _merge_small(text, spans, settings)
        return _make_chunks(doc, spans, language, settings)
    except Exception:
        # Last resort: plain line packing, no merging.
        try:
            out: list[Span] = []
            _line_split(doc, 0, doc.n, max_chars, out)
            return _make_chunks(doc, out, language, settings)
        except Exception:
            return []


def file_chunks(text: str, path: str, settings: ChunkSettings = DEFAULT_SETTINGS,
                on_error: Callable[[], None] | None = None, on_plain: Callable[[str], None] | None = None) -> list[Chunk]:
    """A file's chunks as the index holds them: ``chunk_text`` (*on_plain* is told why a file
    its grammar could not cut was split as plain text); when the grammar path raises,
    *on_error* is called (from inside the ``except``, so it may log the exception) and the file
    is split as plain text; and a file with content but no chunk is one whole-file chunk, so the
    table's hash stays in step with the disk and the file never stays "pending"."""
    try:
        chunks = chunk_text(text, path, settings, on_plain)
    except Exception:  # a grammar bug must not stop the pipeline: fall back to plain splitting
        if on_error is not None:
            on_error()
        chunks = chunk_text(text, path + ".txt", settings)
    if not chunks:
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        chunks = [Chunk(index=0, text=text[: max(1, int(settings.max_chars))], start_line=1, end_line=max(1, lines),
                        language=language_for_path(path))]
    return chunks

