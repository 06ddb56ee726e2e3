"""The index path end to end: real watcher, chunker and embedder processes on a small workspace."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import zmq

from daemons.lib import catalog
from daemons.lib.workspaces import index_dir
from daemons.lib.store import IndexStore
from protocol import envelope
from protocol.schema import FileChanged, RebuildRequest
from tests.support import Daemons, open_table, register, table_mismatches, wait_until

MAX_BYTES = 6000
INDEX_TIMEOUT = 90

PY = '''"""Retry helpers for HTTP calls."""
import time

import requests


def fetch_with_retry(url: str, attempts: int = 5) -> requests.Response:
    """GET ``url``, backing off exponentially on server errors."""
    for i in range(attempts):
        resp = requests.get(url, timeout=10)
        if resp.status_code < 500:
            return resp
        time.sleep(2 ** i)
    raise RuntimeError(f"gave up on {url}")


class RetryPolicy:
    def __init__(self, attempts: int = 3, base_delay: float = 0.5) -> None:
        self.attempts = attempts
        self.base_delay = base_delay

    def delays(self):
        return [self.base_delay * 2 ** i for i in range(self.attempts)]
'''

TS = '''import { readFileSync } from "fs";

export interface Config {
  port: number;
  host: string;
  verbose: boolean;
}

export function parseConfig(path: string): Config {
  const raw = JSON.parse(readFileSync(path, "utf8"));
  return {
    port: Number(raw.port ?? 8080),
    host: String(raw.host ?? "localhost"),
    verbose: Boolean(raw.verbose),
  };
}

export class ConfigWatcher {
  private current: Config;
  constructor(private readonly path: string) {
    this.current = parseConfig(path);
  }
  reload(): Config {
    this.current = parseConfig(this.path);
    return this.current;
  }
}
'''

GO = '''package cache

import "container/list"

// LRU is a least-recently-used cache of fixed capacity.
type LRU struct {
	capacity int
	order    *list.List
	items    map[string]*list.Element
}

type entry struct {
	key   string
	value []byte
}

// New makes an LRU holding at most capacity entries.
func New(capacity int) *LRU {
	return &LRU{capacity: capacity, order: list.New(), items: map[string]*list.Element{}}
}

// Get returns the value for key and marks it recently used.
func (c *LRU) Get(key string) ([]byte, bool) {
	el, ok := c.items[key]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*entry).value, true
}
'''

MD = '''# Widget service

The widget service stores widgets and serves them over HTTP.

## Running

Start it with `make run`; it listens on port 8080 unless `PORT` is set.

## Configuration

Settings are read from `config.json` next to the binary. See `src/config.ts` for the fields.
'''


def py_module(i: int) -> str:
    return f'''"""Generated module number {i} of the batch."""


def handler_{i}(request):
    """Handle request kind {i} and return a response dictionary."""
    payload = request.get("payload", {{}})
    total = sum(int(v) for v in payload.values())
    return {{"kind": {i}, "total": total, "ok": total >= 0}}


class Worker{i}:
    def __init__(self, name: str) -> None:
        self.name = name
        self.processed = 0

    def process(self, item):
        self.processed += 1
        return handler_{i}({{"payload": item}})
'''


def make_workspace(root: Path) -> dict[str, str]:
    """Write the mixed workspace; return {path: why it must not be indexed} for the skipped ones."""
    files = {
        "src/retry.py": PY,
        "src/config.ts": TS,
        "pkg/cache/lru.go": GO,
        "README.md": MD,
        "sub/.gitignore": "secret.py\n",
        "sub/secret.py": "API_KEY = 'do not index me'\n" * 3,
        "sub/public.py": "def public_helper():\n    return 'visible to the index'\n",
        "node_modules/leftpad/index.js": "module.exports = function leftpad(s) { return s; };\n",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "assets").mkdir()
    (root / "assets" / "blob.dat").write_bytes(b"header\x00\x01\x02binary payload\x00" * 20)
    (root / "legacy.txt").write_bytes("caf\u00e9 na\u00efve latin-1 text\n".encode("latin-1") * 5)
    (root / "big.py").write_text("# padding line to exceed the size cap\n" * (MAX_BYTES // 30))
    # the data-file policy (its size rules are over this test's size cap; tests/test_filtering.py)
    (root / "static").mkdir()
    (root / "static" / "bundle.js").write_text("var a=1;" * 700)
    return {
        "sub/secret.py": "ignored",
        "node_modules/leftpad/index.js": "ignored",
        "assets/blob.dat": "binary",
        "legacy.txt": "not UTF-8",
        "big.py": "larger than",
        "static/bundle.js": "generated (a line of",
    }


def make_batch(root: Path, n: int = 30) -> None:
    (root / "batch").mkdir(exist_ok=True)
    for i in range(n):
        (root / "batch" / f"mod_{i:02d}.py").write_text(py_module(i))


@pytest.fixture
def pipeline(daemons, env, workspace):
    """(Daemons for watcher+chunker+embedder, workspace root, workspace id), workspace registered."""
    env["WSCTX_MAX_FILE_BYTES"] = str(MAX_BYTES)
    d: Daemons = daemons(["watcher", "chunker", "embedder"], env)
    wid = register(d.data_dir, workspace)
    return d, workspace, wid


def wait_synced(d: Daemons, root: Path, timeout: float = INDEX_TIMEOUT) -> None:
    wait_until(
        lambda: not table_mismatches(d.data_dir, root, MAX_BYTES), timeout,
        message=lambda: f"table != disk: {table_mismatches(d.data_dir, root, MAX_BYTES)[:10]}\n{d.log_tail()}",
    )


def start_indexed(pipeline: tuple[Daemons, Path, str]) -> tuple[Daemons, Path, str, dict[str, str]]:
    """Write the mixed workspace, start the daemons and wait until its table matches the disk;
    returns the pipeline and ``make_workspace``'s skipped files."""
    d, root, wid = pipeline
    skipped = make_workspace(root)
    d.start()
    wait_synced(d, root)
    return d, root, wid, skipped


def wait_published(d: Daemons, root: Path, wid: str) -> dict[str, str]:
    """Wait until the list the embedder publishes beside the table equals the table's own; return it."""
    folder = index_dir(d.data_dir, wid)
    wait_until(lambda: catalog.read(folder) == open_table(d.data_dir, root).catalog(), 30,
               message=lambda: f"published {catalog.read(folder)}\ntable {open_table(d.data_dir, root).catalog()}\n{d.log_tail()}")
    return catalog.read(folder)


def indexed_paths(d: Daemons, root: Path) -> set[str]:
    store = open_table(d.data_dir, root)
    return set(store.catalog()) if store else set()


@pytest.mark.timeout(180)
def test_mixed_workspace_is_indexed_and_skips_what_it_must(pipeline):
    """A mixed workspace is fully indexed, and ignored, binary, non-UTF-8, oversize, data and generated files get no rows (all but the ignored logged as file_skipped with the reason)."""
    d, root, wid, skipped = start_indexed(pipeline)
    paths = indexed_paths(d, root)
    assert {"src/retry.py", "src/config.ts", "pkg/cache/lru.go", "README.md", "sub/public.py"} <= paths
    assert not paths & set(skipped), paths & set(skipped)
    store = open_table(d.data_dir, root)
    langs = {r["path"]: r["language"] for r in store.rows_for_path("src/retry.py") + store.rows_for_path("pkg/cache/lru.go")}
    assert langs == {"src/retry.py": "python", "pkg/cache/lru.go": "go"}
    assert any(r["path"] == "src/retry.py" for r in store.keyword_search("fetch retry", 5))
    events = wait_until(lambda: {e["path"]: e["reason"] for e in d.log_events("watcher", "file_skipped")}.keys() >= {r for r, why in skipped.items() if why != "ignored"} and d.log_events("watcher", "file_skipped"))
    reasons = {e["path"]: e["reason"] for e in events}
    for rel, why in skipped.items():
        if why == "ignored":
            assert rel not in reasons  # ignored files are never even read
        else:
            assert why in reasons[rel], (rel, reasons.get(rel))
    counts = d.status("embedder").details["workspaces"][wid]
    assert counts["problem"] == "" and counts["files"] == len(paths)


@pytest.mark.timeout(180)
def test_an_ignore_file_line_that_makes_no_pattern_is_reported_and_the_rest_still_applies(pipeline):
    """A ``.gitignore`` holding lines no pattern can be made of (a lone ``!``, as black's test data has) is read around: the workspace is indexed, its other lines still ignore, and the watcher names the file and lines."""
    d, root, wid = pipeline
    (root / "data").mkdir()
    (root / "data" / ".gitignore").write_text("!\n*.tmp\n[z-a]\n")
    (root / "data" / "scratch.tmp").write_text("def scratch_rows():\n    return 1\n")
    (root / "data" / "loader.py").write_text("def load_rows():\n    return []\n")
    (root / "main.py").write_text("def main():\n    return 0\n")
    d.start()
    wait_synced(d, root)
    assert indexed_paths(d, root) == {"main.py", "data/loader.py", "data/.gitignore"}
    events = wait_until(lambda: d.log_events("watcher", "ignore_lines_skipped"), 30, message=d.log_tail)
    assert {(e["file"], tuple(e["lines"])) for e in events} == {("data/.gitignore", ("!", "[z-a]"))}


@pytest.mark.timeout(180)
def test_edit_delete_rename_keep_table_in_step(pipeline):
    """Editing a file replaces its rows, deleting removes them, renaming moves them, and a newly ignored file loses its rows."""
    d, root, wid, _ = start_indexed(pipeline)

    retry = root / "src" / "retry.py"
    retry.write_text(PY.replace("fetch_with_retry", "fetch_with_zebraquokka_backoff"))
    wait_synced(d, root)
    store = open_table(d.data_dir, root)
    hits = wait_until(lambda: [r for r in store.keyword_search("zebraquokka", 5) if r["path"] == "src/retry.py"])
    assert all("zebraquokka" in r["text"] for r in hits)
    assert not [r for r in store.keyword_search("fetch_with_retry", 10) if r["path"] == "src/retry.py" and "fetch_with_retry(" in r["text"]]

    (root / "pkg" / "cache" / "lru.go").unlink()
    wait_synced(d, root)
    assert open_table(d.data_dir, root).rows_for_path("pkg/cache/lru.go") == []

    before = {(r["chunk_index"], r["window"], r["content_hash"]) for r in store.rows_for_path("src/config.ts")}
    os.rename(root / "src" / "config.ts", root / "src" / "settings.ts")
    wait_synced(d, root)
    store = open_table(d.data_dir, root)
    assert store.rows_for_path("src/config.ts") == []
    assert {(r["chunk_index"], r["window"], r["content_hash"]) for r in store.rows_for_path("src/settings.ts")} == before

    (root / "sub" / ".gitignore").write_text("secret.py\npublic.py\n")
    wait_until(lambda: "sub/public.py" not in indexed_paths(d, root), 60, message=d.log_tail)
    wait_synced(d, root)


@pytest.mark.timeout(180)
def test_unchanged_file_costs_nothing(pipeline):
    """Touching a file or rewriting the same bytes sends nothing, and a re-sent unchanged file is not re-embedded."""
    d, root, wid, _ = start_indexed(pipeline)
    wait_until(lambda: d.status("embedder").queue_depth == 0 and d.counter("embedder", "files.indexed") == len(indexed_paths(d, root)))
    indexed = d.counter("embedder", "files.indexed")
    sent = d.counter("watcher", "events.changed")

    retry = root / "src" / "retry.py"
    retry.touch()
    (root / "README.md").write_bytes((root / "README.md").read_bytes())
    t = time.time()
    wait_until(lambda: d.status("watcher").details["workspaces"][wid]["last_reconcile"] > t + 0.5)
    assert d.counter("embedder", "files.indexed") == indexed
    assert d.counter("watcher", "events.changed") == sent  # the watcher saw the same hashes: nothing sent

    # A file.changed for a file whose hash the table holds (as a restarted watcher would send) is chunked but not embedded.
    unchanged = d.counter("embedder", "files.unchanged")
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(d.endpoint("chunker.in"))
    for rel in ("src/retry.py", "README.md"):
        push.send_multipart(envelope.encode(FileChanged(workspace=wid, root=str(root.resolve()), path=rel), sender="test"))
    push.close()
    wait_until(lambda: d.counter("embedder", "files.unchanged") >= unchanged + 2, 60, message=d.log_tail)
    assert d.counter("embedder", "files.indexed") == indexed
    wait_synced(d, root)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("victim", ["embedder", "chunker"])
def test_sigkill_mid_batch_then_restart_catches_up(pipeline, victim):
    """SIGKILL of the embedder or the chunker while ~30 files are being indexed loses nothing once it is restarted."""
    d, root, wid = pipeline
    make_workspace(root)
    make_batch(root, 30)
    d.start(WSCTX_FAULT_EMBED_DELAY_MS="300")  # slow vectors: the kill lands while files still wait for theirs
    counters = ("files.indexed", "files.keywords_first") if victim == "embedder" else ("files.chunked",)
    wait_until(lambda: sum(d.counter(victim, c) for c in counters) >= 3, 60, message=d.log_tail)
    assert table_mismatches(d.data_dir, root, MAX_BYTES), "everything was indexed before the kill: the test proves nothing"
    assert d.kill(victim, signal.SIGKILL) == -signal.SIGKILL
    (root / "batch" / "mod_00.py").write_text(py_module(100))  # a change made while it is down
    d.start(victim)
    wait_synced(d, root, 150)


@pytest.mark.timeout(180)
def test_the_watcher_reads_the_list_the_embedder_publishes_and_never_loads_lancedb(pipeline):
    """The embedder publishes the table's {path: hash} list beside it after each change, and the watcher compares the disk with that list without ever loading LanceDB."""
    d, root, wid, _ = start_indexed(pipeline)
    assert "pkg/cache/lru.go" in wait_published(d, root, wid)
    (root / "pkg" / "cache" / "lru.go").unlink()
    (root / "src" / "retry.py").write_text(PY + "\n\ndef published_later():\n    return 1\n")
    wait_synced(d, root)
    assert "pkg/cache/lru.go" not in wait_published(d, root, wid)
    # the watcher saw both changes land (nothing in flight) from the published list alone
    wait_until(lambda: d.status("watcher").details["workspaces"][wid]["pending"] == 0, 30, message=d.log_tail)
    maps = Path(f"/proc/{d.pid('watcher')}/maps").read_text()
    assert "lancedb" not in maps and "pyarrow" not in maps and "onnxruntime" not in maps


@pytest.mark.timeout(180)
def test_a_file_list_that_cannot_be_written_is_logged_and_written_once_it_can(pipeline):
    """When the published list cannot be replaced, the embedder logs it and goes on indexing, and publishes the list once it can."""
    d, root, wid, _ = start_indexed(pipeline)
    wait_published(d, root, wid)
    listed = index_dir(d.data_dir, wid) / catalog.CATALOG_FILE
    listed.unlink()
    listed.mkdir()  # os.replace onto a folder fails, as a full disk would
    (root / "src" / "late.py").write_text(py_module(41))
    wait_synced(d, root)
    wait_until(lambda: d.log_events("embedder", "catalog_publish_failed"), 30, message=d.log_tail)
    assert d.running("embedder")
    listed.rmdir()
    assert "src/late.py" in wait_published(d, root, wid)


@pytest.mark.timeout(180)
def test_watcher_down_changes_are_caught_up(pipeline):
    """Files created, edited and deleted while the watcher is dead are in the table once it is back."""
    d, root, wid, _ = start_indexed(pipeline)
    d.kill("watcher", signal.SIGKILL)
    (root / "src" / "retry.py").write_text(PY + "\n\ndef added_while_down():\n    return 'watcher was dead'\n")
    (root / "README.md").unlink()
    (root / "src" / "new_module.py").write_text(py_module(7))
    d.start("watcher")
    wait_synced(d, root)
    assert "src/new_module.py" in indexed_paths(d, root) and "README.md" not in indexed_paths(d, root)
    # A clean SIGTERM stop and start is caught up the same way.
    assert d.terminate("watcher") == 0
    (root / "src" / "new_module.py").unlink()
    d.start("watcher")
    wait_synced(d, root)


@pytest.mark.timeout(240)
def test_changed_chunk_size_needs_rebuild_then_rebuilds(pipeline):
    """A table built with another chunk size is reported as rebuild needed and left unmixed until a rebuild_request rebuilds it (and a chunker still on the old size is refused)."""
    d, root, wid, _ = start_indexed(pipeline)
    store = open_table(d.data_dir, root)
    before = store.table.to_arrow().select(["id", "content_hash"]).to_pylist()
    assert store.meta["chunk_max_chars"] == 1000

    d.terminate("embedder")
    d.start("embedder", WSCTX_CHUNK_MAX_CHARS="500")
    problem = wait_until(lambda: d.status("embedder").details["workspaces"][wid]["problem"])
    assert "rebuild needed" in problem and "chunk_max_chars" in problem
    (root / "src" / "retry.py").write_text(PY + "\n# edited while a rebuild is needed\n")
    wait_until(lambda: d.counter("embedder", "batches.refused") >= 1, 60, message=d.log_tail)
    store = IndexStore.open_reader(index_dir(d.data_dir, wid))
    assert store.table.to_arrow().select(["id", "content_hash"]).to_pylist() == before
    assert store.meta["chunk_max_chars"] == 1000

    reply = d.request("embedder", RebuildRequest(workspace=wid), timeout_ms=20000)
    assert reply.body.workspace == wid
    wait_until(lambda: open_table(d.data_dir, root).meta["chunk_max_chars"] == 500, 60)
    # The chunker still chunks at 1000: the embedder refuses its batches rather than mislabel them.
    wait_until(lambda: d.counter("embedder", "batches.shape_mismatch") >= 1, 60, message=d.log_tail)
    assert "chunk_max_chars" in d.status("embedder").details["chunker_problem"]
    assert open_table(d.data_dir, root).counts()["rows"] == 0

    d.terminate("chunker")
    d.start("chunker", WSCTX_CHUNK_MAX_CHARS="500")
    wait_synced(d, root)
    assert d.status("embedder").details["workspaces"][wid]["problem"] == ""
    store = open_table(d.data_dir, root)
    texts = [r["text"] for r in store.table.search().where("window = 0").select(["text"]).limit(None).to_list()]
    assert texts and max(len(t) for t in texts) <= 500 + 100 + 100  # chunk + leading context + slack
    assert len(texts) > len({r["id"].split("|")[0] for r in before})  # smaller chunks: more of them than files


@pytest.mark.timeout(300)
def test_a_busy_watcher_answers_status_within_the_cli_timeout(daemons, env, workspace):
    """While the watcher walks 10,000 files, every status request is answered within the CLI's 0.7 s, naming the workspace being reconciled."""
    from daemons.lib import runtime
    from protocol.schema import StatusRequest

    for i in range(100):
        folder = workspace / f"pkg{i:03d}"
        folder.mkdir()
        for j in range(100):
            (folder / f"m{j:03d}.py").write_text(f"VALUE_{i}_{j} = {i * j}\n")
    d: Daemons = daemons(["watcher"], env)
    wid = register(d.data_dir, workspace)
    d.start()
    answered, busy, started = 0, 0, time.monotonic()
    while True:
        details = runtime.control_request(d.control_endpoint("watcher"), StatusRequest(), timeout_ms=700).body.details
        answered += 1
        busy += bool(details.get("reconciling"))
        ws = details["workspaces"].get(wid)
        if ws and ws["last_reconcile"] and ws["files"] == 10_000:
            break
        assert time.monotonic() - started < 240, details
        time.sleep(0.05)
    assert busy >= 1 and answered > busy, (answered, busy)


@pytest.mark.timeout(300)
def test_a_workspace_folder_deleted_and_made_again_is_watched_again(pipeline, env):
    """After the workspace folder is deleted and created again, its new files and later edits are indexed without waiting for the periodic reconcile."""
    import shutil

    d, root, wid = pipeline
    (root / "first.py").write_text(py_module(1))
    d.start(WSCTX_RECONCILE_INTERVAL_S="300")  # the periodic reconcile must not be what finds them
    wait_synced(d, root)
    shutil.rmtree(root)
    wait_until(lambda: not indexed_paths(d, root), 60, message=d.log_tail)
    root.mkdir()
    (root / "second.py").write_text(py_module(2))
    wait_synced(d, root, 60)
    assert indexed_paths(d, root) == {"second.py"}
    time.sleep(1)
    (root / "second.py").write_text(py_module(3))  # an edit, seen only through a live watch
    (root / "third.py").write_text(py_module(4))
    wait_synced(d, root, 60)
    assert indexed_paths(d, root) == {"second.py", "third.py"}


def thread_nice_values(pid: int) -> dict[int, int]:
    """``{thread id: nice value}`` of a running process, from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended while being read
    return out


@pytest.mark.timeout(180)
def test_indexing_runs_below_questions_and_the_query_embedding_does_not(pipeline):
    """With index_nice 10 the chunker and the embedder's indexing thread run at nice 10 while the embedder still has normal-priority threads (query, control) that embed a question."""
    from protocol.schema import EmbedQueryRequest

    d, root, wid = pipeline
    make_batch(root, 5)
    d.start()
    wait_synced(d, root)
    chunker = thread_nice_values(d.pid("chunker"))
    assert chunker[d.pid("chunker")] == 10
    embedder = thread_nice_values(d.pid("embedder"))
    assert embedder[d.pid("embedder")] == 10  # the indexing loop
    assert 0 in embedder.values(), embedder  # the query and control threads started before it lowered itself
    from daemons.lib import runtime

    client = runtime.Client(d.endpoint("embedder.query"), sender="test")
    try:
        reply = client.request(EmbedQueryRequest(text="where is the retry logic?"), timeout_ms=10000)
    finally:
        client.close()
    assert reply.body.dim == len(reply.blobs[0]) // 4 > 0


@pytest.mark.timeout(240)
def test_a_window_embedded_before_is_not_embedded_again(daemons, env, short_tmp):
    """A second workspace holding the same files embeds none of their windows again, and an edit that appends a function embeds only the new windows."""
    import shutil

    first, second = short_tmp / "a", short_tmp / "b"
    first.mkdir()
    make_batch(first, 6)
    # a long file of many chunks: an appended function leaves its earlier chunks as they were
    (first / "batch" / "mod_03.py").write_text("\n\n".join(py_module(i).replace('"""Generated', f'"""Part {i}: generated') for i in range(10)))
    shutil.copytree(first, second)
    d: Daemons = daemons(["watcher", "chunker", "embedder"], env)
    register(d.data_dir, first)
    register(d.data_dir, second)
    d.start()
    wait_synced(d, first)
    wait_synced(d, second)
    rows_each = open_table(d.data_dir, first).table.count_rows()
    assert open_table(d.data_dir, second).table.count_rows() == rows_each
    embedded, cached = d.counter("embedder", "windows.embedded"), d.counter("embedder", "windows.cached")
    assert embedded == rows_each and cached == rows_each, (embedded, cached)
    target = first / "batch" / "mod_03.py"
    rows_before = len(open_table(d.data_dir, first).rows_for_path("batch/mod_03.py"))
    target.write_text(target.read_text() + "\n\ndef appended_helper(values):\n    return sorted(set(values))\n")
    wait_synced(d, first)
    rows_after = len(open_table(d.data_dir, first).rows_for_path("batch/mod_03.py"))
    new_embedded = d.counter("embedder", "windows.embedded") - embedded
    assert 0 < new_embedded < rows_after and rows_after > rows_before - 1, (new_embedded, rows_before, rows_after)
    assert d.status("embedder").details["vector_cache"]["rows"] == embedded + new_embedded


@pytest.mark.timeout(240)
def test_a_large_workspace_is_searchable_by_keywords_before_its_vectors_are_built(pipeline):
    """While files wait behind each other, each is written with its keyword text at once and embedded later: every file is keyword-searchable long before the vectors are done, vector search never returns a row without its vector, and the watcher counts those files until their vectors land."""
    import numpy as np

    from daemons.lib.indexing import is_pending

    d, root, wid = pipeline
    (root / "first.py").write_text(py_module(100))
    d.start(WSCTX_FAULT_EMBED_DELAY_MS="400")  # a slow machine: 30 files need 12 s of embedding
    wait_synced(d, root)  # one file with its vectors
    make_batch(root, 30)
    store = wait_until(lambda: (s := open_table(d.data_dir, root)) is not None and len(s.catalog()) == 31 and s, 60,
                       message=lambda: d.log_tail())
    catalog = store.catalog()
    waiting = [p for p, h in catalog.items() if is_pending(h)]
    assert len(waiting) >= 10, catalog
    last = sorted(waiting)[-1]
    word = "handler_" + last.split("_")[-1].removesuffix(".py").lstrip("0") if last.split("_")[-1] != "00.py" else "handler_0"
    assert any(r["path"] == last for r in store.keyword_search(word, 5)), word
    probe = np.random.default_rng(0).standard_normal(store.meta["dim"]).astype(np.float32)
    hits = store.vector_search(probe / np.linalg.norm(probe), 20)
    assert hits and not any(is_pending(h["content_hash"]) for h in hits)  # the embedded file's rows only
    # the watcher reads the table every 2 s while it waits for what it sent
    wait_until(lambda: d.status("watcher").details["workspaces"][wid]["vectors_pending"] > 0, 8)
    wait_synced(d, root)
    final = open_table(d.data_dir, root)
    assert not any(is_pending(h) for h in final.catalog().values()) and final.vectors_pending() == 0
    assert d.counter("embedder", "files.keywords_first") >= 10
    assert {h["path"] for h in final.vector_search(probe / np.linalg.norm(probe), 20)} > {h["path"] for h in hits}


@pytest.mark.timeout(240)
def test_a_questions_focus_file_gets_its_vectors_before_the_files_queued_ahead_of_it(daemons, env, workspace):
    """While a workspace's vectors are still being built, a question with a focus file whose rows wait for their vectors moves it to the front of the embedder's queue."""
    from daemons.lib import runtime
    from daemons.lib.indexing import is_pending
    from protocol.schema import SearchRequest

    env["WSCTX_MAX_FILE_BYTES"] = str(MAX_BYTES)
    d: Daemons = daemons(["watcher", "chunker", "embedder", "searcher"], env)
    wid = register(d.data_dir, workspace)
    (workspace / "first.py").write_text(py_module(100))
    d.start(WSCTX_FAULT_EMBED_DELAY_MS="400")  # a slow machine: every file costs 0.4 s more
    wait_synced(d, workspace)
    (workspace / "batch").mkdir()
    now = time.time()
    # 12 windows a file: a group of PENDING_GROUP_WINDOWS (256) windows holds about 21 files. mod_00
    # is written last and dated oldest, so it comes last whether the watcher sends files as their
    # events arrive or, in a reconcile, newest first: it is queued behind every other file.
    for i in [*range(1, 100), 0]:
        path = workspace / "batch" / f"mod_{i:02d}.py"
        path.write_text("\n\n".join(py_module(i * 100 + k) for k in range(10)))
        stamp = now - 2000 if i == 0 else now - 1000 + i
        os.utime(path, (stamp, stamp))
    store = wait_until(lambda: (s := open_table(d.data_dir, workspace)) is not None and len(s.catalog()) == 101 and s, 90,
                       message=lambda: d.log_tail())
    waiting = sorted(p for p, h in store.catalog().items() if is_pending(h))
    # at most the group being embedded and mod_00's own go before the rest: 2 x 21 files
    assert len(waiting) >= 60 and "batch/mod_00.py" in waiting, waiting
    target = "batch/mod_00.py"
    client = runtime.Client(d.endpoint("searcher"), sender="test")
    try:
        reply = client.request(SearchRequest(workspace=wid, question="handle request payload total", focus_paths=[target]),
                               timeout_ms=20000).body
    finally:
        client.close()
    assert reply.index["focus_vectors_first"] == 1
    left_behind = wait_until(
        lambda: (c := open_table(d.data_dir, workspace).catalog()) and not is_pending(c[target])
        and [p for p, h in c.items() if is_pending(h)], 90, message=lambda: d.log_tail())
    assert len(left_behind) >= 10, left_behind  # it jumped the files queued ahead of it
    assert d.counter("embedder", "files.vectors_first") == 1
    wait_synced(d, workspace)


@pytest.mark.timeout(240)
def test_the_embedder_gives_back_the_memory_indexing_freed_when_it_turns_idle(pipeline):
    """Once a workspace is indexed and the embedder has been idle 2 s, it trims malloc's heap and says how much it gave back; with trim_when_idle off it keeps it."""
    d, root, wid = pipeline
    make_batch(root, 30)
    d.start()
    wait_synced(d, root)
    wait_until(lambda: d.log_events("embedder", "memory_trimmed"), 30, message=lambda: d.log_tail())
    trimmed = d.log_events("embedder", "memory_trimmed")[-1]
    assert trimmed["released_mb"] > 0 and trimmed["resident_mb"] > 0, trimmed
    d.terminate("embedder")
    (root / "batch" / "late.py").write_text(py_module(99))
    d.start("embedder", WSCTX_TRIM_WHEN_IDLE="false")
    wait_synced(d, root)
    time.sleep(3)  # past the 2 s after which the idle work runs
    assert len(d.log_events("embedder", "memory_trimmed")) == 1
