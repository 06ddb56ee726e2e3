"""The front end to end: real daemons (watcher, chunker, embedder, searcher, reranker, front) answer
questions about a small temp workspace through ``daemons.client.WorkspaceClient``.

One daemon set (module scope) serves most tests; tests that stop a daemon restart it before they
end. The team-index and CURVE tests start a second, smaller set (no reranker) for workspace B.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

from daemons.client import WorkspaceClient
from daemons.lib.security import make_keys
from daemons.lib.workspaces import workspace_id
from protocol.errors import BadMessage, Timeout, Unavailable
from protocol.schema import WorkspaceAddRequest
from tests.support import Daemons, daemon_env, register, short_tmpdir, table_mismatches, wait_until

REPO = Path(__file__).resolve().parent.parent
CROSS_ENCODER = REPO / "models" / "artifacts" / "cross-encoder" / "manifest.json"
INDEX_TIMEOUT = 120
FULL_SET = ("watcher", "chunker", "embedder", "searcher", "reranker", "front")

RETRY = '''"""Retry with exponential backoff for flaky network calls."""
import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")


class RetryError(Exception):
    """Raised when every attempt failed."""


def backoff_delays(attempts: int, base: float = 0.5, cap: float = 30.0) -> list[float]:
    """Exponential backoff with full jitter: attempt i waits up to base * 2**i seconds."""
    delays = []
    for i in range(attempts):
        # full jitter keeps many clients from retrying in lockstep
        delays.append(random.uniform(0, min(cap, base * 2 ** i)))
    return delays


def retry_call(fn: Callable[[], T], attempts: int = 5, base: float = 0.5) -> T:
    """Call ``fn`` until it succeeds, sleeping a backoff delay between failed attempts."""
    last: Exception | None = None
    for delay in backoff_delays(attempts, base):
        try:
            return fn()
        except (ConnectionError, TimeoutError) as exc:
            last = exc
            time.sleep(delay)
    raise RetryError(f"gave up after {attempts} attempts") from last
'''

CONFIG = '''"""Parse the application's INI-style configuration file into typed settings."""
import configparser
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 4
    log_level: str = "info"


def parse_config_file(path: str | Path) -> ServerConfig:
    """Read the [server] section of an INI config file; missing keys keep their defaults."""
    parser = configparser.ConfigParser()
    parser.read(path, encoding="utf-8")
    section = parser["server"] if parser.has_section("server") else {}
    return ServerConfig(
        host=section.get("host", "127.0.0.1"),
        port=int(section.get("port", 8080)),
        workers=int(section.get("workers", 4)),
        log_level=section.get("log_level", "info").lower(),
    )


def validate_config(cfg: ServerConfig) -> list[str]:
    """Return the problems of a parsed config (an empty list when it is valid)."""
    problems = []
    if not 0 < cfg.port < 65536:
        problems.append(f"port {cfg.port} out of range")
    if cfg.workers < 1:
        problems.append("workers must be at least 1")
    return problems
'''

TOKENS = '''"""Store of authentication tokens: issue, look up, revoke, expire."""
import hashlib
import secrets
import time


class TokenStore:
    """Keeps hashed bearer tokens for user sessions, each with an expiry time."""

    def __init__(self, ttl_seconds: int = 3600) -> None:
        self.ttl_seconds = ttl_seconds
        self._tokens: dict[str, tuple[str, float]] = {}

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def issue_token(self, user_id: str) -> str:
        """Create a new random bearer token for ``user_id``; only its hash is stored."""
        token = secrets.token_urlsafe(32)
        self._tokens[self._digest(token)] = (user_id, time.time() + self.ttl_seconds)
        return token

    def user_for_token(self, token: str) -> str | None:
        """The user a token belongs to, or None when it is unknown or expired."""
        entry = self._tokens.get(self._digest(token))
        if entry is None or entry[1] < time.time():
            return None
        return entry[0]

    def revoke_token(self, token: str) -> None:
        self._tokens.pop(self._digest(token), None)
'''

TEST_RETRY = '''"""Tests of the retry/backoff helpers."""
import pytest

from retry import RetryError, backoff_delays, retry_call


def test_backoff_delays_grow_and_are_capped():
    delays = backoff_delays(6, base=1.0, cap=4.0)
    assert len(delays) == 6
    assert all(0 <= d <= 4.0 for d in delays)


def test_retry_call_gives_up_after_attempts(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        raise ConnectionError("down")

    with pytest.raises(RetryError):
        retry_call(flaky, attempts=3)
    assert len(calls) == 3
'''

DOC = '''# Architecture

The service is a small HTTP API in front of a job queue.

## Configuration

Settings come from an INI file; see `config_parser.py`. The `[server]` section sets the host,
the port and the number of workers.

## Authentication

Clients send a bearer token. Tokens are issued at login and kept hashed in the token store.
'''

BILLING = '''"""Invoices for the billing service: line items, tax and totals."""
from dataclasses import dataclass, field


@dataclass
class LineItem:
    description: str
    unit_price_cents: int
    quantity: int = 1


@dataclass
class Invoice:
    customer_id: str
    items: list[LineItem] = field(default_factory=list)
    tax_rate: float = 0.2

    def subtotal_cents(self) -> int:
        return sum(i.unit_price_cents * i.quantity for i in self.items)

    def invoice_total_cents(self) -> int:
        """The invoice total with tax, rounded to whole cents."""
        return round(self.subtotal_cents() * (1 + self.tax_rate))
'''

# a benchmark's sample questions: it quotes a question word for word without answering it
QUESTIONS = '''"""Questions the latency benchmark asks."""
QUESTIONS = [
    "where are revoked bearer tokens checked?",
    "how long does a session token live?",
]
'''

FILES = {
    "retry.py": RETRY,
    "bench/questions.py": QUESTIONS,
    "config_parser.py": CONFIG,
    "auth/token_store.py": TOKENS,
    "tests/test_retry.py": TEST_RETRY,
    "docs/architecture.md": DOC,
}


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def file_lines(root: Path, rel: str, start: int, end: int) -> str:
    lines = (root / rel).read_text().splitlines(keepends=True)
    return "".join(lines[start - 1 : end])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reranker_model_present() -> bool:
    return CROSS_ENCODER.is_file()


def needs_reranker_model() -> None:
    if not reranker_model_present():
        pytest.skip("cross-encoder model not built yet (models/artifacts/cross-encoder/)")


class Stack:
    """One daemon set on one workspace, with a client to its front."""

    def __init__(self, base: Path, names, files: dict[str, str], **settings) -> None:
        self.base = base
        self.root = base / "w"
        self.root.mkdir()
        write_files(self.root, files)
        self.env = daemon_env(base, **settings)
        self.d = Daemons(names, self.env, base)
        self.wid = register(self.d.data_dir, self.root)
        self.client = WorkspaceClient(runtime_dir=self.d.runtime_dir, timeout_ms=30000)

    def start(self) -> None:
        self.d.start(timeout=90)
        wait_until(lambda: not table_mismatches(self.d.data_dir, self.root), INDEX_TIMEOUT,
                   message=lambda: f"{table_mismatches(self.d.data_dir, self.root)}\n{self.d.log_tail()}")

    def ask(self, question: str, **kw):
        kw.setdefault("workspace", str(self.root))
        return self.client.ask(question, **kw)

    def restart(self, name: str, **extra_env: str) -> None:
        if self.d.running(name):
            self.d.terminate(name)
        self.d.start(name, timeout=90, **extra_env)

    def close(self) -> None:
        self.client.close()
        try:
            self.d.stop_all()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def stack():
    s = Stack(short_tmpdir("wf"), FULL_SET, FILES)
    try:
        s.start()
        yield s
    except BaseException:
        print(s.d.log_tail())
        raise
    finally:
        s.close()


@pytest.fixture(scope="module")
def team_stack():
    """Workspace B (billing code) with its own daemons, no reranker; its front on loopback tcp."""
    port = free_port()
    s = Stack(short_tmpdir("wg"), ("watcher", "chunker", "embedder", "searcher", "front"), {"billing/invoice.py": BILLING},
              front_tcp=f"tcp://127.0.0.1:{port}", front_tcp_insecure="true")
    s.tcp = f"tcp://127.0.0.1:{port}"
    try:
        s.start()
        yield s
    finally:
        s.close()


def code_blocks(reply):
    return [b for b in reply.blocks if b.kind == "code" and not b.team]


# --------------------------------------------------------------------------- answers


@pytest.mark.timeout(300)
def test_blocks_are_labelled_with_the_file_lines(stack):
    """Every block is labelled path:start-end and its text is exactly those lines of the file on disk."""
    reply = stack.ask("how does the retry backoff work?")
    assert reply.blocks
    for b in reply.blocks:
        assert b.label == f"{b.path}:{b.start_line}-{b.end_line}"
        assert b.text == file_lines(stack.root, b.path, b.start_line, b.end_line)
        assert f"{b.label}" in reply.prompt


@pytest.mark.timeout(120)
def test_prompt_tells_the_model_to_cite_labels_and_ignore_irrelevant_blocks(stack):
    """The prompt text carries the instruction to cite the labels and to ignore blocks that do not bear on the question."""
    reply = stack.ask("how is the config file parsed?")
    assert "cite its label" in reply.prompt
    assert "Ignore any block that does not bear on the question" in reply.prompt
    assert "Question: how is the config file parsed?" in reply.prompt


@pytest.mark.timeout(120)
def test_context_line_reports_query_reranked_kept_near_misses_and_degraded(stack):
    """The context line names the searched query, the reranked count, kept hits (with probabilities), near misses and degraded modes."""
    reply = stack.ask("how is the config file parsed?", threshold=0.5)
    line = reply.context_line
    assert "\n" not in line
    assert 'searched "how is the config file parsed?"' in line
    for d in reply.degraded:
        assert " ".join(d.split()) in line
    if reranker_model_present():
        assert not any("fused order" in d for d in reply.degraded), line
        rerank = next(s for s in reply.stages if s.name == "rerank")
        assert f"reranked {rerank.detail['reranked']}" in line and rerank.detail["reranked"] > 0
        for b in code_blocks(reply):
            m = re.search(re.escape(b.label) + r" (\d\.\d\d)", line)
            assert m and abs(float(m.group(1)) - b.probability) <= 0.006, (b.label, line)
        if reply.near_misses:
            n = reply.near_misses[0]
            m = re.search("near misses " + re.escape(n.label) + r" (\d\.\d\d)", line)
            assert m and abs(float(m.group(1)) - n.probability) <= 0.006, line
    else:
        assert "reranked 0" in line
        assert "fused order (reranker unavailable)" in line
    assert "kept " in line


@pytest.mark.timeout(120)
def test_a_question_over_the_limit_is_refused_at_once_and_a_long_one_is_answered_with_a_short_context_line(stack):
    """A question over MAX_QUESTION_CHARS gets bad_message naming the limit at once; a 60,000-character one is answered, its context line quoting only the head."""
    from daemons.front.service import MAX_QUESTION_CHARS
    from daemons.lib.assembly import CONTEXT_QUERY_CHARS

    t0 = time.monotonic()
    with pytest.raises(BadMessage) as info:
        stack.ask("x " * (MAX_QUESTION_CHARS // 2 + 1))
    assert f"the limit is {MAX_QUESTION_CHARS}" in info.value.message and time.monotonic() - t0 < 10
    long_question = "how is the config file parsed? " + "the parser reads every section and key " * 1500
    reply = stack.ask(long_question)
    assert len(long_question) > 50_000 and code_blocks(reply)
    assert len(reply.context_line) < CONTEXT_QUERY_CHARS + 2000
    assert 'searched "how is the config file parsed?' in reply.context_line and "…" in reply.context_line


@pytest.mark.timeout(120)
def test_out_of_range_question_settings_are_refused_with_the_range(stack):
    """A threshold outside [0, 1] or a snippet count under 1 in a request is bad_message saying the valid range."""
    for kw, message in (({"threshold": 5.0}, "rerank_threshold must be between 0 and 1, not 5"),
                        ({"threshold": -1.0}, "rerank_threshold must be between 0 and 1, not -1"),
                        ({"snippet_count": 0}, "snippet_count must be at least 1, not 0")):
        with pytest.raises(BadMessage) as info:
            stack.ask("how is the config file parsed?", **kw)
        assert message in info.value.message


@pytest.mark.timeout(120)
def test_a_question_sets_its_own_ranking_and_bad_overrides_name_the_setting(stack):
    """A question's ranking overrides change only its own answer (rerank_top 1 gives one candidate), and an unknown, index-shaping or out-of-range one is bad_message naming it."""
    question = "how is the config file parsed?"
    narrow = stack.ask(question, overrides={"rerank_top": "1"}, threshold=0.0)
    assert next(s for s in narrow.stages if s.name == "search").detail["candidates"] == 1
    wide = stack.ask(question, threshold=0.0)
    assert next(s for s in wide.stages if s.name == "search").detail["candidates"] > 1
    for overrides, message in (({"rrf_kk": 5}, "unknown setting 'rrf_kk'; did you mean 'rrf_k'?"),
                               ({"chunk_max_chars": 10}, "chunk_max_chars cannot be set for one question"),
                               ({"test_weight": "2"}, "test_weight must be between 0 and 1, not 2"),
                               ({"file_list": "all"}, "file_list 'all': use both, chunks, files"),
                               # sizes that would make one question's cost unbounded
                               ({"vector_k": "100000"}, "vector_k = 100000 is more than one question may ask (at most 200)"),
                               ({"keyword_k": 100000, "rerank_top": 100000}, "is more than one question may ask"),
                               ({"file_keyword_pool": "100000"}, "file_keyword_pool = 100000 is more than one question may ask")):
        with pytest.raises(BadMessage) as info:
            stack.ask(question, overrides=overrides)
        assert message in info.value.message, info.value.message


@pytest.mark.timeout(120)
def test_code_quoting_the_question_is_weighed_below_the_code_that_answers_it(stack):
    """A sample list holding the question word for word is weighted down and named in the context line, so the token store leads; SPEC's weight 1 is one setting away."""
    question = "where are revoked bearer tokens checked?"
    reply = stack.ask(question, threshold=0.0)
    assert code_blocks(reply)[0].path == "auth/token_store.py", reply.context_line
    assert "1 candidate quotes the question ×0.25" in reply.context_line
    plain = stack.ask(question, threshold=0.0, overrides={"question_copy_weight": "1"})
    assert code_blocks(plain)[0].path == "bench/questions.py", plain.context_line
    assert "quotes the question" not in plain.context_line


@pytest.mark.timeout(120)
def test_stages_are_timed(stack):
    """The reply's stages include search, rerank, widen and assemble, each with a timing."""
    reply = stack.ask("where are auth tokens stored?")
    names = [s.name for s in reply.stages]
    for name in ("search", "rerank", "widen", "assemble"):
        assert name in names
    assert names.index("search") < names.index("rerank") < names.index("widen") < names.index("assemble")
    assert all(isinstance(s.ms, float) and s.ms >= 0 for s in reply.stages)
    assert next(s for s in reply.stages if s.name == "search").detail["candidates"] > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("question, path", [
    ("how is the config file parsed?", "config_parser.py"),
    ("where are authentication tokens stored and expired?", "auth/token_store.py"),
    ("exponential backoff between retries", "retry.py"),
])
def test_the_right_file_ranks_first(stack, question, path):
    """For a clear question the file that answers it is the first block."""
    reply = stack.ask(question)
    assert code_blocks(reply)[0].path == path, reply.context_line


@pytest.mark.timeout(120)
def test_real_daemons_fuse_both_file_ranked_lists(stack):
    """Through the real daemons the answer's first block was found by the whole-file and the pooled file lists too."""
    reply = stack.ask("exponential backoff between retries")
    first = code_blocks(reply)[0]
    assert first.path == "retry.py"
    assert {"file_bm25", "file_keyword"} <= set(first.retrievers), first.retrievers


@pytest.mark.timeout(120)
def test_a_file_named_in_a_traceback_is_answered_and_the_context_line_says_so(stack):
    """A file the question names by an absolute traceback path is answered, below the threshold too, and the context line names it; the rerank stage gives the long question's blend and the search stage its traceback list votes and 12 candidates, where a long question without a traceback gets 16."""
    reply = stack.ask('this crashes on startup:\n  File "/srv/app/config_parser.py", line 12, in load\nKeyError: port')
    named = [b for b in code_blocks(reply) if b.path == "config_parser.py"]
    assert named, reply.context_line
    assert "named config_parser.py" in reply.context_line, reply.context_line
    # a traceback makes it a long question: the final order takes the long blend, and says so
    assert next(s for s in reply.stages if s.name == "rerank").detail["blend"] == [0, 1.0]
    short = stack.ask("how is the config file parsed?")
    assert next(s for s in short.stages if s.name == "rerank").detail["blend"] == [60, 0.5]
    # and a traceback question's file-ranked lists vote with its own weights, which the search stage gives
    votes = next(s for s in reply.stages if s.name == "search").detail["list_weights"]
    plain = next(s for s in short.stages if s.name == "search").detail["list_weights"]
    assert (votes["file_keyword"], votes["file_bm25"]) == (0.25, 0.5) and (plain["file_keyword"], plain["file_bm25"]) == (1.0, 1.0)
    # a long question quoting no traceback may take more candidates to the cross-encoder; these two may not
    issue = stack.ask("Parsing the config file fails when a port is given.\n```python\nload('app.toml')\n```")
    tops = [next(s for s in r.stages if s.name == "search").detail["rerank_top"] for r in (issue, reply, short)]
    assert tops == [16, 12, 12]


@pytest.mark.timeout(120)
def test_follow_up_is_searched_with_the_previous_question(stack):
    """A short follow-up in the same conversation is searched with the previous question in front of it."""
    first = stack.ask("how does the retry backoff work?", conversation_id="conv-follow")
    assert first.searched_query == "how does the retry backoff work?"
    second = stack.ask("and how is it tested?", conversation_id="conv-follow", threshold=0.0)
    assert second.searched_query == "how does the retry backoff work? and how is it tested?"
    assert 'searched "how does the retry backoff work? and how is it tested?"' in second.context_line
    assert "tests/test_retry.py" in [b.path for b in second.blocks]
    other = stack.ask("and how is it tested?", conversation_id="conv-other")
    assert other.searched_query == "and how is it tested?"


@pytest.mark.timeout(120)
def test_a_follow_up_that_finds_nothing_new_says_so_and_names_the_kind_of_file_missing(team_stack):
    """In a workspace without tests, "and how is it tested?" says no test files are indexed and that the answer holds no file beyond the previous one; a first question says neither."""
    first = team_stack.ask("how is the invoice total computed?", conversation_id="conv-none", include_team=False)
    assert "no test files" not in first.context_line and "beyond the previous answer" not in first.context_line
    again = team_stack.ask("and how is it tested?", conversation_id="conv-none", include_team=False)
    assert "no test files are indexed" in again.context_line, again.context_line
    assert "no files beyond the previous answer" in again.context_line, again.context_line
    fresh = team_stack.ask("where are the tests of the invoice?", include_team=False)
    assert "no test files are indexed" in fresh.context_line and "beyond the previous answer" not in fresh.context_line


@pytest.mark.timeout(120)
def test_active_file_is_among_the_candidates(stack):
    """A file given as active_file is searched by the focus passes even when the question does not mention it, and the context line names it."""
    reply = stack.ask("exponential backoff between retries", active_file=str(stack.root / "docs/architecture.md"),
                      threshold=0.0, snippet_count=12, budget_chars=100000)
    focus = [b for b in reply.blocks if b.path == "docs/architecture.md"]
    assert focus, [b.label for b in reply.blocks]
    assert any({"focus_vector", "focus_keyword"} & set(b.retrievers) for b in focus)
    prepare = next(s for s in reply.stages if s.name == "prepare")
    assert prepare.detail["focus"][0] == "docs/architecture.md"
    assert "· focus docs/architecture.md" in reply.context_line and " used" in reply.context_line


@pytest.mark.timeout(120)
def test_unsaved_buffer_is_used_for_widening(stack):
    """An unsaved buffer sent for the active file replaces the disk text in the widened block."""
    disk = (stack.root / "retry.py").read_text()
    edited = disk.replace("# full jitter keeps many clients from retrying in lockstep", "# UNSAVED EDIT: jitter spreads retries")
    assert edited != disk and edited.count("\n") == disk.count("\n")
    reply = stack.ask("exponential backoff between retries", active_file="retry.py", buffers={"retry.py": edited})
    blocks = [b for b in code_blocks(reply) if b.path == "retry.py"]
    assert blocks and any("UNSAVED EDIT" in b.text for b in blocks)
    assert all("full jitter keeps many" not in b.text for b in blocks)
    widen = next(s for s in reply.stages if s.name == "widen")
    assert "retry.py" in widen.detail["from_buffer"]
    assert "full jitter keeps many" in (stack.root / "retry.py").read_text()
    assert all(b.changed == "unsaved changes in the editor" for b in blocks)
    assert "changed since indexed" in reply.context_line and "unsaved in the editor" in reply.context_line
    same = stack.ask("exponential backoff between retries", active_file="retry.py", buffers={"retry.py": disk})
    assert all(b.changed == "" for b in code_blocks(same)) and "changed since indexed" not in same.context_line


@pytest.mark.timeout(300)
def test_a_block_whose_file_changed_on_disk_since_it_was_indexed_says_so(stack):
    """With the watcher stopped, a file edited on disk gives blocks marked changed on disk since indexed, counted in the context line; once re-indexed, no mark."""
    path = stack.root / "config_parser.py"
    original = path.read_text()
    stack.d.kill("watcher")
    try:
        path.write_text(original + "\n# edited while the watcher was down\n")
        reply = stack.ask("how is the config file parsed?")
        marked = [b for b in code_blocks(reply) if b.path == "config_parser.py"]
        assert marked and all(b.changed == "changed on disk since indexed" for b in marked)
        assert all(b.changed == "" for b in code_blocks(reply) if b.path != "config_parser.py")
        assert f"{len(marked)} block" in reply.context_line and "changed since indexed (" in reply.context_line
    finally:
        path.write_text(original)
        stack.restart("watcher")
    wait_until(lambda: not table_mismatches(stack.d.data_dir, stack.root), INDEX_TIMEOUT)
    assert all(b.changed == "" for b in code_blocks(stack.ask("how is the config file parsed?")))


@pytest.mark.timeout(120)
def test_paths_outside_the_workspace_are_refused(stack):
    """A path outside the workspace (.., absolute, or a symlink pointing out) in any file field is a bad_message."""
    link = stack.root / "docs" / "passwd-link"
    os.symlink("/etc/passwd", link)
    try:
        for bad in ("../../etc/passwd", "/etc/passwd", "docs/passwd-link"):
            for field in ({"active_file": bad}, {"visible_files": [bad]}, {"open_documents": [bad]}, {"buffers": {bad: "x"}}):
                with pytest.raises(BadMessage) as info:
                    stack.ask("how is the config file parsed?", **field)
                assert info.value.code.value == "bad_message"
                assert "outside the workspace" in info.value.message
    finally:
        link.unlink()


# --------------------------------------------------------------------------- settings per request


@pytest.mark.timeout(120)
def test_high_threshold_keeps_fewer_blocks_and_more_near_misses(stack):
    """threshold=0.99 keeps fewer blocks than the default and reports more near misses."""
    needs_reranker_model()
    q = "how does the retry backoff work?"
    default = stack.ask(q)
    strict = stack.ask(q, threshold=0.99)
    assert len(code_blocks(strict)) < len(code_blocks(default)) or len(code_blocks(default)) == 0
    assert len(strict.near_misses) >= len(default.near_misses)
    assert strict.near_misses and all(n.probability < 0.99 for n in strict.near_misses)


@pytest.mark.timeout(120)
def test_snippet_count_one_gives_one_code_block(stack):
    """snippet_count=1 gives exactly one code block."""
    reply = stack.ask("how is the config file parsed?", snippet_count=1, threshold=0.0)
    assert len(code_blocks(reply)) == 1


@pytest.mark.timeout(120)
def test_small_budget_skips_blocks_that_do_not_fit(stack):
    """A small character budget skips the blocks that do not fit and keeps later ones that do."""
    q = "where are authentication tokens stored and expired?"
    full = stack.ask(q, threshold=0.0, snippet_count=12, budget_chars=100000)
    sizes = [len(b.text) for b in full.blocks]
    assert len(sizes) >= 2
    budget = min(sizes)
    small = stack.ask(q, threshold=0.0, snippet_count=12, budget_chars=budget)
    assert small.blocks
    assert sum(len(b.text) for b in small.blocks) <= budget
    assert {b.label for b in small.blocks} <= {b.label for b in full.blocks}
    if sizes[0] > budget:  # the first block did not fit and was skipped, not a stop
        assert full.blocks[0].label not in {b.label for b in small.blocks}


# --------------------------------------------------------------------------- degraded modes


@pytest.mark.timeout(120)
def test_a_deadline_with_no_time_left_answers_in_fused_order_and_says_why(stack):
    """A 1 ms budget is spent before the rerank: the answer comes in the fused order, unwidened, and the context line names the deadline."""
    from daemons.lib import deadline

    reply = stack.ask("how is the config file parsed?", deadline_ms=1)
    assert deadline.SKIPPED_RERANK in reply.degraded and deadline.SKIPPED_WIDEN in reply.degraded
    assert "question deadline" in reply.context_line
    assert code_blocks(reply) and all(b.probability is None for b in code_blocks(reply))
    assert next(s for s in reply.stages if s.name == "rerank").detail["skipped"] == "question deadline"
    with pytest.raises(BadMessage, match="question_deadline_ms must be at least 0"):
        stack.ask("how is the config file parsed?", deadline_ms=-5)


@pytest.mark.timeout(300)
def test_a_reranker_too_busy_for_the_deadline_is_not_waited_for(stack):
    """When the reranker's queue cannot meet what is left of a 1.2 s budget, the broker refuses at once and the answer comes in the fused order, named."""
    needs_reranker_model()
    from daemons.lib import deadline

    stack.restart("reranker", WSCTX_FAULT_WORKER_SCORE_DELAY_MS="2000", WSCTX_RERANKER_POOL_SIZE="1")
    try:
        warm = stack.ask("which class holds the server configuration?")  # no deadline: teaches the broker its rate
        assert not warm.degraded, warm.degraded
        t0 = time.monotonic()
        reply = stack.ask("where are expired tokens removed?", deadline_ms=1200)
        elapsed = time.monotonic() - t0
        assert deadline.REFUSED_RERANK in reply.degraded, reply.degraded
        assert "reranker busy" in reply.context_line
        assert elapsed < 1.2, elapsed
        assert code_blocks(reply)
    finally:
        stack.restart("reranker")


@pytest.mark.timeout(120)
def test_a_repeated_question_is_reranked_from_the_pair_cache(stack):
    """Asked twice, the second answer's rerank stage reports every pair from the cache and the same probabilities."""
    needs_reranker_model()
    first = stack.ask("how are line items totalled on an invoice?")
    again = stack.ask("how are line items totalled on an invoice?")
    rerank = next(s for s in again.stages if s.name == "rerank")
    assert rerank.detail["cached"] == rerank.detail["reranked"] > 0
    assert [(b.label, b.probability) for b in code_blocks(again)] == [(b.label, b.probability) for b in code_blocks(first)]


@pytest.mark.timeout(300)
def test_embedder_stopped_answers_with_keywords_only(stack):
    """With the embedder stopped the answer still comes within the deadline, saying only keywords were matched."""
    stack.d.kill("embedder")
    try:
        t0 = time.monotonic()
        reply = stack.ask("which code parses the config file?")  # never asked: the searcher holds no vector for it
        elapsed = time.monotonic() - t0
        assert elapsed < stack.d.settings.embed_timeout_ms / 1000 + stack.d.settings.reranker_timeout_ms / 1000 + 3
        assert any("keywords only" in d for d in reply.degraded)
        assert "keywords only" in reply.context_line
        assert code_blocks(reply) and code_blocks(reply)[0].path == "config_parser.py"
    finally:
        stack.restart("embedder")


@pytest.mark.timeout(300)
def test_reranker_model_broken_falls_back_to_fused_order(stack):
    """A reranker whose model dir is broken gives the fused order, and the context line says so."""
    stack.restart("reranker", WSCTX_RERANKER_DIR="/nonexistent")
    try:
        reply = stack.ask("how is the config file parsed?")
        assert "fused order" in reply.context_line
        assert any("fused order" in d for d in reply.degraded)
        assert code_blocks(reply) and all(b.probability is None for b in code_blocks(reply))
    finally:
        stack.restart("reranker")


@pytest.mark.timeout(300)
def test_searcher_stopped_is_still_answered(stack):
    """With the searcher stopped the front searches the keywords itself and still answers; only then does it load LanceDB, which it never holds while the searcher answers."""
    def front_maps() -> str:
        return Path(f"/proc/{stack.d.pid('front')}/maps").read_text()

    stack.ask("how is the config file parsed?")
    assert "lancedb" not in front_maps() and not stack.d.status("front").details["tables_loaded"]
    stack.d.kill("searcher")
    try:
        reply = stack.ask("how is the config file parsed?")
        assert any("searcher unavailable" in d for d in reply.degraded)
        assert "keywords only" in reply.context_line
        assert code_blocks(reply) and code_blocks(reply)[0].path == "config_parser.py"
        assert "lancedb" in front_maps()
        details = stack.d.status("front").details
        assert details["tables_loaded"] and details["arrow"]["pool"] == "system", details
    finally:
        stack.restart("searcher")


@pytest.mark.timeout(300)
def test_workspace_not_fully_indexed_says_how_far_along(stack):
    """A workspace whose indexing is still pending is answered, and degraded says how far along the index is."""
    stack.d.kill("embedder")
    root2 = stack.base / "w2"
    write_files(root2, {"jobs/queue.py": RETRY.replace("retry", "requeue"), "jobs/worker.py": CONFIG})
    try:
        stack.d.request("watcher", WorkspaceAddRequest(path=str(root2)))
        wid2 = workspace_id(root2)

        def pending():
            ws = stack.d.status("watcher").details.get("workspaces", {}).get(wid2, {})
            return ws.get("pending")

        wait_until(pending, 60)
        reply = stack.client.ask("how is the config file parsed?", workspace=str(root2))
        built = [d for d in reply.degraded if d.startswith("index ") and "% built" in d]
        assert built, reply.degraded
        assert "of 2 files" in built[0]
        assert built[0] in reply.context_line
        assert reply.index.get("pending")
    finally:
        stack.restart("embedder")


# --------------------------------------------------------------------------- team index and CURVE


@pytest.mark.timeout(400)
def test_team_index_blocks_come_after_local_ones(stack, team_stack):
    """A front configured with a team front appends that front's blocks, labelled team:..., after its own."""
    stack.restart("front", WSCTX_TEAM_FRONTS=f"{team_stack.tcp}#{team_stack.wid}")
    try:
        reply = stack.ask("how are invoice totals computed with tax?", threshold=0.0, snippet_count=12, budget_chars=100000)
        team = [b for b in reply.blocks if b.team]
        assert team, reply.context_line
        name = team_stack.tcp.removeprefix("tcp://")
        for b in team:
            assert b.label == f"team:{name}:{b.path}:{b.start_line}-{b.end_line}"
            assert b.path == "billing/invoice.py"
        first_team = reply.blocks.index(team[0])
        assert all(b.team for b in reply.blocks[first_team:])
        assert any(not b.team for b in reply.blocks[:first_team])
        assert "team" in [s.name for s in reply.stages]
        # the local front's own answer to B's workspace directly over tcp works too
        with WorkspaceClient(runtime_dir=team_stack.d.runtime_dir, endpoint=team_stack.tcp) as c:
            direct = c.ask("invoice total", workspace=team_stack.wid)
        assert direct.blocks and direct.blocks[0].path == "billing/invoice.py"
    finally:
        stack.restart("front")


@pytest.mark.timeout(400)
def test_curve_front_answers_authorised_client_only(team_stack):
    """A front on tcp with CURVE keys answers a client holding an authorised key and not one without it."""
    keys = team_stack.base / "keys"
    allowed = keys / "allowed"
    server_pub, server_sec = make_keys(keys, "server")
    client_pub, client_sec = make_keys(keys / "clients", "alice")
    _, stranger_sec = make_keys(keys / "strangers", "mallory")
    allowed.mkdir(mode=0o700)
    shutil.copy(client_pub, allowed / client_pub.name)
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    team_stack.restart("front", WSCTX_FRONT_TCP=endpoint, WSCTX_CURVE_SECRET_KEY_FILE=str(server_sec),
                       WSCTX_CURVE_AUTHORIZED_KEYS_DIR=str(allowed), WSCTX_TEAM_WORKSPACES=f"alice={team_stack.wid}")
    try:
        import zmq.auth

        server_public, _ = zmq.auth.load_certificate(str(server_pub))

        def curve_for(secret_file: Path) -> dict[str, bytes]:
            public, secret = zmq.auth.load_certificate(str(secret_file))
            return {"server_public": server_public, "public": public, "secret": secret}

        with WorkspaceClient(runtime_dir=team_stack.d.runtime_dir, endpoint=endpoint, curve=curve_for(client_sec), timeout_ms=20000) as c:
            reply = c.ask("invoice total", workspace=team_stack.wid)
        assert reply.blocks and reply.blocks[0].path == "billing/invoice.py"
        for curve in (None, curve_for(stranger_sec)):
            with WorkspaceClient(runtime_dir=team_stack.d.runtime_dir, endpoint=endpoint, curve=curve, timeout_ms=1500) as c:
                with pytest.raises((Timeout, Unavailable)):
                    c.ask("invoice total", workspace=team_stack.wid)
    finally:
        team_stack.restart("front")
