"""Soak: bench.load's questions for --minutes while files are edited and workspaces come and go,
every daemon under supervisord (issue 23).

The six daemons are brought up under supervisord as ``wsctx up`` does, a copy of WORKSPACE
(default: requests 2.34.2 from the bench cache, else a generated one) is indexed, and then, in
rounds of --round seconds until --minutes have passed:

* --clients client threads ask questions back to back while files are rewritten (``run_load``:
  an error reply, or no answer within 90 s, is an error; degraded answers are counted apart);
* after each round a new generated workspace (40 modules) is added, and every third round the
  oldest added one is removed again, so indexes are built and dropped under load (``--kept N``:
  the oldest is removed whenever more than N are added, so their number stays level and memory
  that grows with time can be told from memory that grows with workspaces);
* the resident memory of every daemon and reranker worker is read from /proc.

With ``--kill-every S`` one daemon or reranker worker, chosen at random (``KILL_TARGETS``), is
killed with SIGKILL every S seconds while the load runs; supervisord (or, for a worker, the
broker) starts it again. An error reply to a question asked before a kill and answered after it
is *in flight at the kill*; every other error is a lost answer (issue 46).

At the end every workspace still registered must match its files on disk. Prints one row per
round (answered, p50/p95/p99, errors, degraded, memory per daemon) and memory at the start and
the end; writes bench/results/soak.json.

    python -m bench.soak                      # 30 minutes, 20 clients
    python -m bench.soak --minutes 3 --round 60
    python -m bench.soak --minutes 20 --kept 2   # a level number of workspaces
    python -m bench.soak --minutes 30 --kill-every 120 --kept 2 --out bench/results/soak_kills.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.load import DEFAULT_SRC, pct, run_load  # noqa: E402
from bench.processes import daemon_memory_mb as memory_mb  # noqa: E402
from daemons.supervision import daemon_name, processes_for  # noqa: E402

#: What ``--kill-every`` picks from: the daemons, and "worker" for one reranker worker.
KILL_TARGETS = ("embedder", "searcher", "reranker", "worker", "front", "watcher", "chunker")


class Killer(threading.Thread):
    """Kills one target at random every *every* s (SIGKILL), noting when and what."""

    def __init__(self, runtime_dir: str, every: float, seed: int = 46) -> None:
        super().__init__(daemon=True)
        self.runtime_dir, self.every = runtime_dir, every
        self.rng = random.Random(seed)
        self.kills: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def pick(self, target: str) -> int | None:
        names = {pid: daemon_name(pid) for pid in processes_for(self.runtime_dir)}
        want = "reranker.worker" if target == "worker" else target
        pids = [pid for pid, name in names.items() if name == want]
        return self.rng.choice(pids) if pids else None

    def run(self) -> None:
        while not self.stop.wait(self.every):
            target = self.rng.choice(KILL_TARGETS)
            pid = self.pick(target)
            if pid is None:  # no worker alive (idle exit): a daemon instead
                target = self.rng.choice(KILL_TARGETS[:3] + KILL_TARGETS[4:])
                pid = self.pick(target)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append({"at": time.time(), "target": target, "pid": pid})
            print(f"killed {target} (pid {pid})", flush=True)


def retried(step: Any, timeout: float = 120.0) -> Any:
    """``step()`` tried again until it returns something other than None without raising: a
    workspace added or removed while the daemon that takes it is being killed waits for its restart."""
    end = time.monotonic() + timeout
    while True:
        try:
            out = step()
            if out is not None:
                return out
        except Exception:  # noqa: BLE001 - the daemon is down for a moment
            if time.monotonic() > end:
                raise
        if time.monotonic() > end:
            raise TimeoutError("a workspace change was not taken within 120 s")
        time.sleep(1.0)


def in_flight(span: tuple[float, float], kills: list[dict[str, Any]]) -> bool:
    """Whether a question asked and answered at *span* was under way when a kill came."""
    return any(span[0] <= k["at"] <= span[1] for k in kills)

OUT = REPO / "bench" / "results" / "soak.json"


def lance_cache_mb(settings: Any) -> dict[str, float]:
    """MB held by LanceDB's caches in each daemon that opens tables (their status's ``lance_cache``)."""
    from daemons.cli.common import daemon_status

    out: dict[str, float] = {}
    for name in ("embedder", "searcher"):
        st = daemon_status(settings, name, timeout_ms=2000) or {}
        cache = (st.get("details") or {}).get("lance_cache") or {}
        if "bytes" in cache:
            out[name] = round(cache["bytes"] / 2**20, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    from daemons import cli
    from daemons.lib.workspaces import Registry
    from tests.support import short_tmpdir, table_mismatches
    from tests.test_faults import Supervised, fixture_cross_encoder, make_workspace

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=lambda s: Path(s) if s else None, default=DEFAULT_SRC if DEFAULT_SRC.is_dir() else None,
                    help="the folder copied and indexed (\"\": a generated one of 200 modules)")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--round", type=float, default=120.0, help="seconds of load between workspace changes")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--edits", type=int, default=20, help="files rewritten per round")
    ap.add_argument("--kept", type=int, default=0,
                    help="keep at most this many added workspaces, removing the oldest after each round (0: remove the "
                         "oldest every third round, so their number grows)")
    ap.add_argument("--kill-every", type=float, default=0.0,
                    help="seconds between SIGKILLs of a random daemon or reranker worker (0: none)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    base = short_tmpdir("wk")
    root = base / "w"
    if args.workspace:
        shutil.copytree(args.workspace, root, symlinks=True)
    else:
        make_workspace(root, n=200)
    sup = Supervised(base, reranker_dir=str(fixture_cross_encoder(base / "ce")))
    rounds: list[dict[str, Any]] = []
    latencies_p95: list[float] = []
    added: list[tuple[str, Path]] = []
    result: dict[str, Any] = {"workspace": str(args.workspace or "generated (200 modules)"), "minutes": args.minutes,
                              "clients": args.clients, "round_s": args.round, "kept": args.kept,
                              "kill_every_s": args.kill_every}
    killer: Killer | None = None
    error_spans: list[tuple[float, float]] = []
    try:
        sup.wait_all(180)
        wid = sup.add_workspace(root)
        sup.wait_indexed(root, 1800)
        result["memory_start_mb"] = memory_mb(sup.settings.runtime_dir)
        print(f"indexed; memory {result['memory_start_mb']}", flush=True)
        started = time.monotonic()
        n = 0
        if args.kill_every:
            killer = Killer(sup.settings.runtime_dir, args.kill_every)
            killer.start()
        while time.monotonic() - started < args.minutes * 60:
            n += 1
            r = run_load(sup.endpoint("front"), wid, root, args.clients, args.round, args.edits)
            error_spans += r["error_spans"]
            extra = base / f"extra{n}"
            make_workspace(extra, n=40)
            added.append((retried(lambda: sup.add_workspace(extra)), extra))
            removed = ""
            if (args.kept and len(added) > args.kept) or (not args.kept and n % 3 == 0 and len(added) > 1):
                old_id, old_root = added.pop(0)
                # done once it is no longer registered (a try cut short by a kill may have unregistered it)
                retried(lambda: old_id not in Registry(sup.settings.data_dir).load() or cli.main(
                    ["--runtime-dir", sup.settings.runtime_dir, "--data-dir", sup.settings.data_dir, "remove", old_id]) == 0 or None)
                shutil.rmtree(old_root, ignore_errors=True)
                removed = old_id
            row = {"round": n, "minute": round((time.monotonic() - started) / 60, 1), **{k: r[k] for k in (
                "answered", "throughput_qps", "p50_ms", "p95_ms", "p99_ms", "errors", "degraded", "files_edited")},
                "error_samples": r["error_samples"][:3], "degraded_kinds": r["degraded_kinds"], "workspaces": 1 + len(added), "removed": removed,
                "memory_mb": memory_mb(sup.settings.runtime_dir), "lance_cache_mb": lance_cache_mb(sup.settings)}
            rounds.append(row)
            latencies_p95.append(r["p95_ms"])
            print(f"round {n} at {row['minute']} min: {row['answered']} answered, p50 {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms, "
                  f"p99 {row['p99_ms']:.0f} ms, {row['errors']} errors, {row['degraded']} degraded; memory {row['memory_mb']}; LanceDB caches {row['lance_cache_mb']}", flush=True)
        if killer is not None:
            killer.stop.set()
            killer.join(5)
            sup.wait_all(180)  # the last one killed is back
        for _, extra in added:
            sup.wait_indexed(extra, 600)
        sup.wait_indexed(root, 600)
        result["mismatches_at_end"] = {str(p): table_mismatches(sup.settings.data_dir, p) for p in [root, *(e for _, e in added)]}
        result["memory_end_mb"] = memory_mb(sup.settings.runtime_dir)
    finally:
        if killer is not None:
            killer.stop.set()
        result["leftover_processes"] = sup.stop()
        shutil.rmtree(base, ignore_errors=True)
    result["rounds"] = rounds
    result["errors"] = sum(r["errors"] for r in rounds)
    kills = killer.kills if killer is not None else []
    result["kills"] = kills
    result["errors_in_flight_at_a_kill"] = sum(in_flight(sp, kills) for sp in error_spans)
    result["answers_lost"] = result["errors"] - result["errors_in_flight_at_a_kill"]
    minutes = (rounds[-1]["minute"] if rounds else 0) or 1
    result["errors_per_minute"] = round(result["errors"] / minutes, 2)
    result["p95_ms_all_rounds"] = round(max((r["p95_ms"] for r in rounds), default=0.0), 1)
    result["answered"] = sum(r["answered"] for r in rounds)
    result["p95_of_rounds_ms"] = {"first": latencies_p95[0] if latencies_p95 else None, "last": latencies_p95[-1] if latencies_p95 else None,
                                  "median": round(pct(latencies_p95, 0.5), 1) if latencies_p95 else None}
    print(f"\n{result['answered']} answered, {result['errors']} errors over {len(rounds)} rounds; p95 per round "
          f"{result['p95_of_rounds_ms']}")
    print(f"{'daemon':<18} {'start MB':>9} {'end MB':>9}")
    for name in sorted(set(result.get("memory_start_mb", {})) | set(result.get("memory_end_mb", {}))):
        print(f"{name:<18} {result.get('memory_start_mb', {}).get(name, 0):>9.0f} {result.get('memory_end_mb', {}).get(name, 0):>9.0f}")
    print(f"mismatches at the end: {sum(len(v) for v in result.get('mismatches_at_end', {}).values())}")
    if kills:
        by: dict[str, int] = {}
        for k in kills:
            by[k["target"]] = by.get(k["target"], 0) + 1
        print(f"\n{'kills':<10} {'answered':>9} {'errors':>7} {'in flight':>10} {'lost':>5} {'errors/min':>11} "
              f"{'p95 ms (worst round)':>21} {'table vs disk':>14}")
        print(f"{len(kills):<10} {result['answered']:>9} {result['errors']:>7} {result['errors_in_flight_at_a_kill']:>10} "
              f"{result['answers_lost']:>5} {result['errors_per_minute']:>11} {result['p95_ms_all_rounds']:>21} "
              f"{str(sum(len(v) for v in result.get('mismatches_at_end', {}).values())) + ' differ':>14}")
        print("killed: " + ", ".join(f"{t} {c}" for t, c in sorted(by.items())))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
