"""Reranker speed: load time, RSS, and 12 realistic candidates scored on one thread.

    .venv/bin/python bench/reranker_speed.py [--repeats 10] [--reranker-dir DIR] [--compare DIR]

``--compare DIR`` also times a second model folder on the same pairs, the two runs alternating,
and prints the ratio of the medians (a candidate against the shipped model, side by side).

Candidates are ~1,000-character chunks (cut at line boundaries, relative path on the first line)
of real code from packages installed in the venv, as the index would hold them.  Writes
bench/results/reranker_speed.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTIONS = [
    "how are log events rendered to JSON before they are written?",
    "Fix timeout not applied when the socket is reconnected",
]
PACKAGES = ["structlog", "msgspec", "pathspec", "watchdog", "zmq", "supervisor"]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def chunks_of(text: str, limit: int = 1000) -> list[str]:
    out, cur, n = [], [], 0
    for line in text.split("\n"):
        if n + len(line) + 1 > limit and cur:
            out.append("\n".join(cur))
            cur, n = [], 0
        cur.append(line[:limit])
        n += len(line) + 1
    if cur:
        out.append("\n".join(cur))
    return out


def candidates(n: int = 12) -> list[str]:
    import importlib.util

    pool = []
    for pkg in PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if not spec or not spec.submodule_search_locations:
            continue
        base = Path(list(spec.submodule_search_locations)[0])
        for f in sorted(base.rglob("*.py")):
            rel = f"{pkg}/{f.relative_to(base).as_posix()}"
            for c in chunks_of(f.read_text(encoding="utf-8", errors="replace")):
                if len(c) >= 800:
                    pool.append(rel + "\n" + c)
    step = max(1, len(pool) // n)
    return pool[::step][:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench/results/reranker_speed.json"))
    ap.add_argument("--reranker-dir", default=None, help="the model folder (default: the shipped one)")
    ap.add_argument("--compare", default=None, help="a second model folder timed side by side")
    args = ap.parse_args()
    rss0 = rss_mb()
    t0 = time.perf_counter()
    from models.cross_encoder import load_cross_encoder

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    ce = load_cross_encoder(args.reranker_dir, threads=args.threads)
    t_load = time.perf_counter() - t1
    rss_load = rss_mb()
    cands = candidates()
    lens = [len(ce.encode_pair(QUESTIONS[0], c)[0]) for c in cands]
    long_cands = [c * 4 for c in cands]  # worst case: every pair cut at 512 tokens

    def timed(q, ps, bs):
        ce.score(q, ps, batch_size=bs)  # warm
        ts = []
        for _ in range(args.repeats):
            s = time.perf_counter()
            ce.score(q, ps, batch_size=bs)
            ts.append(time.perf_counter() - s)
        return statistics.median(ts), min(ts)

    rows = []
    for label, ps in (("realistic ~1,000-char chunks", cands), ("full 512-token pairs", long_cands)):
        for bs in (1, 4):
            med, best = timed(QUESTIONS[1], ps, bs)
            rows.append({"candidates": label, "n": len(ps), "batch_size": bs,
                         "median_s": round(med, 4), "min_s": round(best, 4),
                         "pairs_per_s": round(len(ps) / med, 1)})
    rss_after = rss_mb()
    res = {
        "model_id": ce.model_id, "threads": args.threads, "repeats": args.repeats,
        "import_s": round(t_import, 3), "load_s": round(t_load, 3),
        "rss_mb_before_import": round(rss0, 1), "rss_mb_after_load": round(rss_load, 1),
        "rss_mb_after_scoring": round(rss_after, 1),
        "model_file_mb": round((ce.folder / "model.int8.onnx").stat().st_size / 2**20, 1),
        "realistic_pair_tokens": {"min": min(lens), "median": statistics.median(lens), "max": max(lens)},
        "runs": rows, "python": platform.python_version(), "machine": platform.machine(),
    }
    print(f"model {res['model_id']}  file {res['model_file_mb']} MB  load {t_load * 1000:.0f} ms "
          f"(import {t_import * 1000:.0f} ms)  RSS after load {rss_load:.0f} MB, after scoring {rss_after:.0f} MB")
    print(f"realistic pair length (tokens): {res['realistic_pair_tokens']}")
    print(f"{'candidates':32} {'n':>3} {'batch':>5} {'median s':>9} {'min s':>7} {'pairs/s':>8}")
    for r in rows:
        print(f"{r['candidates']:32} {r['n']:>3} {r['batch_size']:>5} {r['median_s']:>9.3f} "
              f"{r['min_s']:>7.3f} {r['pairs_per_s']:>8.1f}")
    if args.compare:
        other = load_cross_encoder(args.compare, threads=args.threads)
        times: dict[str, list[float]] = {ce.model_id + " (a)": [], other.model_id + " (b)": []}
        for model in (ce, other):
            model.score(QUESTIONS[1], cands, batch_size=4)  # warm
        for _ in range(args.repeats):
            for (name, ts), model in zip(times.items(), (ce, other)):
                s = time.perf_counter()
                model.score(QUESTIONS[1], cands, batch_size=4)
                ts.append(time.perf_counter() - s)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        (a, ma), (b, mb) = med.items()
        res["compare"] = {"a": a, "b": b, "median_s": med, "ratio_b_over_a": round(mb / ma, 3),
                          "b_file_mb": round((other.folder / "model.int8.onnx").stat().st_size / 2**20, 1)}
        print(f"side by side, {len(cands)} realistic pairs, batch 4: {a} {ma:.3f} s, {b} {mb:.3f} s, b/a {mb / ma:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
