"""Focus files (SPEC §2): the files the editor says are hot, hottest first."""

from __future__ import annotations

from collections.abc import Iterable

#: At most this many focus files are used.
FOCUS_FILES_MAX = 8


def focus_files(
    active: str | None,
    visible: Iterable[str],
    previous_answer: Iterable[str],
    open_docs: Iterable[str],
    limit: int = FOCUS_FILES_MAX,
) -> list[str]:
    """Return the focus files in order of heat, deduplicated, cut to *limit*.

    Order: the active editor's file, the visible editors' files, the files the
    previous answer came from, the other open documents. Empty/None entries are
    ignored; a file keeps the position of its hottest occurrence.
    """
    out: list[str] = []
    seen: set[str] = set()
    groups: list[Iterable[str | None]] = [[active], visible or [], previous_answer or [], open_docs or []]
    for group in groups:
        for path in group:
            if len(out) >= limit:
                return out
            if path and path not in seen:
                seen.add(path)
                out.append(path)
    return out
