"""What a question is made of, and the query each search gets from it (issue 19).

An editor's question is a line or two; an agent's is often a whole issue: a title, prose, a pasted
code block, a traceback and its error line. Treated like a short one, a long question's keyword
query holds every common word of the project (``np``, ``data``, ``self``), the embedder reads its
first 256 tokens and the cross-encoder its first 64: usually the title and half a sentence. This
module splits a question into its parts and builds each search's query from the parts that carry
the most.

Contract
--------
* ``analyse(question)`` returns an ``Analysis``:

  - ``code_blocks``: the bodies of fenced blocks (```` ``` ```` or ``~~~``), of runs of lines
    indented by 4 spaces or a tab after a blank line, and of interactive-prompt lines (``>>> ``,
    ``... ``, ``$ ``, ``In [1]: ``), in order;
  - ``frames``: traceback frames, from Python (``File "x.py", line 3, in f``), JavaScript (``at f
    (src/x.js:3:7)``), Go and Rust panics and compilers (``src/x.rs:3:7``): ``Frame(path, line,
    function)`` in order, deduplicated;
  - ``error_lines``: lines that state an error (``ValueError: ...``, ``error[E0382]: ...``,
    ``panic: ...``, ``TypeError: ...``, ``FAILED ...``), stripped, in order, deduplicated;
  - ``prose``: the question without its code blocks, frame lines and error lines;
  - ``title``: the first non-empty line of the prose (or of the question);
  - ``identifiers``: the frames' functions, each error line's first word (the exception's name)
    and the code-like identifiers (``snake_case``, ``camelCase``, names with digits, anything in
    backticks) of error lines, code blocks and prose, in that order, deduplicated, stop words out;
  - ``paths``: ``mentions.mentions`` of the whole question;
  - ``environment``: how many lines were an environment report and left out of every other part
    (``environment_lines``);
  - ``text``: the question without those lines.

* ``environment_lines(lines)`` is the indices of the lines that report the asker's environment
  rather than ask the question: a run of at least ``ENV_MIN_LINES`` lines that each name a
  package, tool or platform and its version (``numpy: 1.18.1``, ``numpy==1.18.1``, ``astroid
  2.9.3``, ``- pandas.__version__: '1.5.3'``, a ``pip list`` or ``conda list`` row), with the
  ``key: value`` lines (``OS: Linux``, ``commit: None``), rules and ``<details>`` tags between them;
  version lines must be at least half of the run's non-blank lines. Issue templates ask for such
  a report, and its package names are rare in the workspace, so that a rarest-first keyword query
  would be made of them (``h5netcdf``, ``netCDF4``, ``cftime``) and the cross-encoder's condensed
  question would list them as identifiers.

* ``Analysis.is_long`` is true when the question has more than ``LONG_WORDS`` words or any code
  block, frame or error line; ``Analysis.has_traceback`` when it has a frame (the search then
  gives the file-ranked keyword lists their traceback votes, ``fusion.TRACEBACK_LIST_WEIGHTS``).
* ``keyword_query(question, analysis, max_terms)`` is ``keywords.query_keywords(question)`` for a
  short question. For a long one the terms are ranked and the best ``max_terms`` kept, in order of
  rank: terms of error lines and frame functions first, then the title's, then the other code-like
  identifiers, then the prose's, then the code blocks' other words; within a class, terms that occur
  fewer times in the question come first (a pasted array repeats ``np`` forty times), then order
  of appearance. Given the workspace's document frequencies, terms no file holds are dropped and
  the rarer term in the workspace comes first within a class.
* ``rerank_query(question, analysis, max_chars)`` is the question itself when it fits in
  ``max_chars``; otherwise the title, the last error line, and the frames' functions and other
  identifiers (error-line and title identifiers first), joined by newlines and cut to
  ``max_chars``: what the cross-encoder's 64 question tokens should hold.
* ``plan(question, ...)`` gathers each search's query in a ``QueryPlan``; its ``role_text``, whose
  words say whether the question asks for tests, docs or config, is a long question's title.
* ``dense_texts(question, analysis, window_chars, max_windows)`` is the texts the question's
  vector is made from: the question alone when it fits in ``window_chars``; otherwise the
  title-led condensed form (``rerank_query`` at ``window_chars``) followed by windows of
  ``window_chars`` of the question, at most ``max_windows`` texts in all. ``plan`` gives it, and
  ``rerank_query``, the question without its environment report (``Analysis.text``).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from collections.abc import Mapping
from typing import Any

from daemons.lib.keywords import STOP_WORDS, _expand, identifiers, is_code_like, query_keywords, query_terms
from daemons.lib.mentions import mentions

__all__ = [
    "Analysis", "DENSE_QUERIES", "Frame", "LONG_WORDS", "QueryPlan", "analyse", "combine_vectors", "dense_texts", "keyword_query",
    "plan", "plan_for", "rerank_query",
]

#: A question of more words than this (or with code, a traceback or an error line) is long.
LONG_WORDS = 60
#: Keyword terms kept from a long question (``keyword_query``).
KEYWORD_MAX_TERMS = 32
#: Characters of a long question the cross-encoder is given (its 64 question tokens hold ~250).
RERANK_QUERY_CHARS = 300

#: ``dense_query`` values: how a long question's vector is made. ``whole``: the question as it is
#: (the embedder reads its first 256 tokens; SPEC); ``condensed``: ``rerank_query`` of the question
#: at ``DENSE_WINDOW_CHARS``; ``mean``: the normalised mean of the ``dense_texts`` vectors; ``max``:
#: one search per ``dense_texts`` vector, each chunk at its nearest.
WHOLE, CONDENSED, MEAN, MAX = "whole", "condensed", "mean", "max"
DENSE_QUERIES = (WHOLE, CONDENSED, MEAN, MAX)
#: Version lines that make a run of lines an environment report (``environment_lines``): a pasted
#: ``show_versions()``, ``pip list`` or ``--version`` output has many more; prose names one or two.
ENV_MIN_LINES = 3

#: Characters per dense window: about the embedder's 256 tokens of prose.
DENSE_WINDOW_CHARS = 1000
#: At most this many texts are embedded for one question (``mean``, ``max``).
DENSE_MAX_WINDOWS = 4


_FENCE_RE = re.compile(r"^\s*(```|~~~)")
_PROMPT_RE = re.compile(r"^\s*(>>> |\.\.\. |\$ |In \[\d+\]: |Out\[\d+\]: )")
_PY_FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+)(?:, in (\S+))?')
_JS_FRAME_RE = re.compile(r"^\s*at (?:(?:async )?([\w$.<>\[\] ]+?) \()?((?:[A-Za-z]:)?[^\s():]+\.\w+):(\d+)(?::\d+)?\)?\s*$")
_POS_FRAME_RE = re.compile(r"^\s*(?:-->\s*|at\s+)?((?:[A-Za-z]:)?[\w./\\-]+\.[A-Za-z]\w*):(\d+)(?::\d+)?\b")
_ERROR_RE = re.compile(
    r"^\s*(?:[\w.]*(?:Error|Exception|Warning|Exit|Interrupt|Fault)\b(?::|$)"
    r"|(?:error|fatal|panic)(?:\[\w+\])?:"
    r"|thread '.*' panicked"
    r"|FAILED\b|E\s{3}\w|AssertionError)"
)


@dataclass(frozen=True)
class Frame:
    """One traceback frame: the file, its line (None when not given) and the function (or None)."""

    path: str
    line: int | None
    function: str | None


@dataclass
class Analysis:
    """A question's parts (see the module docstring)."""

    title: str = ""
    prose: str = ""
    code_blocks: list[str] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    error_lines: list[str] = field(default_factory=list)
    identifiers: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    words: int = 0
    environment: int = 0
    text: str = ""

    @property
    def is_long(self) -> bool:
        return self.words > LONG_WORDS or bool(self.code_blocks or self.frames or self.error_lines)

    @property
    def has_traceback(self) -> bool:
        """Whether the question quotes a stack trace (a frame found): its own list votes apply
        (``fusion.TRACEBACK_LIST_WEIGHTS``)."""
        return bool(self.frames)

    def account(self) -> dict[str, Any]:
        """What was found, for the answer's stage account: counts and the first few of each."""
        return {
            "long": self.is_long, "words": self.words, "code_blocks": len(self.code_blocks),
            "frames": [f"{f.path}:{f.line}" + (f" {f.function}" if f.function else "") for f in self.frames[:5]],
            "error_lines": [e[:120] for e in self.error_lines[:3]], "identifiers": self.identifiers[:12],
            "paths": self.paths[:8], "environment_lines": self.environment,
        }


def _frame(line: str) -> Frame | None:
    m = _PY_FRAME_RE.match(line)
    if m:
        return Frame(m.group(1).replace("\\", "/"), int(m.group(2)), m.group(3) if m.group(3) and m.group(3) != "<module>" else None)
    m = _JS_FRAME_RE.match(line)
    if m:
        func = (m.group(1) or "").strip() or None
        return Frame(m.group(2).replace("\\", "/"), int(m.group(3)), func.split(".")[-1] if func else None)
    m = _POS_FRAME_RE.match(line)
    if m:
        return Frame(m.group(1).replace("\\", "/"), int(m.group(2)), None)
    return None


#: ``numpy: 1.18.1``, ``numpy==1.18.1``, ``numpy   1.18.1  py38_0``, ``- ``pandas.__version__``: '1.5.3'``,
#: ``Python 3.9.7 (default ...``, ``libhdf5: None``: a name, then ``:``, ``==`` or blanks, then a version.
_VERSION_LINE_RE = re.compile(
    r"""^\s*(?:[-*+]\s+)?(?:\*\*)?`{0,2}[A-Za-z][\w.\-]*`{0,2}(?:\*\*)?(?:\s*:|\s*==|\s)\s*['"`]?(?:v?\d+(?:\.\d+)+|None\b)"""
)
#: ``OS: Linux``, ``python-bits: 64``, ``LANG: en_US.UTF-8``: a short key and a short value.
_KEY_VALUE_RE = re.compile(r"^\s*(?:[-*+]\s+)?[A-Za-z][\w.\- ]{0,30}:\s+\S.{0,80}$")
#: Rules and the ``<details>`` wrapping that issue templates put around a report.
_REPORT_FRAME_RE = re.compile(r"^\s*(?:[-=_~*]{3,}|</?(?:details|summary)\b.*)\s*$", re.IGNORECASE)


def environment_lines(lines: list[str]) -> set[int]:
    """The indices of *lines* that belong to an environment report (see the module docstring)."""
    out: set[int] = set()
    run: list[int] = []
    versions = 0

    def close() -> None:
        nonlocal versions
        filled = sum(1 for i in run if lines[i].strip())
        if versions >= ENV_MIN_LINES and 2 * versions >= filled:
            out.update(run)
        run.clear()
        versions = 0

    for i, line in enumerate(lines):
        if _VERSION_LINE_RE.match(line):
            run.append(i)
            versions += 1
        elif _KEY_VALUE_RE.match(line) or (run and (not line.strip() or _REPORT_FRAME_RE.match(line))):
            run.append(i)
        else:
            close()
    close()
    return out


_INLINE_CODE_RE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _quoted(text: str) -> set[str]:
    """Identifiers inside inline `code` spans (not fences) of *text*."""
    return {i for m in _INLINE_CODE_RE.finditer(text) for i in identifiers(m.group(1))}


def analyse(question: str) -> Analysis:
    """Split *question* into its parts (see the module docstring)."""
    a = Analysis(paths=mentions(question), text=question)
    prose: list[str] = []
    code: list[str] = []
    lines = question.splitlines()
    report = environment_lines(lines)
    if report:
        a.environment = len([i for i in report if lines[i].strip()])
        lines = [line for i, line in enumerate(lines) if i not in report]
        a.text = "\n".join(lines)
    fence: str | None = None
    prev_blank = True
    indented: list[str] = []
    seen_frames: set[Frame] = set()
    seen_errors: set[str] = set()

    def flush_indented() -> None:
        if indented:
            a.code_blocks.append("\n".join(indented))
            indented.clear()

    for line in lines:
        stripped = line.strip()
        if fence is not None:
            if _FENCE_RE.match(line) and stripped.startswith(fence):
                if any(c.strip() for c in code):  # a fence that held only a report holds nothing now
                    a.code_blocks.append("\n".join(code))
                code, fence = [], None
            else:
                code.append(line)
                _classify(line, a, seen_frames, seen_errors)
            continue
        m = _FENCE_RE.match(line)
        if m:
            flush_indented()
            fence, code = m.group(1), []
            continue
        if (line.startswith(("    ", "\t")) and (prev_blank or indented)) and stripped:
            indented.append(line)
            _classify(line, a, seen_frames, seen_errors)
            continue
        flush_indented()
        if _PROMPT_RE.match(line):
            a.code_blocks.append(_PROMPT_RE.sub("", line, count=1))
            continue
        if _classify(line, a, seen_frames, seen_errors):
            continue
        if stripped in ("Traceback (most recent call last):", "Stack trace:", "stack backtrace:"):
            continue
        prose.append(line)
        prev_blank = not stripped
    if fence is not None and code:  # an unclosed fence runs to the end
        a.code_blocks.append("\n".join(code))
    flush_indented()
    a.prose = "\n".join(prose).strip()
    a.title = next((ln.strip() for ln in (a.prose or question).splitlines() if ln.strip()), "")
    a.words = len(identifiers(question))
    quoted = _quoted(a.prose)
    found: list[str] = [f.function for f in a.frames if f.function and identifiers(f.function) == [f.function]]
    for line in a.error_lines:
        head = identifiers(line)[:1]  # the exception's name: ValueError, TypeError, panic ...
        found.extend(i for i in identifiers(line) if is_code_like(i, quoted) or i in head)
    for text in (*a.code_blocks, a.prose):
        found.extend(i for i in identifiers(text) if is_code_like(i, quoted))
    a.identifiers = [i for i in dict.fromkeys(found) if i.lower() not in STOP_WORDS]
    return a


def _classify(line: str, a: Analysis, seen_frames: set[Frame], seen_errors: set[str]) -> bool:
    """Record *line* as a frame or an error line; True when it was one."""
    frame = _frame(line)
    if frame is not None:
        if frame not in seen_frames:
            seen_frames.add(frame)
            a.frames.append(frame)
        return True
    if _ERROR_RE.match(line):
        text = line.strip()
        if text not in seen_errors:
            seen_errors.add(text)
            a.error_lines.append(text)
        return True
    return False


def _terms(text: str) -> list[str]:
    """The keyword terms of *text* as ``query_keywords`` makes them, with repeats (inline code
    spans, not fences, mark identifiers as code)."""
    return query_terms(text, _quoted(text))


def keyword_query(question: str, analysis: Analysis | None = None, max_terms: int = KEYWORD_MAX_TERMS,
                  df: Mapping[str, int] | None = None) -> str:
    """The BM25 query: ``query_keywords`` for a short question, the ranked best *max_terms* terms
    of a long one (see the module docstring). With the workspace's document frequencies *df*
    (``IndexStore.document_frequencies``), a long question's terms that no file holds are left
    out and, within a class, the rarer term comes first."""
    a = analysis or analyse(question)
    if not a.is_long or max_terms <= 0:
        return query_keywords(a.text or question)
    counts = Counter(_terms(a.text or question))
    if df is not None:
        counts = Counter({t: (df.get(t, 0), n) for t, n in counts.items() if df.get(t, 0) > 0})
    classes = [
        _terms("\n".join([*a.error_lines, *(f.function or "" for f in a.frames)])),
        _terms(a.title),
        [t for ident in a.identifiers for t in _expand(ident)],
        _terms(a.prose),
        _terms("\n".join(a.code_blocks)),
    ]
    ranked: list[str] = []
    seen: set[str] = set()
    for terms in classes:
        order = {t: i for i, t in reversed(list(enumerate(terms)))}
        for t in sorted((t for t in order if t in counts), key=lambda t: (counts[t], order[t])):
            if t not in seen:
                seen.add(t)
                ranked.append(t)
    return " ".join(ranked[:max_terms])


def rerank_query(question: str, analysis: Analysis | None = None, max_chars: int = RERANK_QUERY_CHARS) -> str:
    """The question as the cross-encoder should read it (see the module docstring)."""
    if len(question) <= max_chars:
        return question
    a = analysis or analyse(question)
    if len(a.text) <= max_chars:  # it fits once its environment report is left out
        return a.text
    parts = [a.title[:max_chars]]
    if a.error_lines:
        parts.append(a.error_lines[-1][:max_chars])
    title_ids = set(identifiers(a.title))
    names = [f.function for f in reversed(a.frames) if f.function]
    names += [i for i in a.identifiers if i not in title_ids]
    picked = list(dict.fromkeys(names))
    if picked:
        parts.append(" ".join(picked))
    return "\n".join(p for p in parts if p)[:max_chars]


def dense_texts(question: str, analysis: Analysis | None = None, window_chars: int = DENSE_WINDOW_CHARS,
                max_windows: int = DENSE_MAX_WINDOWS) -> list[str]:
    """The texts the question's vector is made from (see the module docstring)."""
    if len(question) <= window_chars or max_windows <= 1:
        return [question]
    a = analysis or analyse(question)
    out = [rerank_query(question, a, window_chars)]
    for start in range(0, len(question), window_chars):
        if len(out) >= max_windows:
            break
        out.append(question[start:start + window_chars])
    return out


@dataclass
class QueryPlan:
    """What each search of one question is given: the BM25 query, the texts to embed (and how
    their vectors combine: ``dense``), the cross-encoder's question, and the analysis (None when
    analysis is off)."""

    keyword_query: str
    dense_texts: list[str]
    dense: str
    rerank_query: str
    analysis: Analysis | None
    #: the text whose words say whether tests, docs or config are asked for (``roles.role_weights``):
    #: a long question's title, since its body mentions tests and docs in passing ("tests added")
    role_text: str = ""
    #: the question itself
    question: str = ""

    @cached_property
    def mentions(self) -> list[str]:
        """``mentions.mentions`` of the question: the analysis's paths when there is one (so the
        question is scanned once), else computed on first use."""
        return self.analysis.paths if self.analysis is not None else mentions(self.question)

    @property
    def long(self) -> bool:
        """Whether the analysed question is long (``Analysis.is_long``): the final order gives it
        the long blend (``pipeline.blend``)."""
        return self.analysis is not None and self.analysis.is_long

    @property
    def traceback(self) -> bool:
        """Whether the analysed question quotes a traceback (``Analysis.has_traceback``): the
        searches give it the settings' traceback list votes (``config.Settings.list_weights``)."""
        return self.analysis is not None and self.analysis.has_traceback


def plan(question: str, *, analysis: bool = True, keyword_max_terms: int = KEYWORD_MAX_TERMS, dense: str = WHOLE,
         dense_windows: int = DENSE_MAX_WINDOWS, rerank_query_chars: int = RERANK_QUERY_CHARS,
         df: Mapping[str, int] | None = None) -> QueryPlan:
    """The queries of *question* (*df*: the workspace's document frequencies, for
    ``keyword_query``). With *analysis* off every search gets the question as SPEC §2 states it
    (``query_keywords``, the whole question embedded, the whole question reranked)."""
    if dense not in DENSE_QUERIES:
        raise ValueError(f"dense_query is {dense!r}, not one of {', '.join(DENSE_QUERIES)}")
    if not analysis:
        return QueryPlan(query_keywords(question), [question], WHOLE, question, None, question, question)
    a = analyse(question)
    text = a.text or question  # without its environment report
    if dense == WHOLE or len(text) <= DENSE_WINDOW_CHARS:
        texts, dense = [text], WHOLE
    elif dense == CONDENSED:
        texts = [rerank_query(text, a, DENSE_WINDOW_CHARS)]
    else:
        texts = dense_texts(text, a, DENSE_WINDOW_CHARS, dense_windows)
    return QueryPlan(keyword_query(question, a, keyword_max_terms, df), texts, dense, rerank_query(question, a, rerank_query_chars), a,
                     a.title if a.is_long else question, question)


def plan_for(question: str, settings: Any, df: Mapping[str, int] | None = None) -> QueryPlan:
    """``plan`` with the question settings of *settings* (a ``config.Settings``)."""
    return plan(question, analysis=settings.question_analysis, keyword_max_terms=settings.keyword_max_terms,
                dense=settings.dense_query, dense_windows=settings.dense_windows, rerank_query_chars=settings.rerank_query_chars,
                df=df)


def combine_vectors(vectors: Any, dense: str) -> Any:
    """The query vector(s) from the embedded ``dense_texts`` (a 2-D array, one row per text):
    one normalised row for ``mean``, every row for ``max`` (one search each), else the first row."""
    import numpy as np

    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        return vectors
    if dense == MEAN and len(vectors) > 1:
        v = vectors.mean(axis=0)
        n = float(np.linalg.norm(v))
        return (v / n if n > 0 else v).astype(np.float32)
    if dense == MAX and len(vectors) > 1:
        return vectors
    return vectors[0]
