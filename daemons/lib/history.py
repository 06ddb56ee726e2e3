"""Questions from a project's own history: which commits become retrieval cases, what a commit
message says as a question, and which files count as source. ``wsctx eval`` asks them of the
workspace; the training miner (``training/corpus``) uses the same rules, so what the models are
trained on and what a user measures are cut alike.

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
* ``is_source(path)`` is a non-test, non-vendored file in one of ``SOURCE_LANGUAGES``.
* ``commit_cases(root, present, limit)`` reads the git history of the work tree at ``root``
  (newest first, first parents only; paths relative to ``root``, which may be a repository's subfolder) and returns ``CommitCases``: up to ``limit`` cases, each a
  cleaned message with the non-test source files its commit modified or added (renames by their
  new path) as gold, all of them in ``present`` (the files the workspace indexes now), and the
  count of commits read before it had them that each rule dropped, plus ``gone``: a changed file
  is no longer in the workspace.
"""
from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from daemons.lib.chunking import language_for_path
from daemons.lib.roles import TEST, file_role

#: Languages whose files are mined as source (the product chunks them by syntax).
SOURCE_LANGUAGES = frozenset({"python", "typescript", "tsx", "javascript", "go", "rust"})
#: A commit touching more non-test source files than this is a sweep, not one change.
MAX_SOURCE_FILES = 5
#: Subjects shorter than this many words say too little to be a question.
MIN_SUBJECT_WORDS = 5
QUERY_MAX_CHARS = 2000

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


def is_source(path: str) -> bool:
    """A non-test, non-vendored file of a mined language."""
    if language_for_path(path) not in SOURCE_LANGUAGES or _VENDORED.search(path):
        return False
    return file_role(path) != TEST and not path.endswith(".d.ts")


# ---------------------------------------------------------------------------------- the history

#: Commits read at most by ``commit_cases`` (newest first): enough for any ``limit`` on a real
#: project, and a bound on a very long history's read time.
MAX_COMMITS = 20_000
_RECORD, _FIELD = "\x1e", "\x1f"


@dataclass(frozen=True)
class CommitCase:
    commit: str
    question: str
    gold: list[str]


@dataclass
class CommitCases:
    cases: list[CommitCase] = field(default_factory=list)
    commits_read: int = 0
    skipped: Counter = field(default_factory=Counter)


class NotAGitRepository(ValueError):
    """The folder is not inside a git work tree, or git is not installed."""


def changed_source_files(name_status: str) -> list[str]:
    """The non-test source files a ``git log --name-status`` block modified or added, renamed
    ones by their new path; deleted files are left out (nothing of them is left to find)."""
    out: list[str] = []
    for line in name_status.splitlines():
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0]:
            continue
        status, path = parts[0][0], parts[-1]
        if status in "MARC" and is_source(path) and path not in out:
            out.append(path)
    return out


def _records(cmd: list[str]) -> Iterator[str]:
    """The ``_RECORD``-separated records of a git command's output, read as it comes, so that the
    caller may stop early (the process is ended then)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise NotAGitRepository("git is not installed") from None
    assert proc.stdout is not None and proc.stderr is not None
    buf, started = "", False
    try:
        for raw in iter(lambda: proc.stdout.read(1 << 16), b""):  # type: ignore[union-attr]
            buf += raw.decode("utf-8", "replace")
            *done, buf = buf.split(_RECORD)
            for rec in done:
                if started:
                    yield rec
                started = True
        if proc.wait() != 0:
            why = proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
            raise NotAGitRepository(f"no git history to read ({why[-1] if why else 'git log failed'})")
        if started:
            yield buf
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def commit_cases(root: str | Path, present: Collection[str], limit: int, max_commits: int = MAX_COMMITS) -> CommitCases:
    """Up to ``limit`` retrieval cases from the history of the git work tree at ``root``, newest
    first (see the module contract). NotAGitRepository when ``root`` has no history to read."""
    fmt = _RECORD + _FIELD.join(["%H", "%P", "%an <%ae>", "%B"]) + _FIELD
    cmd = ["git", "-C", str(root), "log", "--first-parent", "--diff-merges=first-parent", "--name-status", "--root", "-M", "--relative",
           f"--max-count={max_commits}", f"--format={fmt}", "HEAD", "--", "."]
    out = CommitCases()
    for record in _records(cmd):
        parts = record.split(_FIELD)
        if len(parts) < 5:
            continue
        sha, parents, author, message, name_status = parts[0], parts[1].split(), parts[2], parts[3], parts[4]
        out.commits_read += 1
        question = clean_message(message)
        files = changed_source_files(name_status)
        why = skip_reason(author, question, len(parents) > 1, files)
        if why is None and any(f not in present for f in files):
            why = "gone"
        if why is not None:
            out.skipped[why] += 1
            continue
        out.cases.append(CommitCase(commit=sha, question=question, gold=files))
        if len(out.cases) >= limit:
            break
    return out
