"""Question latency with every daemon up, warm and cold (reranker pool at zero), split by stage.

Brings up watcher, chunker, embedder, searcher, reranker and front on a copy of WORKSPACE,
waits for the full index, then asks --questions questions (commit subjects of that repository
from ../shared/eval/commits.jsonl when --repo is given, or with ``--questions-from swebench`` its
SWE-bench Lite issue texts whole, else generic questions): first warm
(pool up), then cold (reranker idle time set to --idle seconds; each question waits until the
pool is back at zero workers). The pair cache and the question deadline are off, so that every
question is scored and the cold start is measured whole. Prints median and p95 per stage, and
each daemon's resident memory (reranker workers included) after the warm questions and a few
seconds of quiet; writes bench/results/latency.json.

    python -m bench.latency --workspace /path/to/requests-2.32.3 --repo psf/requests --questions 30
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
from pathlib import Path

from daemons.cli import question_overrides
from daemons.lib.config import load_settings
from bench.pipeline import SETTLE_S
from bench.processes import daemon_memory_mb, start_daemons, stop_daemons
from daemons.lib.runtime import Client, control_request
from daemons.lib.workspaces import Registry
from protocol.schema import AskRequest, AskSettings, StatusRequest

from daemons import DAEMONS

GENERIC = [
    "where is the retry logic?", "how is the configuration parsed?", "where are cookies stored?",
    "how are redirects followed?", "where is authentication handled?", "how are timeouts applied?",
]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


#: ``--questions-from``: the eval file the questions of ``--repo`` come from, and whether each is
#: cut to its first line (a commit subject) or asked whole (an issue text: a long question).
SOURCES = {"commits": ("commits.jsonl", True), "swebench": ("swebench_lite.jsonl", False)}


def questions_for(repo: str | None, n: int, source: str = "commits") -> list[str]:
    """*n* questions about *repo* from the eval file of *source* (``SOURCES``), repeated as
    needed, or generic ones without a repository or when it has none there."""
    if repo:
        name, first_line = SOURCES[source]
        path = Path(__file__).resolve().parents[2] / "shared" / "eval" / name
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        qs = [r["query"].split("\n")[0] if first_line else r["query"] for r in rows if r["repo"] == repo]
        if qs:
            return (qs * (n // len(qs) + 1))[:n]
    return (GENERIC * (n // len(GENERIC) + 1))[:n]


def summarise(replies: list) -> dict[str, dict[str, float]]:
    """Median and p95 per stage, and per part of the searcher's work (``search.analyse``, ``search.vector`` …)."""
    stages: dict[str, list[float]] = {}
    for r in replies:
        for s in r.stages:
            stages.setdefault(s.name, []).append(s.ms)
            if s.name == "search":
                for part, ms in (s.detail.get("timings_ms") or {}).items():
                    stages.setdefault(f"search.{part}", []).append(float(ms))
    return {k: {"median_ms": round(statistics.median(v), 1), "p95_ms": round(pct(v, 0.95), 1), "n": len(v)} for k, v in stages.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--repo", default=None)
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--questions-from", choices=sorted(SOURCES), default="commits",
                    help="--repo's commit subjects, or its SWE-bench Lite issue texts (long questions)")
    ap.add_argument("--idle", type=float, default=3.0, help="reranker idle seconds for the cold run")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "latency.json"))
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=VALUE",
                    help="ask the warm questions again with these ranking settings (the question's own), alternating; repeatable")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="wsl", dir="/tmp"))
    ws = tmp / "ws"
    shutil.copytree(args.workspace, ws, symlinks=True)
    env = dict(os.environ, WSCTX_RUNTIME_DIR=str(tmp / "run"), WSCTX_DATA_DIR=str(tmp / "data"), WSCTX_CONFIG="/nonexistent",
               WSCTX_RERANKER_IDLE_S=str(args.idle), PYTHONUNBUFFERED="1",
               # the cold pass asks the warm pass's questions again: without this the pair cache would
               # answer them with no worker started, and the deadline would turn a slow start into fused order
               WSCTX_RERANK_CACHE_PAIRS="0", WSCTX_QUESTION_DEADLINE_MS="0")
    settings = load_settings(env=env)
    overrides = question_overrides(settings, args.compare)  # checked as `wsctx ask --set` checks them, before anything starts
    wid, _ = Registry(settings.data_dir).add(ws)
    procs: dict[str, subprocess.Popen] = {}
    results: dict[str, object] = {"workspace": args.workspace, "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    try:
        procs = start_daemons(DAEMONS, env, tmp, settings)
        while True:
            st = control_request(settings.control_endpoint("watcher"), StatusRequest()).body.details["workspaces"].get(wid, {})
            if st.get("files") and st.get("pending") == 0:
                break
            time.sleep(1)
        client = Client(settings.endpoint("front"), sender="bench")
        qs = questions_for(args.repo, args.questions, args.questions_from)


        def ask(q: str, changes: dict[str, str] | None = None):
            request = AskRequest(question=q, workspace=wid, settings=AskSettings(overrides=changes or {}))
            return client.request(request, timeout_ms=60000).body

        ask(qs[0])  # start the pool
        warm, changed = [], []
        for q in qs:  # side by side: each question with the defaults, then with the overrides
            warm.append(ask(q))
            if overrides:
                changed.append(ask(q, overrides))
        time.sleep(SETTLE_S)  # quiet, as after an editor's questions: the embedder trims what indexing freed
        results["rss_after_warm_mb"] = daemon_memory_mb(settings.runtime_dir)
        cold = []
        for q in qs:
            deadline = time.monotonic() + args.idle + 30
            while time.monotonic() < deadline:
                d = control_request(settings.control_endpoint("reranker"), StatusRequest()).body.details
                if not d.get("live_workers") and not d.get("workers"):
                    break
                time.sleep(0.5)
            cold.append(ask(q))
        results["warm"] = summarise(warm)
        if overrides:
            results["warm_with"] = {"overrides": overrides, **summarise(changed)}
        results["cold"] = summarise(cold)
        results["degraded_warm"] = sum(1 for r in warm if r.degraded)
        results["degraded_cold"] = sum(1 for r in cold if r.degraded)
    finally:
        stop_daemons(procs.values())
    for mode in ("warm", "warm_with", "cold"):
        if mode not in results:
            continue
        print(f"\n{mode} ({args.questions} questions)" + (f" {overrides}" if mode == "warm_with" else ""))
        print(f"{'stage':<18} {'median ms':>10} {'p95 ms':>10}")
        for stage, v in results[mode].items():  # type: ignore[union-attr]
            if isinstance(v, dict) and "median_ms" in v:
                print(f"{stage:<18} {v['median_ms']:>10} {v['p95_ms']:>10}")
    rss = results.get("rss_after_warm_mb")
    if rss:
        print(f"\nresident MB after the warm questions and {SETTLE_S:.0f} s of quiet: {rss}, together {sum(rss.values()):.0f}")
    Path(args.out).write_text(json.dumps(results, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
