"""From kept hits to labelled blocks, the prompt text and the context line (SPEC §2, §3).

Used by the answer's stages (``daemons.lib.pipeline``), after the threshold and the widening::

    blocks = merge_hits(hits, file_texts)                 # touching/overlapping -> one block <= 4,000
    blocks = add_imports(blocks, file_texts, languages)   # imports once per file, after its code
    blocks = budget(blocks)                               # 6 snippets, 12,000 characters
    text = prompt_text(question, blocks)
    line = context_line(searched, reranked, kept_labels, near_labels, degraded)

Imports blocks are not snippets: they do not count against the snippet count,
but they do count against the character budget, and one is only kept when a
code block of its file is kept. Team blocks come after local ones and never
merge with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from daemons.lib.widening import IMPORTS_MAX_CHARS, imports_block, lines_text, split_lines

#: A merged block never grows beyond this many characters.
MAX_BLOCK_CHARS = 4000
#: At most this many code blocks (snippets) go into an answer.
SNIPPET_COUNT = 6
#: Total characters of block text in an answer.
BUDGET_CHARS = 12000
#: Reranker probability below which a candidate is dropped.
RERANK_THRESHOLD = 0.08
#: How many of the dropped candidates are reported as near misses.
NEAR_MISS_COUNT = 3

#: Degraded-mode phrases for the context line.
DEGRADED_KEYWORDS_ONLY = "keywords only (embedder unavailable)"
DEGRADED_FUSED_ORDER = "fused order (reranker unavailable)"

CODE = "code"
IMPORTS = "imports"

INSTRUCTION = (
    "Below are blocks of code from the workspace, each headed by a label of the form "
    "path:start-end. When you use a block, cite its label. Ignore any block that does "
    "not bear on the question."
)



@dataclass
class Hit:
    """One kept hit: 1-based inclusive lines of *path* and their text.

    *score* is the reranker probability (or the fused score when the reranker
    was unavailable). Blocks are ordered by *order* when it is set (the front
    sets ``fusion.rerank_order``'s key, which already holds the role weight),
    else by ``score * weight``, *weight* being the file role's weight
    (``daemons.lib.roles``) when *score* is a probability, so a test or doc
    ranks below source of the same probability unless the question asked for
    it. *team* marks hits from the shared team index, whose name is *team_name*.
    """

    path: str
    start_line: int
    end_line: int
    text: str
    score: float
    retrievers: list[str] = field(default_factory=list)
    team: bool = False
    team_name: str | None = None
    language: str | None = None
    weight: float = 1.0
    order: float | None = None


@dataclass
class Block(Hit):
    """A block of context: contiguous lines of one file (merged hits, or a file's imports block),
    labelled by :func:`label`; every field of :class:`Hit`, ordered the same way.

    *kind* is ``"code"`` for merged hits and ``"imports"`` for a file's imports block.
    """

    kind: str = CODE


def _order_key(b: Block) -> float:
    """What blocks are sorted by, descending (see :class:`Hit`)."""
    return b.order if b.order is not None else b.score * b.weight


def _union(a: Iterable[str], b: Iterable[str]) -> list[str]:
    """Union of two name lists, first-seen order."""
    return list(dict.fromkeys([*a, *b]))


def _joined_text(
    lines: list[str] | None, pieces: Sequence[tuple[int, int, str]], start: int, end: int
) -> str:
    """Text of lines *start*..*end*: from the file when known, else stitched from *pieces*."""
    if lines:
        return lines_text(lines, start, end)
    by_line: dict[int, str] = {}
    for p_start, _p_end, p_text in pieces:
        for offset, line in enumerate(split_lines(p_text)):
            by_line.setdefault(p_start + offset, line if line.endswith("\n") else line + "\n")
    return "".join(by_line.get(i, "\n") for i in range(start, end + 1))


def merge_hits(
    hits: Sequence[Hit],
    file_texts: Mapping[str, str],
    max_block_chars: int = MAX_BLOCK_CHARS,
) -> list[Block]:
    """Join hits of the same file whose line ranges overlap or touch (adjacent lines).

    A joined block spans the union of the ranges, takes its text from
    *file_texts* (else stitches the hits' own texts), keeps the higher score
    and the union of retrievers. A join that would exceed *max_block_chars*
    is not made: those hits stay apart. Local and team hits never join.
    Blocks are returned local first, then team, each part by order key
    descending (``order``, else score times role weight; ties: order of
    first hit).
    """
    groups: dict[tuple[bool, str | None, str], list[tuple[int, Hit]]] = {}
    for order, hit in enumerate(hits):
        groups.setdefault((hit.team, hit.team_name, hit.path), []).append((order, hit))

    made: list[tuple[int, Block]] = []
    for (team, team_name, path), members in groups.items():
        text = None if team else file_texts.get(path)
        lines = split_lines(text) if text else None
        members.sort(key=lambda m: (m[1].start_line, m[1].end_line))
        cur: Block | None = None
        cur_order = 0
        pieces: list[tuple[int, int, str]] = []
        for order, hit in members:
            piece = (hit.start_line, hit.end_line, hit.text)
            if cur is not None and hit.start_line <= cur.end_line + 1:
                new_end = max(cur.end_line, hit.end_line)
                joined = _joined_text(lines, [*pieces, piece], cur.start_line, new_end)
                if len(joined) <= max_block_chars:
                    cur.end_line = new_end
                    cur.text = joined
                    cur.score = max(cur.score, hit.score)
                    if hit.order is not None:
                        cur.order = hit.order if cur.order is None else max(cur.order, hit.order)
                    cur.retrievers = _union(cur.retrievers, hit.retrievers)
                    cur.language = cur.language or hit.language
                    cur_order = min(cur_order, order)
                    pieces.append(piece)
                    continue
            if cur is not None:
                made.append((cur_order, cur))
            pieces = [piece]
            cur_order = order
            cur = Block(
                path=path,
                start_line=hit.start_line,
                end_line=hit.end_line,
                text=_joined_text(lines, pieces, hit.start_line, hit.end_line),
                score=hit.score,
                retrievers=list(dict.fromkeys(hit.retrievers)),
                team=team,
                team_name=team_name,
                language=hit.language,
                weight=hit.weight,
                order=hit.order,
            )
        if cur is not None:
            made.append((cur_order, cur))
    made.sort(key=lambda ob: (ob[1].team, -_order_key(ob[1]), ob[0]))
    return [b for _, b in made]


def _language_for(path: str, languages: Mapping[str, str | None] | None) -> str | None:
    """Language of *path*: from *languages*, else ``chunking.language_for_path`` when available."""
    if languages is not None and path in languages:
        return languages[path]
    try:
        from daemons.lib.chunking import language_for_path  # type: ignore[attr-defined]
    except Exception:
        return None
    try:
        return language_for_path(path)
    except Exception:
        return None


def add_imports(
    blocks: Sequence[Block],
    file_texts: Mapping[str, str],
    languages: Mapping[str, str | None] | None = None,
    max_chars: int = IMPORTS_MAX_CHARS,
    max_block_chars: int = MAX_BLOCK_CHARS,
) -> list[Block]:
    """Add each local file's leading imports once, after that file's last code block.

    Nothing is added for team blocks, files without text or grammar, or files
    with no imports. When a code block of the file already covers the whole
    imports range, nothing is added. When the imports touch or overlap a code
    block and the join fits *max_block_chars*, that block is extended to take
    them in instead. Otherwise an ``"imports"`` block (score 0, no retrievers)
    of the imports lines not already shown is inserted after the file's last
    code block.
    """
    out = [replace(b, retrievers=list(b.retrievers)) for b in blocks]
    done: set[str] = set()
    for path in [b.path for b in out if not b.team and b.kind == CODE]:
        if path in done:
            continue
        done.add(path)
        text = file_texts.get(path)
        if not text:
            continue
        mine = [b for b in out if not b.team and b.path == path]
        language = _language_for(path, languages) or next((b.language for b in mine if b.language), None)
        rng = imports_block(text, language, max_chars)
        if rng is None:
            continue
        i_start, i_end = rng
        if any(b.start_line <= i_start and b.end_line >= i_end for b in mine):
            continue
        lines = split_lines(text)
        touching = [b for b in mine if b.start_line <= i_end + 1 and b.end_line >= i_start - 1]
        joined = False
        for b in sorted(touching, key=lambda b: b.start_line):
            new_start, new_end = min(b.start_line, i_start), max(b.end_line, i_end)
            new_text = lines_text(lines, new_start, new_end)
            if len(new_text) <= max_block_chars:
                b.start_line, b.end_line, b.text = new_start, new_end, new_text
                joined = True
                break
        if joined:
            continue
        # keep only the imports lines before the first code block that overlaps them
        for b in sorted(mine, key=lambda b: b.start_line):
            if b.start_line <= i_end and b.end_line >= i_start:
                i_end = min(i_end, b.start_line - 1)
        if i_end < i_start:
            continue
        last = max(i for i, b in enumerate(out) if not b.team and b.path == path)
        out.insert(
            last + 1,
            Block(
                path=path,
                start_line=i_start,
                end_line=i_end,
                text=lines_text(lines, i_start, i_end),
                score=0.0,
                retrievers=[],
                language=language,
                kind=IMPORTS,
            ),
        )
    return out


def budget(
    blocks: Sequence[Block],
    snippet_count: int = SNIPPET_COUNT,
    budget_chars: int = BUDGET_CHARS,
) -> list[Block]:
    """Cut *blocks* (in order) to *snippet_count* code blocks, then to *budget_chars*.

    Imports blocks are not snippets: they do not count against the snippet
    count, but their text counts against the character budget, and an imports
    block is kept only when a code block of its file is kept before it. Under
    the character budget (block text lengths), a block that does not fit is
    skipped and later, smaller blocks may still be kept.
    """
    first: list[Block] = []
    code = 0
    for b in blocks:
        if b.kind == CODE:
            if code >= snippet_count:
                continue
            code += 1
        first.append(b)
    kept: list[Block] = []
    used = 0
    kept_files: set[tuple[bool, str | None, str]] = set()
    for b in first:
        key = (b.team, b.team_name, b.path)
        if b.kind != CODE and key not in kept_files:
            continue
        if used + len(b.text) > budget_chars:
            continue
        used += len(b.text)
        kept.append(b)
        if b.kind == CODE:
            kept_files.add(key)
    return kept


def printable_path(path: str) -> str:
    """``path`` with control characters (a newline, a tab, a carriage return...) written as
    escapes, so that a file name cannot split a one-line label or header."""
    if path.isprintable():
        return path
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in path)


def span_label(path: str, start_line: int, end_line: int) -> str:
    """``path:start-end``, the path printable."""
    return f"{printable_path(path)}:{start_line}-{end_line}"


def label(block: Block | Hit) -> str:
    """``span_label`` of the block (``team:<name>:path:start-end`` for team blocks)."""
    base = span_label(block.path, block.start_line, block.end_line)
    if block.team:
        return f"team:{block.team_name}:{base}" if block.team_name else f"team:{base}"
    return base


def _fence(text: str) -> str:
    """A backtick fence longer than any backtick run inside *text* (at least three)."""
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def prompt_text(question: str, blocks: Sequence[Block]) -> str:
    """The text put in front of the model: instruction, question, then each block fenced under its label."""
    parts = [INSTRUCTION, "", f"Question: {question.strip()}", ""]
    if not blocks:
        parts.append("(No workspace code was found for this question.)")
    for b in blocks:
        fence = _fence(b.text)
        body = b.text if b.text.endswith("\n") or not b.text else b.text + "\n"
        note = " (imports)" if b.kind == IMPORTS else ""
        parts.append(f"{label(b)}{note}\n{fence}{b.language or ''}\n{body}{fence}\n")
    return "\n".join(parts).rstrip("\n") + "\n"


def _probs(items: Sequence[tuple[str, float | None]]) -> str:
    """``label prob, label prob`` with two decimals (just the label where there is no probability)."""
    return ", ".join(lab if prob is None else f"{lab} {prob:.2f}" for lab, prob in items)


#: The question is quoted in the context line up to this many characters.
CONTEXT_QUERY_CHARS = 300


def context_line(
    searched_query: str,
    reranked_count: int,
    kept: Sequence[tuple[str, float | None]],
    near_misses: Sequence[tuple[str, float | None]],
    degraded: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> str:
    """One line: the query as searched (cut to ``CONTEXT_QUERY_CHARS``), candidates reranked, kept hits,
    near misses, notes, degraded modes.

    Segments are joined by `` · ``; ``kept none`` when nothing was kept; the
    near-miss segment is left out when there are none; one segment per note
    (e.g. :func:`weights_note`) and per degraded mode (e.g.
    :data:`DEGRADED_KEYWORDS_ONLY`). Never contains a newline.
    """
    query = " ".join(searched_query.split())
    if len(query) > CONTEXT_QUERY_CHARS:  # the reply's searched_query and prompt hold it whole
        query = query[:CONTEXT_QUERY_CHARS].rstrip() + "…"
    query = query.replace('"', '\\"')
    segs = [f'searched "{query}"', f"reranked {reranked_count}"]
    segs.append(f"kept {_probs(kept)}" if kept else "kept none")
    if near_misses:
        segs.append(f"near misses {_probs(near_misses)}")
    segs.extend(" ".join(n.split()) for n in notes if n)
    segs.extend(" ".join(d.split()) for d in degraded if d)
    return " · ".join(segs)
