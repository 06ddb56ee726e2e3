"""The data-file policy (daemons/lib/filtering.py): data and generated files are skipped with a reason, include globs override it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemons.lib.config import load_settings
from daemons.lib.filtering import WorkspaceFilter, classify_file, data_file_reason, ignore_spec


def test_a_big_data_format_file_is_data():
    """A .json, .csv or .yaml file over 64 KB is skipped as a data file; a small one is indexed."""
    big = json.dumps({f"k{i}": i for i in range(10000)}, indent=1)
    assert data_file_reason("vocab.json", big) == "data file (.json over 64 KB)"
    assert data_file_reason("package.json", '{"name": "x", "scripts": {"test": "jest"}}') == ""


def test_a_very_long_line_is_generated():
    """A file with a line of more than 5,000 characters (minified, a one-line vocabulary) is generated."""
    assert data_file_reason("app.js", "var a=1;" * 1000).startswith("generated (a line of 8000 characters)")


def test_a_table_of_literals_is_data_whatever_its_suffix():
    """A file over 16 KB whose lines are mostly numbers and strings is data, even a .py; real code is not."""
    table = "ROWS = [\n" + "".join(f'    ("row {i}", {i}, {i * 0.5}, True),\n' for i in range(800)) + "]\n"
    assert "only numbers and strings" in data_file_reason("fixtures.py", table)
    code = "".join(f"def handler_{i}(request):\n    return respond(request, status={i})\n\n" for i in range(400))
    assert len(code) > 16_000 and data_file_reason("handlers.py", code) == ""


def test_include_globs_override_the_policy_for_the_files_they_match(tmp_path):
    """A data file that an include glob matches is indexed (the user chose it); without the glob it is skipped with its reason."""
    (tmp_path / "data").mkdir()
    f = tmp_path / "data" / "table.csv"
    f.write_text("a,b,c\n" + "".join(f"{i},{i * 2},{i * 3}\n" for i in range(10000)))
    plain = WorkspaceFilter(tmp_path)
    assert plain.data_policy_applies("data/table.csv")
    verdict = classify_file(f, 1_000_000, plain.data_policy_applies("data/table.csv"))
    assert not verdict.ok and verdict.reason == "data file (.csv over 64 KB)"
    named = WorkspaceFilter(tmp_path, include_globs=["data/*.csv"])
    assert not named.data_policy_applies("data/table.csv") and named.data_policy_applies("x.py")
    assert classify_file(f, 1_000_000, named.data_policy_applies("data/table.csv")).ok


def test_files_are_indexed_newest_first(tmp_path: Path):
    """Files come newest first by modification time, ties and vanished files ordered by name (a vanished one last)."""
    import os

    from daemons.lib.filtering import newest_first

    for name, age in (("old.py", 300), ("mid.py", 200), ("b_new.py", 10), ("a_new.py", 10)):
        (tmp_path / name).write_text("x = 1\n")
        t = 1_700_000_000 - age
        os.utime(tmp_path / name, (t, t))
    assert newest_first(tmp_path, ["old.py", "gone.py", "mid.py", "b_new.py", "a_new.py"]) == ["a_new.py", "b_new.py", "mid.py", "old.py", "gone.py"]


def test_ignore_file_lines_that_make_no_pattern_are_left_out_and_the_rest_apply():
    """A lone ``!``, a trailing backslash and a reversed range match nothing, as in git; the file's other lines still ignore and negate."""
    spec, bad = ignore_spec(["!", "*.log", "\\", "[z-a]", "!keep.log", "# a comment", ""])
    assert bad == ["!", "\\", "[z-a]"]
    assert spec.match_file("debug.log") and not spec.match_file("keep.log") and not spec.match_file("main.py")
    assert ignore_spec(["*.log"])[1] == []


def test_a_nested_ignore_file_with_such_lines_is_reported_once_and_walked(tmp_path):
    """Walking a tree whose nested ``.gitignore`` holds a lone ``!`` keeps its valid lines and tells the caller the file and the lines, once."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".gitignore").write_text("!\n*.tmp\n")
    for rel in ("a/x.tmp", "a/y.py", "z.py"):
        (tmp_path / rel).write_text("x = 1\n")
    heard: list[tuple[str, list[str]]] = []
    wf = WorkspaceFilter(tmp_path, on_bad_lines=lambda name, lines: heard.append((name, lines)))
    assert sorted(wf.iter_files()) == ["a/.gitignore", "a/y.py", "z.py"]
    assert not wf.is_ignored("a/y.py") and wf.is_ignored("a/x.tmp")
    assert heard == [("a/.gitignore", ["!"])]


def test_a_user_glob_that_makes_no_pattern_is_a_settings_error_naming_it(tmp_path):
    """An exclude or include glob no pattern can be made of is refused when the settings load, with the setting and the glob named."""
    with pytest.raises(ValueError, match=r"WSCTX_EXCLUDE_GLOBS.*exclude_globs: '\[z-a\]' is not a valid glob"):
        load_settings(str(tmp_path / "none.toml"), env={"WSCTX_EXCLUDE_GLOBS": "*.log,[z-a]"})
    with pytest.raises(ValueError, match="include_globs/exclude_globs: '!'"):
        WorkspaceFilter(tmp_path, include_globs=["!"])
