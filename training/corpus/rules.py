"""The miner's rules, as plain functions: which commits become questions, what a question says,
which lines a commit changed, and which files count as source.

Contract
--------
* ``clean_message(message)`` is a commit message as a question: trailers (``Signed-off-by:``,
  ``Co-authored-by:`` and any ``Key-Name: value`` block at the end), issue and pull-request
  references (``#123``, ``GH-123``, ``(fixes #4)``, ``owner/repo#5``), URLs, HTML comments,
  check-list lines and a squash merge's ``* commit`` bullet lists' hashes are removed, blank runs
  folded, and the result cut to ``QUERY_MAX_CHARS``. A merge's ``Merge pull request #N from
  a/b`` subject is dropped, so its description becomes the question.
* ``skip_reason(...)`` names the first rule that drops a commit (``bot``, ``merge_no_description``,
  ``short_subject``, ``sweep``: ``message_skip_reason``; ``no_source``, ``too_many_files``:
  ``files_skip_reason``) or is None.
* ``parse_hunks(diff)`` is ``{path: [(start, end), ...]}`` of the *old* side (the parent's lines,
  1-based, inclusive) that each hunk of a ``git diff -U0`` changed. A pure insertion after old
  line L is recorded as ``(L, L)`` (``(1, 1)`` at the top): the code the new lines join.
* ``overlaps(span, ranges)`` says whether a chunk's line span touches any changed range.
* ``is_source(path)`` is a non-test, non-vendored file in one of ``SOURCE_LANGUAGES``.
* ``is_eval_repo(owner_name)`` is True for the evaluation repositories, their forks under
  another owner and names that embed them (``EVAL_REPOS``): the miner refuses them.
* ``near_duplicate(a, b)`` is True when two passages share at least ``NEAR_DUP`` of their
  identifier sets (Jaccard): such a negative would teach the model that the positive is wrong.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from daemons.lib.chunking import language_for_path
from daemons.lib.keywords import identifiers
from daemons.lib.roles import TEST, file_role

#: The evaluation repositories (``../shared/eval``): never mined, nor their forks or copies.
EVAL_REPOS = frozenset({
    "astropy", "requests", "flask", "click", "httpx", "pytest", "pylint", "seaborn", "sphinx", "sympy",
    "xarray", "twinny", "sqlfluff", "pvlib-python", "astroid", "pydicom", "marshmallow", "django",
    "scikit-learn", "matplotlib",
})
#: Languages whose files are mined as source (the product chunks them by syntax).
SOURCE_LANGUAGES = frozenset({"python", "typescript", "tsx", "javascript", "go", "rust"})
#: A commit touching more non-test source files than this is a sweep, not one change.
MAX_SOURCE_FILES = 5
#: Subjects shorter than this many words say too little to be a question.
MIN_SUBJECT_WORDS = 5
QUERY_MAX_CHARS = 2000
#: Identifier-set Jaccard at or above which a negative counts as a copy of a positive.
NEAR_DUP = 0.8

_BOT = re.compile(r"\[bot\]|dependabot|renovate|pre-commit-ci|github-actions|allcontributors|greenkeeper|pyup-bot|"
                  r"snyk-bot|imgbot|mergify|semantic-release", re.IGNORECASE)
#: Subjects of formatting, lint, rename and release sweeps.
_SWEEP = re.compile(
    r"^(\W*)(style|chore\(deps\)|build\(deps\))\b"
    r"|\b(re)?format(ting|ted)?\b|\bblack\b|\bisort\b|\bprettier\b|\bruff format\b|\bpyupgrade\b|\blint(ing|er)?\b|"
    r"\bwhitespace\b|\btypos?\b|\bspelling\b|\brename[sd]?\b|\bbump(ed|s)?\b|\brelease[sd]?\b|\bversion \d|"
    r"\bchangelog\b|\bmerge (branch|remote-tracking)\b|\bupdate (copyright|license|readme|docs?)\b",
    re.IGNORECASE,
)
_MERGE_SUBJECT = re.compile(r"^Merge (pull request|branch|remote-tracking branch|tag)\b.*$", re.IGNORECASE)
_TRAILER = re.compile(r"^[A-Z][A-Za-z0-9-]*(-[A-Za-z0-9]+)*: \S")
_KNOWN_TRAILER = re.compile(
    r"^(signed-off-by|co-authored-by|co-authored|reviewed-by|acked-by|tested-by|reported-by|suggested-by|"
    r"helped-by|change-id|cc|fixes|closes|resolves|refs?|see-also|pr-url|pr-close|issue|bug|ghstack-source-id|"
    r"pull request resolved|differential revision|reviewers|subscribers|tags|approved-by|backport-of|"
    r"cherry-picked from|x-original-commit)\b.*$",
    re.IGNORECASE,
)
_URL = re.compile(r"<?\bhttps?://[^\s)>\]]+>?|\bwww\.[^\s)>\]]+")
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_CHECKLIST = re.compile(r"^\s*[-*]\s*\[[ xX]\].*$", re.MULTILINE)
_REF_WORDS = re.compile(r"\(?\b(fix(es|ed)?|close[sd]?|resolve[sd]?|refs?|see|part of|related to)\s*:?\s*"
                        r"((\w[\w.-]*/\w[\w.-]*)?(#|gh-)\d+[,\s]*(and\s*)?)+\)?", re.IGNORECASE)
_REFS = re.compile(r"\(\s*(?:\w[\w.-]*/\w[\w.-]*)?(?:#|gh-|GH-)\d+\s*\)|(?:\w[\w.-]*/\w[\w.-]*)?(?:#|\bgh-|\bGH-)\d+\b")
_SQUASH_BULLET = re.compile(r"^\s*\*\s+[0-9a-f]{7,40}\s*$", re.MULTILINE)
_FOOTNOTE = re.compile(r"^\s*\[\d+\]:?\s*$|\s?\[\d+\]", re.MULTILINE)
_BLANKS = re.compile(r"\n{3,}")
_SPACES = re.compile(r"[ \t]{2,}")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
_VENDORED = re.compile(r"(^|/)(_?vendor(ed)?|third[_-]?party|node_modules|dist|build|externals?)/|\.min\.(js|css)$"
                       r"|(^|/)(examples?|benchmarks?|fixtures?|docs?|scripts?)/")


def _strip_trailers(lines: list[str]) -> list[str]:
    """Drop the trailing block of ``Key: value`` trailer lines and every known trailer line."""
    out = [ln for ln in lines if not _KNOWN_TRAILER.match(ln.strip())]
    end = len(out)
    while end > 0 and (not out[end - 1].strip() or _TRAILER.match(out[end - 1].strip())):
        end -= 1
    # only a block after a blank line is a trailer block; a one-paragraph message keeps its lines
    if end < len(out) and end > 0:
        tail = [ln for ln in out[end:] if ln.strip()]
        if tail and all(_TRAILER.match(ln.strip()) for ln in tail):
            out = out[:end]
    return out


def clean_message(message: str) -> str:
    """The commit message as a question (see the module contract)."""
    text = _HTML_COMMENT.sub("", message.replace("\r\n", "\n"))
    lines = text.split("\n")
    if lines and _MERGE_SUBJECT.match(lines[0].strip()):
        lines = lines[1:]
    lines = _strip_trailers(lines)
    text = "\n".join(lines)
    text = _CHECKLIST.sub("", text)
    text = _SQUASH_BULLET.sub("", text)
    text = _URL.sub("", text)
    text = _FOOTNOTE.sub("", text)
    text = _REF_WORDS.sub("", text)
    text = _REFS.sub("", text)
    text = "\n".join(_SPACES.sub(" ", ln).rstrip() for ln in text.split("\n"))
    text = _BLANKS.sub("\n\n", text).strip()
    # a subject left ending in a dangling "(" or ":" by a removed reference
    text = re.sub(r"[ \t]*\(\s*\)", "", text)
    return text[:QUERY_MAX_CHARS].rstrip()


def subject_words(question: str) -> int:
    """Words in the question's first line."""
    first = question.split("\n", 1)[0]
    return len(re.findall(r"\w+", first))


def message_skip_reason(author: str, question: str, is_merge: bool) -> str | None:
    """The first rule on the author and the cleaned message that drops a commit, or None."""
    if _BOT.search(author):
        return "bot"
    if is_merge and not question:
        return "merge_no_description"
    if subject_words(question) < MIN_SUBJECT_WORDS:
        return "short_subject"
    if _SWEEP.search(question.split("\n", 1)[0]):
        return "sweep"
    return None


def files_skip_reason(source_files: Sequence[str]) -> str | None:
    """The rule on the non-test source files a commit touched that drops it, or None."""
    if not source_files:
        return "no_source"
    if len(source_files) > MAX_SOURCE_FILES:
        return "too_many_files"
    return None


def skip_reason(author: str, question: str, is_merge: bool, source_files: Sequence[str]) -> str | None:
    """The first rule that drops this commit (message rules, then file rules), or None when it becomes a question."""
    return message_skip_reason(author, question, is_merge) or files_skip_reason(source_files)


def parse_hunks(diff: str) -> dict[str, list[tuple[int, int]]]:
    """Old-side changed line ranges per file of a ``git diff -U0`` (see the module contract).

    Files are keyed by their old path (``--- a/PATH``); created files (``--- /dev/null``) are
    left out, since the parent has nothing of them to find.
    """
    out: dict[str, list[tuple[int, int]]] = {}
    current: str | None = None
    for line in diff.split("\n"):
        if line.startswith("--- "):
            name = line[4:].strip()
            if name.startswith('"'):
                name = name.strip('"')
            current = name[2:] if name.startswith("a/") else None
            if current is not None:
                out.setdefault(current, [])
            continue
        if current is None:
            continue
        m = _HUNK.match(line)
        if m:
            start = int(m.group(1))
            count = 1 if m.group(2) is None else int(m.group(2))
            if count == 0:
                out[current].append((max(start, 1), max(start, 1)))
            else:
                out[current].append((start, start + count - 1))
    return {p: r for p, r in out.items() if r}


def overlaps(span: tuple[int, int], ranges: Iterable[tuple[int, int]]) -> bool:
    """Whether the inclusive line span touches any of the inclusive ranges."""
    s, e = span
    return any(s <= re_ and rs <= e for rs, re_ in ranges)


def is_source(path: str) -> bool:
    """A non-test, non-vendored file of a mined language."""
    if language_for_path(path) not in SOURCE_LANGUAGES or _VENDORED.search(path):
        return False
    return file_role(path) != TEST and not path.endswith(".d.ts")


def is_eval_repo(owner_name: str) -> bool:
    """Whether ``owner/name`` is an evaluation repository, a fork of one or a copy that names it."""
    name = owner_name.rsplit("/", 1)[-1].lower()
    if name in EVAL_REPOS:
        return True
    parts = set(re.split(r"[-_.]", name))
    return any(e in parts or name.startswith(e + "-") or name.endswith("-" + e) for e in EVAL_REPOS if "-" not in e) \
        or any(e in name for e in EVAL_REPOS if "-" in e)


def near_duplicate(a: str, b: str) -> bool:
    """Whether two passages' identifier sets overlap by at least ``NEAR_DUP`` (Jaccard)."""
    sa, sb = set(identifiers(a)), set(identifiers(b))
    if not sa or not sb:
        return a.strip() == b.strip()
    return len(sa & sb) / len(sa | sb) >= NEAR_DUP
