"""Embedding windows of a chunk (SPEC section 1, "Windows" and "What is embedded").

Contract
--------
* ``window_texts(text, size=600, overlap=80)`` cuts a chunk's ``full_text`` into windows of at
  most ``size`` characters; each window after the first starts ``overlap`` characters before the
  previous one ended.  A cut prefers the last newline, else the last space, found in the final
  20% of the window (the cut falls just after it); otherwise it is a hard cut at ``size``.
  A text of at most ``size`` characters is one window (``''`` gives ``['']``: the list is never
  empty, and for a non-empty text no window is empty).  The windows, with overlaps removed,
  concatenate back to the text.
* ``embed_text(window, path, prefix='')`` is ``prefix + path + "\\n" + window``: the relative path
  in front of the code, and the model family's document prefix (``search_document: ``,
  ``passage: `` or ``''``) before that.
* ``windows(chunk_text, path, ...)`` (the INTERFACES.md name) is ``embed_text`` applied to every
  window of ``window_texts``.
"""

from __future__ import annotations

__all__ = ["embed_text", "window_texts", "windows"]

#: Fraction of the window's end in which a natural boundary is searched for.
BOUNDARY_FRACTION = 0.2


#: Characters per embedded window and the overlap between neighbours (SPEC §1 "Windows").
WINDOW_CHARS = 600
WINDOW_OVERLAP = 80


def window_texts(text: str, size: int = WINDOW_CHARS, overlap: int = WINDOW_OVERLAP) -> list[str]:
    """Cut ``text`` into overlapping windows of at most ``size`` characters (see module doc).

    Raises ``ValueError`` when ``size < 1`` or ``overlap`` is not in ``[0, size)``.
    """
    if size < 1:
        raise ValueError("size must be >= 1")
    if overlap < 0 or overlap >= size:
        raise ValueError("overlap must be in [0, size)")
    n = len(text)
    if n <= size:
        return [text]
    out: list[str] = []
    start = 0
    look = max(1, int(size * BOUNDARY_FRACTION))
    while True:
        end = start + size
        if end >= n:
            out.append(text[start:])
            break
        lo = end - look
        cut = text.rfind("\n", lo, end)
        if cut < 0:
            cut = text.rfind(" ", lo, end)
        cut = end if cut < 0 else cut + 1
        if cut <= start:
            cut = end
        out.append(text[start:cut])
        start = max(cut - overlap, start + 1)
    return out


def embed_text(window: str, path: str, prefix: str = "") -> str:
    """The string handed to the embedder for one window: prefix, path, newline, window."""
    return f"{prefix}{path}\n{window}"


def windows(chunk_text: str, path: str, size: int = WINDOW_CHARS, overlap: int = WINDOW_OVERLAP,
            prefix: str = "") -> list[str]:
    """Every window of ``chunk_text`` with the path (and optional prefix) in front."""
    return [embed_text(w, path, prefix) for w in window_texts(chunk_text, size, overlap)]
