"""A large repository from nothing: when is it keyword-searchable, how fast do its vectors come.

Starts watcher, chunker, embedder and searcher as processes on a copy of WORKSPACE (default: the
sympy 1.7 sdist of the bench cache, about 1,500 files), registered before they start, then polls
every 2 s: files on disk, files with rows (keyword-searchable: with their vectors, or written
keywords first and waiting for them), files with their vectors, and the embedder's windows
embedded. It reports the time until every file is keyword-searchable (issue 20's target: within
60 s of `wsctx add`) and, by --max-seconds, the share of files with vectors and the windows/s,
or the time until all are done, and each daemon's peak resident memory (VmHWM) at the stop. Prints
a table and writes bench/results/big.json.

    python -m bench.big                                   # sympy 1.7, at most 10 minutes
    python -m bench.big --workspace PATH --max-seconds 300 --set keywords_first=false
    python -m bench.big --set embed_batch_tokens=0 --set embed_batch=16 --logs /tmp/big-logs
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from daemons.lib.config import load_settings  # noqa: E402
from bench.processes import start_daemons, stop_daemons  # noqa: E402
from daemons.lib.runtime import control_request, memory_mb  # noqa: E402
from daemons.lib.workspaces import Registry  # noqa: E402
from protocol.schema import StatusRequest  # noqa: E402

DAEMONS = ["watcher", "chunker", "embedder", "searcher"]
CACHE = Path(os.environ.get("WSCTX_BENCH_CACHE", Path.home() / ".cache" / "wsctx-bench"))
DEFAULT_SRC = CACHE / "trees" / "sympy-1.7"


def snapshot(settings, wid: str) -> dict[str, Any]:
    w = control_request(settings.control_endpoint("watcher"), StatusRequest()).body.details["workspaces"].get(wid, {})
    e = control_request(settings.control_endpoint("embedder"), StatusRequest()).body
    files, pending, keyword_only = w.get("files") or 0, w.get("pending") or 0, w.get("vectors_pending") or 0
    return {
        "files": files, "with_rows": files - (pending - keyword_only), "with_vectors": w.get("indexed_files") or 0,
        "reconciled": bool(w.get("last_reconcile")), "windows_embedded": int(e.counters.get("windows.embedded", 0)),
    }


def group_times(log: Path) -> dict[str, float]:
    """Seconds the embedder spent embedding and writing the waiting files' vectors, summed over its
    ``indexed_vectors`` log lines (one per group of about ``PENDING_GROUP_WINDOWS`` windows)."""
    embed_ms = write_ms = groups = 0.0
    for line in log.read_text(errors="replace").splitlines():
        if '"indexed_vectors"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        embed_ms += float(event.get("embed_ms") or 0)
        write_ms += float(event.get("write_ms") or 0)
        groups += 1
    return {"groups": int(groups), "embed_s": round(embed_ms / 1000, 1), "write_s": round(write_ms / 1000, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a setting for the daemons (repeatable)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "big.json")
    ap.add_argument("--logs", type=Path, default=None, metavar="DIR",
                    help="keep the daemons' logs here (the embedder's indexed_vectors lines time each group)")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="wsg", dir="/tmp"))
    ws = tmp / "ws"
    shutil.copytree(args.workspace, ws, symlinks=True)
    env = dict(os.environ, WSCTX_RUNTIME_DIR=str(tmp / "run"), WSCTX_DATA_DIR=str(tmp / "data"), WSCTX_CONFIG="/nonexistent",
               PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    for item in args.set:
        name, _, value = item.partition("=")
        env[f"WSCTX_{name.upper()}"] = value
    settings = load_settings(env=env)
    wid, _ = Registry(settings.data_dir).add(ws)
    procs: dict[str, subprocess.Popen] = {}
    samples: list[dict[str, Any]] = []
    keyword_ready_s = vectors_done_s = None
    try:
        procs = start_daemons(DAEMONS, env, tmp, settings, cwd=REPO, ready_s=120)
        started = time.monotonic()
        last_print = 0.0
        while True:
            now = time.monotonic() - started
            snap = {"t_s": round(now, 1), **snapshot(settings, wid)}
            samples.append(snap)
            complete = snap["reconciled"] and snap["files"] > 0
            if keyword_ready_s is None and complete and snap["with_rows"] >= snap["files"]:
                keyword_ready_s = round(now, 1)
            if complete and snap["with_vectors"] >= snap["files"]:
                vectors_done_s = round(now, 1)
                break
            if now - last_print >= 30:
                print(f"{now:6.0f} s: {snap['with_rows']}/{snap['files']} files keyword-searchable, "
                      f"{snap['with_vectors']} with vectors, {snap['windows_embedded']} windows embedded", flush=True)
                last_print = now
            if now > args.max_seconds:
                break
            time.sleep(2.0)
        peak_mb = {name: round(memory_mb(p.pid, "VmHWM"), 1) for name, p in procs.items()}
    finally:
        stop_daemons(procs.values())
    last = samples[-1]
    elapsed = last["t_s"]
    # windows/s over the stretch after every file was keyword-searchable (the embedding alone)
    after = [s for s in samples if keyword_ready_s is not None and s["t_s"] >= keyword_ready_s]
    rate = ((after[-1]["windows_embedded"] - after[0]["windows_embedded"]) / (after[-1]["t_s"] - after[0]["t_s"])
            if len(after) >= 2 and after[-1]["t_s"] > after[0]["t_s"] else None)
    result = {
        "workspace": str(args.workspace), "date": time.strftime("%Y-%m-%d"), "settings": args.set,
        "cores": os.cpu_count(), "python": platform.python_version(), "load_avg_at_start": os.getloadavg(),
        "files": last["files"], "keyword_ready_s": keyword_ready_s, "vectors_done_s": vectors_done_s,
        "stopped_at_s": elapsed, "files_with_vectors_at_stop": last["with_vectors"],
        "windows_embedded_at_stop": last["windows_embedded"],
        "windows_per_s_after_keywords": round(rate, 1) if rate is not None else None,
        "vector_groups": group_times(tmp / "embedder.log"),
        "peak_mb": peak_mb,
        "samples": samples[:: max(1, len(samples) // 60)],
    }
    groups = result["vector_groups"]
    print("files | keyword-searchable after | vectors done after | files with vectors at stop | windows/s | groups: embed s / write s")
    print(f"{result['files']} | {keyword_ready_s} s | {vectors_done_s} s | {last['with_vectors']} at {elapsed} s | "
          f"{result['windows_per_s_after_keywords']} | {groups['groups']}: {groups['embed_s']} / {groups['write_s']}")
    print("peak resident MB (VmHWM): " + ", ".join(f"{name} {mb}" for name, mb in peak_mb.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
        for name in DAEMONS:
            shutil.copyfile(tmp / f"{name}.log", args.logs / f"{name}.log")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
