"""Tests for daemons.lib.windows (SPEC section 1, windows of 600 overlapping by 80)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from daemons.lib.windows import embed_text, window_texts, windows


def _rebuild(parts: list[str], text: str, overlap: int) -> str:
    """Join windows back, checking each starts with the previous one's last ``overlap`` chars."""
    out = parts[0]
    for w in parts[1:]:
        assert out.endswith(w[:overlap])
        out += w[overlap:]
    return out


def test_short_text_is_one_window() -> None:
    """A text of at most the window size is a single window, the text itself."""
    assert window_texts("x" * 600) == ["x" * 600]
    assert window_texts("") == [""]


def test_long_text_windows_at_most_600_overlapping_80() -> None:
    """A long text gives windows of at most 600 characters overlapping by 80."""
    text = "".join("line %d with some words in it\n" % i for i in range(100))
    parts = window_texts(text)
    assert len(parts) > 1
    assert all(0 < len(w) <= 600 for w in parts)
    assert _rebuild(parts, text, 80) == text


def test_cut_prefers_newline_then_space_then_hard() -> None:
    """Windows end after a newline when one is near the end, else a space, else at the size."""
    nl = "a" * 550 + "\n" + "b" * 600
    assert window_texts(nl)[0] == "a" * 550 + "\n"
    sp = "a" * 530 + " " + "b" * 600
    assert window_texts(sp)[0] == "a" * 530 + " "
    hard = "a" * 400 + "\n" + "b" * 800  # newline too early to use
    assert window_texts(hard)[0] == hard[:600]


def test_bad_sizes_raise() -> None:
    """A non-positive size or an overlap not below the size is refused."""
    with pytest.raises(ValueError):
        window_texts("abc", size=0)
    with pytest.raises(ValueError):
        window_texts("abc", size=10, overlap=10)


def test_embed_text_puts_prefix_and_path_in_front() -> None:
    """The embedded string is the family prefix, the path, a newline, then the window."""
    assert embed_text("def parse():", "src/dates.ts") == "src/dates.ts\ndef parse():"
    assert embed_text("x", "a.py", "search_document: ") == "search_document: a.py\nx"
    assert windows("x" * 700, "a.py", prefix="passage: ")[1].startswith("passage: a.py\n")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=2000), st.integers(1, 300), st.integers(0, 299))
def test_windows_fuzz(text: str, size: int, overlap: int) -> None:
    """Any text is covered by non-empty windows of at most size characters."""
    overlap = min(overlap, size - 1)
    parts = window_texts(text, size, overlap)
    assert parts and all(len(w) <= size for w in parts)
    if text:
        assert all(parts)
    if len(parts) > 1 and all(len(w) > overlap for w in parts[1:]):
        assert _rebuild(parts, text, overlap) == text
    assert "".join(parts).startswith(parts[0]) and text.endswith(parts[-1])
