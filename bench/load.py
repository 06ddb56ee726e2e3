"""Load: concurrent clients asking questions while files are edited, every daemon under supervisord.

Brings the six daemons up under supervisord (the repository's supervisord.conf, rendered as
``wsctx up`` does) in a temp folder, indexes a copy of WORKSPACE (default: the unpacked requests
requests 2.34.2 sdist of the bench cache, ``python -m bench.repos``, when present, else a generated workspace), then runs
--clients client threads asking questions back to back for --seconds while --edit-files files
are rewritten (one every seconds/edit_files s). A client that finds the front silent or down
tries again (Lazy Pirate); an error reply, or no answer within 90 s, is an error. Degraded
answers (keywords only, fused order, index still building) are counted separately.
Prints throughput, p50/p95/p99 latency, errors and degraded answers; writes bench/results/load.json.

``--compare`` runs the same load twice, side by side in one run, each on a fresh install:
``spec`` (no question deadline, no pair cache, indexing at the questions' priority, no window
vector cache: SPEC's behaviour) and ``defaults`` (the shipped settings). ``--questions repeated`` (default) cycles ten
questions, as an editor and an agent re-asking; ``distinct`` asks a different question every time
(made from the workspace's own function names), so no answer can come from a cache.

    python -m bench.load                       # 20 clients, 60 s, 100 files edited
    python -m bench.load --compare --questions distinct
    python -m bench.load --clients 5 --seconds 10 --edit-files 10 --workspace /path/to/repo
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from daemons import DAEMONS  # noqa: E402
from protocol.schema import AskRequest  # noqa: E402

DEFAULT_SRC = Path(os.environ.get("WSCTX_BENCH_CACHE", Path.home() / ".cache" / "wsctx-bench")) / "trees" / "requests-2.34.2"
QUESTIONS = [
    "where is the retry logic?", "how is the configuration parsed?", "where are cookies stored?",
    "how are redirects followed?", "where is authentication handled?", "how are timeouts applied?",
    "how is a session closed?", "where are proxies chosen?", "how is the response body decoded?",
    "where are headers merged?",
]


#: SPEC's behaviour for the settings issue 20 added: no deadline, no pair cache, indexing not
#: niced, every window embedded afresh, every row written with its vector.
SPEC_SETTINGS = {"question_deadline_ms": 0, "rerank_cache_pairs": 0, "index_nice": 0, "vector_cache_rows": 0, "keywords_first": False}


def distinct_questions(root: Path, limit: int = 5000, seed: int = 7) -> list[str]:
    """Questions made from the workspace's function names ("how does resolve redirects work?"),
    one per name of two words or more, shuffled with a fixed seed."""
    names: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        names.update(m.group(1) for m in re.finditer(r"^\s*def (\w+)", text, re.M))
    questions = sorted({f"how does {' '.join(w for w in name.split('_') if w)} work?" for name in names
                        if len([w for w in name.split("_") if w]) >= 2})
    random.Random(seed).shuffle(questions)
    return questions[:limit]


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _editable(root: Path, n: int) -> list[Path]:
    files = sorted(p for p in root.rglob("*.py") if p.is_file() and ".git" not in p.parts)
    return files[:n] if len(files) >= n else files


def run_load(endpoint: str, workspace: str, root: Path, clients: int = 20, seconds: float = 60.0, edit_files: int = 100,
             questions: list[str] | None = None) -> dict[str, Any]:
    """Run the load against a front that is up; return the figures (latencies in ms). With
    *questions*, client n asks questions[n], questions[n + clients], ... (none asked twice
    until the list runs out); without, the ten QUESTIONS in turn."""
    from tests.test_faults import ask

    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    error_spans: list[tuple[float, float]] = []  # (asked, answered) on time.time() of each error
    degraded = 0
    degraded_kinds: dict[str, int] = {}
    stop = threading.Event()

    def client(n: int) -> None:
        nonlocal degraded
        i = n
        pool = questions or QUESTIONS
        step = clients if questions else 1
        while not stop.is_set():
            q = pool[i % len(pool)]
            i += step
            t0, asked = time.perf_counter(), time.time()
            try:
                kind, value = ask(endpoint, AskRequest(question=q, workspace=workspace, conversation_id=f"load-{n}-{i}"))
            except Exception as exc:  # noqa: BLE001
                kind, value = "error", exc
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                if kind == "ok":
                    latencies.append(ms)
                    if value.degraded:
                        degraded += 1
                        for d in value.degraded:
                            key = "index still building (files pending)" if d.startswith("index ") else d
                            key = "vectors still building (keywords only for some files)" if d.startswith("vectors ") else key
                            key = "team index unavailable" if d.startswith("team index ") else key
                            degraded_kinds[key] = degraded_kinds.get(key, 0) + 1
                else:
                    errors.append(f"{q!r}: {kind}: {value}")
                    error_spans.append((asked, time.time()))

    files = _editable(root, edit_files)
    originals = {p: p.read_text(errors="replace") for p in files}
    edited = 0

    def editor() -> None:
        nonlocal edited
        if not files:
            return
        gap = seconds / max(1, edit_files)
        k = 0
        while not stop.is_set() and edited < edit_files:
            p = files[k % len(files)]
            p.write_text(originals[p] + f"\n\ndef load_edit_{k}(value):\n    return value + {k}\n")
            k += 1
            edited += 1
            stop.wait(gap)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    ed = threading.Thread(target=editor, daemon=True)
    started = time.perf_counter()
    for t in threads:
        t.start()
    ed.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(120)
    ed.join(10)
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "seconds": seconds,
        "wall_s": round(wall, 2),
        "files_edited": edited,
        "answered": len(latencies),
        "throughput_qps": round(len(latencies) / wall, 2),
        "p50_ms": round(pct(latencies, 0.50), 1),
        "p95_ms": round(pct(latencies, 0.95), 1),
        "p99_ms": round(pct(latencies, 0.99), 1),
        "max_ms": round(max(latencies), 1) if latencies else 0.0,
        "errors": len(errors),
        "error_samples": errors[:10],
        "error_spans": error_spans,
        "degraded": degraded,
        "degraded_kinds": degraded_kinds,
    }


def run_one(args: argparse.Namespace, label: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Index a fresh copy of the workspace under a fresh supervisord with *settings*, then load it."""
    from tests.support import short_tmpdir
    from tests.test_faults import Supervised, fixture_cross_encoder, make_workspace

    base = short_tmpdir("wl")
    root = base / "w"
    if args.workspace:
        shutil.copytree(args.workspace, root, symlinks=True)
        source = str(args.workspace)
    else:
        make_workspace(root, n=200)
        source = "generated (200 modules)"
    questions = distinct_questions(root) if args.questions == "distinct" else None
    model = fixture_cross_encoder(base / "ce")
    sup = Supervised(base, reranker_dir=str(model), **settings)
    index_s = 0.0
    try:
        sup.wait_all(180)
        t0 = time.perf_counter()
        wid = sup.add_workspace(root)
        sup.wait_indexed(root, 1800)
        index_s = time.perf_counter() - t0
        print(f"[{label}] indexed {source} in {index_s:.1f} s; load: {args.clients} clients x {args.seconds:g} s, "
              f"{args.edit_files} files edited, {args.questions} questions", flush=True)
        result = run_load(sup.endpoint("front"), wid, root, args.clients, args.seconds, args.edit_files, questions)
        t1 = time.perf_counter()
        sup.wait_indexed(root, 600)
        result["catch_up_s"] = round(time.perf_counter() - t1, 1)
        result["table_matches_disk"] = True
        result["daemons_up_after"] = {d: sup.alive(d) for d in DAEMONS}
    finally:
        left = sup.stop()
        shutil.rmtree(base, ignore_errors=True)
    result.update(label=label, settings=settings, questions=args.questions, distinct_questions=len(questions or QUESTIONS),
                  workspace=source, index_s=round(index_s, 1), leftover_processes=left)
    return result


def print_table(results: list[dict[str, Any]]) -> None:
    cols = ("label", "answered", "throughput_qps", "p50_ms", "p95_ms", "p99_ms", "errors", "degraded", "index_s", "catch_up_s")
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    for r in results:
        print(f"{r['label']}: degraded {r['degraded_kinds']}")


def main(argv: list[str] | None = None) -> int:
    from daemons.lib.config import Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, default=DEFAULT_SRC if DEFAULT_SRC.is_dir() else None)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--edit-files", type=int, default=100)
    ap.add_argument("--questions", choices=("repeated", "distinct"), default="repeated")
    ap.add_argument("--compare", action="store_true", help="SPEC's behaviour and the defaults, side by side")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/load[_compare][_distinct].json")
    args = ap.parse_args(argv)

    # The tests' environment switches the deadline off; the bench measures the product's own.
    defaults = {k: getattr(Settings(), k) for k in SPEC_SETTINGS}
    runs = [("spec", dict(SPEC_SETTINGS)), ("defaults", defaults)] if args.compare else [("defaults", defaults)]
    results = [run_one(args, label, settings) for label, settings in runs]
    print_table(results)
    out = args.out or REPO / "bench" / "results" / ("load" + ("_compare" if args.compare else "") + ("_distinct" if args.questions == "distinct" else "") + ".json")
    meta = {"cores": os.cpu_count(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "reranker_model": "shipped" if (REPO / "models/artifacts/cross-encoder/manifest.json").is_file() else "fixture (tiny ONNX stand-in)",
            "load_avg_before": os.getloadavg()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results[0] if len(results) == 1 else {"runs": results}, indent=1) + "\n" if False else
                   json.dumps({**meta, "runs": results}, indent=1) + "\n")
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
