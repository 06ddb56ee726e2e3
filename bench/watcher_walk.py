"""Watcher walk: how the watcher answers while it walks a large workspace (issue 46, items 7 and 13).

Starts a real watcher (nothing downstream: its events queue on the chunker's socket) on a large
generated workspace A (--files files, 100 per folder) and a small one B, with a short
``reconcile_interval_s`` so that A is walked again and again, optionally beside --load processes
that keep the CPUs busy (a loaded laptop). For --seconds it then measures, side by side:

* control round trips: a status request every 20 ms on the watcher's control socket, each
  timed from send to reply (the CLI gives one 700 ms);
* a new file in B: written every 2 s, timed until the watcher's status counts it among B's
  files on disk (the watch's hint, then its check), which a walk of A must not hold up.

Prints one table and writes bench/results/watcher_walk.json (``--out``).

    python -m bench.watcher_walk                       # 10,000 files, 30 s, 2 busy processes
    python -m bench.watcher_walk --files 50000 --load 0
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import pct  # noqa: E402

OUT = REPO / "bench" / "results" / "watcher_walk.json"


def _spin(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50_ms": round(pct(values, 50), 1), "p95_ms": round(pct(values, 95), 1),
            "p99_ms": round(pct(values, 99), 1), "max_ms": round(max(values), 1) if values else None,
            "over_50_ms": sum(v > 50 for v in values), "over_700_ms": sum(v > 700 for v in values)}


def main(argv: list[str] | None = None) -> int:
    from daemons.lib import runtime
    from protocol.schema import StatusRequest
    from tests.support import Daemons, daemon_env, register, short_tmpdir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--load", type=int, default=2, help="processes kept busy beside the watcher")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    base = short_tmpdir("ww")
    big, small = base / "a", base / "b"
    for i in range(max(1, args.files // 100)):
        folder = big / f"pkg{i:04d}"
        folder.mkdir(parents=True)
        for j in range(100):
            (folder / f"m{j:03d}.py").write_text(f"VALUE_{i}_{j} = {i * j}\n")
    small.mkdir()
    (small / "first.py").write_text("X = 1\n")
    env = daemon_env(base, reconcile_interval_s=1.0)
    big_id, small_id = register(env["WSCTX_DATA_DIR"], big), register(env["WSCTX_DATA_DIR"], small)
    d = Daemons(["watcher"], env)
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    rtts: list[float] = []
    new_file_ms: list[float] = []
    walking = 0
    try:
        for p in spinners:
            p.start()
        d.start()
        endpoint = d.control_endpoint("watcher")
        started = time.monotonic()
        next_file, n, waiting = started + 1.0, 0, None  # (path count expected, written at)
        while time.monotonic() - started < args.seconds:
            t0 = time.perf_counter()
            reply = runtime.control_request(endpoint, StatusRequest(), timeout_ms=5000)
            rtts.append((time.perf_counter() - t0) * 1000)
            details = reply.body.details
            walking += bool(details.get("reconciling"))
            b = details["workspaces"].get(small_id) or {}
            if waiting and b.get("files", 0) >= waiting[0]:
                new_file_ms.append((time.perf_counter() - waiting[1]) * 1000)
                waiting = None
            if waiting is None and time.monotonic() >= next_file and b.get("files"):
                n += 1
                (small / f"new{n}.py").write_text(f"NEW_{n} = {n}\n")
                waiting = (1 + n, time.perf_counter())
                next_file = time.monotonic() + 2.0
            time.sleep(0.02)
        a = (runtime.control_request(endpoint, StatusRequest(), timeout_ms=5000).body.details["workspaces"].get(big_id) or {})
        reconciles = d.counter("watcher", "reconciles")
    finally:
        stop.set()
        d.stop_all()
        for p in spinners:
            p.join(5)
    result = {"files": args.files, "seconds": args.seconds, "load_processes": args.load, "machine": platform.machine(),
              "cpus": multiprocessing.cpu_count(), "status_round_trip": summary(rtts),
              "status_while_walking": walking, "new_file_in_other_workspace": summary(new_file_ms),
              "new_files_unseen_at_end": 1 if waiting else 0, "big_workspace_files_seen": a.get("files"), "reconciles": reconciles}
    print(f"{'measure':<36} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>50 ms':>7} {'>700 ms':>8}")
    for name, key in (("status round trip", "status_round_trip"), ("new file in the other workspace", "new_file_in_other_workspace")):
        s = result[key]
        print(f"{name:<36} {s['n']:>5} {s['p50_ms']:>8} {s['p95_ms']:>8} {s['p99_ms']:>8} {s['max_ms']!s:>8} {s['over_50_ms']:>7} {s['over_700_ms']:>8}")
    print(f"{walking} of {len(rtts)} status replies came during a walk; {reconciles} reconciles; "
          f"{a.get('files')} of {args.files} files of the large workspace seen; {result['new_files_unseen_at_end']} new file unseen at the end")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
