"""End-to-end index pipeline benchmark with the real daemons on a real repository.

Starts watcher, chunker, embedder and searcher as processes on a copy of WORKSPACE, then reports:
files, chunks and rows indexed; wall time to a full index; save-to-searchable latency (a unique
word written into a file until a keyword search finds it; median and p95 of --saves); peak
resident memory (VmHWM) of each daemon, and what each holds at the end, after SETTLE_S seconds of quiet (VmRSS). With ``--second`` (another version of the same repository,
as a branch switch would leave it) that tree is then added as a second workspace, and the time to
index it and the windows embedded against those the window cache held are reported (issue 20:
a window embedded before is never embedded again). Prints a table and writes
bench/results/pipeline.json.

    python -m bench.pipeline --workspace ~/.cache/wsctx-bench/trees/requests-2.34.2 --saves 10
    python -m bench.pipeline --workspace ~/.cache/wsctx-bench/trees/pytest-5.4.0 \
        --second ~/.cache/wsctx-bench/trees/pytest-5.4.3 --saves 3 --out bench/results/pipeline_versions.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from daemons.lib.config import load_settings
from bench.processes import start_daemons, stop_daemons
from daemons.lib.runtime import control_request, memory_mb
from daemons.lib.store import IndexStore
from daemons.lib.workspaces import Registry, index_dir
from protocol.schema import ReconcileRequest, StatusRequest, WorkspaceAddRequest

DAEMONS = ["watcher", "chunker", "embedder", "searcher"]
#: Seconds of quiet before the resident memory at the end is read (the embedder's idle work starts after 2).
SETTLE_S = 4.0


def wait_indexed(settings, wid: str, timeout: float) -> None:
    """Until the watcher sees every file of *wid* with the table's hash."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = control_request(settings.control_endpoint("watcher"), StatusRequest()).body.details["workspaces"].get(wid, {})
        if status.get("files") and status.get("pending") == 0 and status.get("last_reconcile"):
            return
        time.sleep(0.5)
    raise SystemExit(f"workspace {wid} not indexed after {timeout:g} s")


def windows_counters(settings) -> tuple[int, int]:
    counters = control_request(settings.control_endpoint("embedder"), StatusRequest()).body.counters
    return int(counters.get("windows.embedded", 0)), int(counters.get("windows.cached", 0))


def differing_files(a: Path, b: Path) -> int:
    """Files of *b* missing from *a* or with other bytes."""
    n = 0
    for f in b.rglob("*"):
        if f.is_file():
            other = a / f.relative_to(b)
            n += not other.is_file() or other.read_bytes() != f.read_bytes()
    return n


def index_second(settings, tmp: Path, source: str, timeout: float) -> dict:
    """Add *source* as a second workspace next to the first and time its index."""
    first_embedded, first_cached = windows_counters(settings)
    ws2 = tmp / "ws2"
    shutil.copytree(source, ws2, symlinks=True)
    t0 = time.perf_counter()
    reply = control_request(settings.control_endpoint("watcher"), WorkspaceAddRequest(path=str(ws2))).body
    control_request(settings.control_endpoint("watcher"), ReconcileRequest(workspace=reply.workspace))
    wait_indexed(settings, reply.workspace, timeout)
    index_s = time.perf_counter() - t0
    embedded, cached = windows_counters(settings)
    return {
        "workspace": source, "files": sum(1 for f in ws2.rglob("*") if f.is_file()),
        "files_differing": differing_files(tmp / "ws", ws2), "index_s": round(index_s, 1),
        "windows_embedded": embedded - first_embedded, "windows_cached": cached - first_cached,
        "first_windows_embedded": first_embedded,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--saves", type=int, default=10)
    ap.add_argument("--second", default=None, help="another version of the repository, indexed after the first")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pipeline.json"))
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="wsb", dir="/tmp"))
    ws = tmp / "ws"
    shutil.copytree(args.workspace, ws, symlinks=True)
    env = dict(os.environ, WSCTX_RUNTIME_DIR=str(tmp / "run"), WSCTX_DATA_DIR=str(tmp / "data"), WSCTX_CONFIG="/nonexistent",
               WSCTX_DEBOUNCE_MS="100", PYTHONUNBUFFERED="1")
    settings = load_settings(env=env)
    wid, root = Registry(settings.data_dir).add(ws)
    procs: dict[str, subprocess.Popen] = {}
    started = time.perf_counter()
    try:
        procs = start_daemons(DAEMONS, env, tmp, settings)
        wait_indexed(settings, wid, args.timeout)
        full_s = time.perf_counter() - started
        store = IndexStore.open_reader(index_dir(settings.data_dir, wid))
        counts = store.counts()
        # Save to searchable.
        target = sorted(p for p in ws.rglob("*.py") if p.is_file())[len(list(ws.rglob("*.py"))) // 2]
        rel = target.relative_to(ws).as_posix()
        original = target.read_text()
        latencies = []
        for i in range(args.saves):
            word = "zq" + uuid.uuid4().hex[:10]
            target.write_text(original + f"\n\ndef {word}_marker():\n    return {i}\n")
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 60:
                hits = store.keyword_search(word, 3)
                if any(h["path"] == rel for h in hits):
                    break
                time.sleep(0.02)
            latencies.append(time.perf_counter() - t0)
        target.write_text(original)
        second = index_second(settings, tmp, args.second, args.timeout) if args.second else None
        memory = {name: round(memory_mb(p.pid, "VmHWM"), 1) for name, p in procs.items()}
        time.sleep(SETTLE_S)  # idle, as a workspace is after indexing: the embedder trims what it freed
        resident = {name: round(memory_mb(p.pid), 1) for name, p in procs.items()}
        disk = sum(f.stat().st_size for f in Path(index_dir(settings.data_dir, wid)).rglob("*") if f.is_file())
    finally:
        stop_daemons(procs.values())
    result = {
        "workspace": args.workspace,
        "date": time.strftime("%Y-%m-%d"),
        "files": counts["files"],
        "chunks": counts["chunks"],
        "rows": counts["rows"],
        "full_index_s": round(full_s, 1),
        "files_per_s": round(counts["files"] / full_s, 2),
        "rows_per_s": round(counts["rows"] / full_s, 2),
        "save_to_searchable_s": {"median": round(statistics.median(latencies), 3), "p95": round(sorted(latencies)[max(0, int(0.95 * len(latencies)) - 1)], 3), "all": [round(x, 3) for x in latencies]},
        "peak_rss_mb": memory,
        "rss_at_end_mb": resident,
        "index_disk_mb": round(disk / 1e6, 1),
        **({"second_version": second} if second else {}),
    }
    print(f"{'files':>8} {'chunks':>8} {'rows':>8} {'full index s':>13} {'rows/s':>8} {'save->search median s':>22} {'p95':>6}")
    print(f"{result['files']:>8} {result['chunks']:>8} {result['rows']:>8} {result['full_index_s']:>13} {result['rows_per_s']:>8} {result['save_to_searchable_s']['median']:>22} {result['save_to_searchable_s']['p95']:>6}")
    print("peak RSS MB:", memory, " index on disk MB:", result["index_disk_mb"])
    print("RSS at the end MB:", resident, f" together {sum(resident.values()):.0f}")
    if second:
        print(f"second version {second['workspace']}: {second['files']} files ({second['files_differing']} differ from the first), "
              f"indexed in {second['index_s']} s; windows embedded {second['windows_embedded']}, from the cache {second['windows_cached']} "
              f"(first version: {second['first_windows_embedded']} embedded in {result['full_index_s']} s)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
