"""Question analysis (daemons/lib/question.py): the parts of a question and each search's query."""
from __future__ import annotations

import numpy as np
import pytest

from daemons.lib import question
from daemons.lib.config import Settings
from daemons.lib.keywords import query_keywords
from daemons.lib.question import Frame, analyse, combine_vectors, dense_texts, keyword_query, plan, plan_for, rerank_query

ISSUE = '''Unexpected ValueError when fitting with sample_weight

When I call `fit_transform` with weights the scaler crashes. This used to work in the previous
release, and nothing in the changelog says the weights handling changed, so I think it is a bug.

```python
X = np.array([[1, 2], [3, 4]])
StandardScaler().fit_transform(X, sample_weight=np.ones(2))
```

Traceback (most recent call last):
  File "/home/u/venv/lib/python3.11/site-packages/scaler/_data.py", line 812, in partial_fit
    X = self._validate_data(X)
  File "scaler/validation.py", line 90, in check_array
    raise ValueError("bad")
ValueError: Input contains NaN, infinity or a value too large for dtype('float64').
'''


def test_python_traceback_frames_error_line_and_code_block_are_found():
    """A pasted Python traceback gives its frames in order, its error line, and the fenced code block."""
    a = analyse(ISSUE)
    assert a.frames[:2] == [Frame("/home/u/venv/lib/python3.11/site-packages/scaler/_data.py", 812, "partial_fit"),
                            Frame("scaler/validation.py", 90, "check_array")]
    assert a.error_lines == ["ValueError: Input contains NaN, infinity or a value too large for dtype('float64')."]
    assert any("StandardScaler().fit_transform" in b for b in a.code_blocks)
    assert a.title == "Unexpected ValueError when fitting with sample_weight"
    assert "Traceback" not in a.prose and "StandardScaler()" not in a.prose and "sample_weight" in a.prose
    assert a.is_long


def test_identifiers_are_frame_functions_exception_names_and_code_like_words():
    """Identifiers are the frames' functions, the exception's name and code-like words; fence contents do not count as inline code."""
    a = analyse(ISSUE)
    assert a.identifiers[:3] == ["partial_fit", "check_array", "ValueError"]
    assert {"fit_transform", "sample_weight", "StandardScaler", "float64"} <= set(a.identifiers)
    assert "np" not in a.identifiers and "X" not in a.identifiers and "weights" not in a.identifiers


@pytest.mark.parametrize("text,frame", [
    ("TypeError: x is undefined\n    at Object.parse (src/parser.ts:12:5)", Frame("src/parser.ts", 12, "parse")),
    ("thread 'main' panicked at 'boom'\n --> src/walk.rs:120:9", Frame("src/walk.rs", 120, None)),
    ("panic: nil map\n\ngoroutine 1 [running]:\nmain.main()\n\t/home/x/gin/context.go:120 +0x1d", Frame("/home/x/gin/context.go", 120, None)),
])
def test_frames_of_other_languages_are_found(text, frame):
    """JavaScript stack lines, Rust compiler positions and Go panic frames are frames too."""
    a = analyse(text)
    assert frame in a.frames
    assert a.error_lines and a.is_long


def test_a_short_question_keeps_the_spec_keyword_query():
    """A short question without code gets exactly ``query_keywords`` (SPEC §2)."""
    q = "how does the retry decorator stop after a delay?"
    assert not analyse(q).is_long
    assert keyword_query(q) == query_keywords(q)


def test_a_long_question_keyword_query_is_capped_and_led_by_the_error():
    """A long question's keyword query is at most max_terms terms, error-line terms first, and a word the paste repeats comes late."""
    q = ISSUE + "\n" + "np.zeros(3) + np.ones(3) " * 40
    kw = keyword_query(q, max_terms=12).split()
    assert len(kw) == 12
    assert kw[:3] == ["input", "contains", "nan"]
    assert "np" not in kw
    assert len(keyword_query(q, max_terms=200).split()) > 12


def test_rerank_query_holds_title_error_and_identifiers_within_the_limit():
    """A long question reaches the cross-encoder as its title, its last error line and its identifiers, cut to the limit."""
    rq = rerank_query(ISSUE, max_chars=300)
    lines = rq.splitlines()
    assert len(rq) <= 300
    assert lines[0] == "Unexpected ValueError when fitting with sample_weight"
    assert lines[1].startswith("ValueError: Input contains NaN")
    assert "check_array" in lines[2]
    assert rerank_query("short question", max_chars=300) == "short question"


def test_dense_texts_are_the_condensed_form_then_windows():
    """A question longer than a window is embedded as its condensed form and then windows of it, up to the cap."""
    texts = dense_texts(ISSUE * 3, window_chars=400, max_windows=3)
    assert len(texts) == 3
    assert texts[0].startswith("Unexpected ValueError")
    assert texts[1] == (ISSUE * 3)[:400]
    assert dense_texts("short", window_chars=400) == ["short"]


def test_mean_combines_to_a_unit_vector_and_max_keeps_every_row():
    """``mean`` gives one normalised vector, ``max`` one row per text, ``whole`` the first row."""
    v = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    m = combine_vectors(v, question.MEAN)
    assert m.shape == (2,) and np.isclose(np.linalg.norm(m), 1.0)
    assert combine_vectors(v, question.MAX).shape == (2, 2)
    assert combine_vectors(v, question.WHOLE).tolist() == [1.0, 0.0]


def test_analysis_off_gives_every_search_the_whole_question():
    """With question_analysis off the plan is SPEC §2's: query_keywords, the whole question embedded and reranked."""
    p = plan(ISSUE, analysis=False)
    assert p.keyword_query == query_keywords(ISSUE)
    assert p.dense_texts == [ISSUE] and p.rerank_query == ISSUE and p.analysis is None


def test_plan_for_reads_the_settings_and_refuses_an_unknown_dense_query():
    """``plan_for`` follows the settings; an unknown dense_query is an error naming the choices."""
    s = Settings(question_analysis=True, keyword_max_terms=5, dense_query="condensed", rerank_query_chars=100)
    p = plan_for(ISSUE * 3, s)
    assert len(p.keyword_query.split()) == 5 and len(p.dense_texts) == 1 and len(p.rerank_query) <= 100
    with pytest.raises(ValueError, match="whole, condensed, mean, max"):
        plan(ISSUE, dense="median")


def test_account_reports_what_was_searched():
    """The stage account lists the frames, error lines, identifiers and paths found."""
    acc = analyse(ISSUE).account()
    assert acc["long"] and acc["code_blocks"] >= 1
    assert acc["frames"][1] == "scaler/validation.py:90 check_array"
    assert "scaler/validation.py" in acc["paths"]


def test_workspace_counts_drop_absent_terms_and_put_rare_ones_first():
    """Given the workspace's term counts, a long question's terms no file holds are dropped and rarer terms lead their class."""
    df = {"input": 40, "contains": 3, "nan": 1, "infinity": 1, "dtype": 9, "float64": 2, "check_array": 1, "check": 30, "array": 50}
    kw = keyword_query(ISSUE, df=df).split()
    assert set(kw) <= set(df)
    assert kw.index("nan") < kw.index("contains") < kw.index("input")


def test_a_long_questions_title_says_whether_tests_are_asked_for():
    """A long question's role text is its title, so "tests added" in its body does not make tests count fully; a short question is its own role text."""
    from daemons.lib.roles import TEST, role_weights

    long_q = "Fix the retry delay overflow in the backoff helper\n\n" + "The delay grew without bound after many attempts. " * 8 + "\nTests added."
    p = plan(long_q)
    assert p.role_text == "Fix the retry delay overflow in the backoff helper"
    assert role_weights(p.role_text, 0.1, 0.1)[TEST] == 0.1
    assert role_weights(long_q, 0.1, 0.1)[TEST] == 1.0
    assert plan("how is the retry tested?").role_text == "how is the retry tested?"
    assert plan(long_q, analysis=False).role_text == long_q


REPORT_ISSUE = '''open_mfdataset ignores the chunks argument

Each variable is still one dask chunk when I pass chunks to open_mfdataset.

<details><summary>Output of show_versions()</summary>

INSTALLED VERSIONS
------------------
commit: None
python: 3.8.2 | packaged by conda-forge | (default, Mar  5 2020, 17:11:00)
OS: Linux
libhdf5: 1.10.5

xarray: 0.15.1
numpy: 1.18.1
netCDF4: 1.5.3
h5netcdf: 0.8.0
</details>
'''


@pytest.mark.parametrize("report", [
    "numpy: 1.18.1\nscipy: 1.4.1\npandas: 1.0.3",
    "numpy==1.18.1\nscipy==1.4.1\npandas==1.0.3",
    "Package    Version\n---------- -------\nnumpy      1.18.1\nscipy      1.4.1\npytest     5.4.1",
    "pylint 2.13.0-dev0\nastroid 2.9.3\nPython 3.9.7 (default, Sep 16 2021, 13:09:58)",
    " - ``pvlib.__version__``: '0.9.5'\n - ``pandas.__version__``:  '1.5.3'\n - python: 3.10.4",
])
def test_environment_reports_of_the_usual_shapes_are_recognised(report: str) -> None:
    """A pasted list of packages and versions (show_versions, pip freeze, pip list, --version, a template's bullets) is an environment report."""
    lines = report.splitlines()
    found = question.environment_lines(lines)
    assert {i for i, line in enumerate(lines) if any(ch.isdigit() for ch in line)} <= found


@pytest.mark.parametrize("text", [
    "a = 1.5\nb = 2.5\nc = 3.5",
    "Fails with numpy 1.18.1 since the upgrade.\nIt worked with numpy 1.17.\nPlease fix.",
    "numpy: 1.18.1\nscipy: 1.4.1",
])
def test_code_prose_and_short_version_mentions_are_not_reports(text: str) -> None:
    """Assignments, prose that names a version or two, and fewer than three version lines stay part of the question."""
    assert question.environment_lines(text.splitlines()) == set()


def test_an_environment_report_is_left_out_of_every_query() -> None:
    """The report's lines are counted and dropped: no package name of it reaches the keyword query, the cross-encoder's question or the embedded text."""
    a = analyse(REPORT_ISSUE)
    assert a.environment == 9  # commit: ... h5netcdf: and the closing tag
    assert "h5netcdf" not in a.text and "open_mfdataset" in a.text
    p = plan(REPORT_ISSUE)
    for term in ("h5netcdf", "netcdf4", "libhdf5", "numpy", "linux"):
        assert term not in p.keyword_query.lower().split()
        assert term not in p.rerank_query.lower()
        assert all(term not in t.lower() for t in p.dense_texts)
    assert "open_mfdataset" in p.keyword_query and "chunks" in p.keyword_query
    assert a.account()["environment_lines"] == 9
