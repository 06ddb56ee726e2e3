"""Diagnostic over a quality run's cached rankings: the same rankings with test files and non-.py
files removed (what the gold files never are), and the share of those files in the fused top 5.
Not a product setting: it shows how much of the gap to the whole-file BM25 floor is competition
from tests and docs.

    python -m bench.diagnose bench/results/quality_commits.json [unweighted|fused|reranked]
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from bench.common import bench_settings, index_key, is_test_file
from daemons.lib.metrics import file_metrics, mean_metrics
from bench.quality import METHODS, reranked_orders
from bench.repos import DEFAULT_CACHE


def main(path: str, cache: Path = DEFAULT_CACHE, top5_of: str = "fused") -> dict:
    d = json.loads(Path(path).read_text())
    s = bench_settings()
    methods = [m for m in METHODS if m != "bm25_file"]
    res: dict[str, list] = {m: [] for m in methods}
    tests = other = total = 0
    for c in d["cases"]:
        name, ver = c["pypi"].rsplit("-", 1)
        f = cache / "caseruns" / index_key(name, ver, d["embedder"], s) / d.get("search_key", "") / (hashlib.sha1((c["set"] + c["id"]).encode()).hexdigest()[:16] + ".json")
        r = json.loads(f.read_text())
        if "fused_probs" in r:
            r["cross_encoder"], r["reranked"] = reranked_orders(r, s, c.get("long", False))
        for m in methods:
            if m in r:
                res[m].append(file_metrics([p for p in r[m] if p.endswith(".py") and not is_test_file(p)], c["gold"]))
        for p in r[top5_of][:5]:
            total += 1
            tests += is_test_file(p)
            other += (not p.endswith(".py")) and not is_test_file(p)
    out = {"source_only": {m: mean_metrics(v) for m, v in res.items() if v},
           "fused_top5_share": {"test": round(tests / max(total, 1), 3), "non_py": round(other / max(total, 1), 3)}}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1], top5_of=sys.argv[2] if len(sys.argv) > 2 else "fused")
