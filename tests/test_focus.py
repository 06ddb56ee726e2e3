"""Tests for daemons.lib.focus (SPEC §2 Focus files)."""

from daemons.lib.focus import FOCUS_FILES_MAX, focus_files


def test_order_of_heat():
    """Active, then visible, then previous answer, then open documents."""
    assert focus_files("a.py", ["b.py"], ["c.py"], ["d.py"]) == ["a.py", "b.py", "c.py", "d.py"]


def test_deduplicated_at_hottest_position():
    """A file listed twice keeps its hottest position only."""
    assert focus_files("a.py", ["b.py", "a.py"], ["b.py", "c.py"], ["c.py", "a.py"]) == ["a.py", "b.py", "c.py"]


def test_cut_to_eight():
    """At most eight focus files are returned, the coolest dropped first."""
    assert FOCUS_FILES_MAX == 8
    got = focus_files("a", [f"v{i}" for i in range(4)], [f"p{i}" for i in range(4)], [f"o{i}" for i in range(4)])
    assert got == ["a", "v0", "v1", "v2", "v3", "p0", "p1", "p2"]


def test_missing_active_and_empty_entries_ignored():
    """A missing active file and empty names are skipped."""
    assert focus_files(None, ["", "x.py"], [], ["y.py"]) == ["x.py", "y.py"]
    assert focus_files("a", ["b", "c"], [], [], limit=2) == ["a", "b"]
