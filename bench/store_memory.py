"""Memory of a long-running index process: many small writes and searches on one LanceDB table.

    .venv/bin/python -m bench.store_memory [--writes 600] [--every 50] [--files 5]
        [--variant NAME=INDEX_MB,METADATA_MB[,ARENAS[,POOL]] ...] [--tree DIR] [--out FILE]

The soak (``bench.soak``) found the embedder and the searcher growing by about 20 MB a minute with
no plateau. This benchmark isolates the table: each variant runs in its own process, which

1. indexes a real tree (default: the code of packages installed in this venv) with the product's
   chunker and row planner, vectors drawn at random (their values do not change what LanceDB
   caches), then optimizes, as the embedder does;
2. ``--writes`` times rewrites ``--files`` files (new content hash, new rows: one table version
   each), optimizing every ``optimize_every`` writes as the embedder does, and after each write
   runs three keyword, three vector and one path search through a reader that sees every version,
   as the searcher does;
3. every ``--every`` writes records its RSS, LanceDB's cache bytes (``store.cache_usage``) and the
   median search time since the last record.

Variants are cache bounds in MB (``store.configure_caches``; 0 is LanceDB's own default) and the
malloc arenas (``runtime.limit_malloc_arenas``, as every daemon's ``main`` calls it; 0 or left out:
glibc's default), and optionally Arrow's memory pool (the daemons' ``arrow_memory_pool``) (``mimalloc``, pyarrow's default, ``jemalloc`` or
``system``: glibc's malloc; set as ``ARROW_DEFAULT_MEMORY_POOL`` for the variant's process): by default LanceDB's, glibc's and pyarrow's own (6 GiB index, 1 GiB metadata, 8 arenas per
core, mimalloc) against the shipped settings, run one after the other in one invocation. Prints one table per variant and a summary; writes JSON
(bench/results/store_memory.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemons.lib.config import ARROW_POOLS, INDEX_CACHE_MB, METADATA_CACHE_MB, Settings  # noqa: E402
from daemons.lib.runtime import memory_mb as rss_mb  # noqa: E402

OUT = ROOT / "bench" / "results" / "store_memory.json"
PACKAGES = ("structlog", "msgspec", "pathspec", "watchdog", "zmq", "supervisor", "tokenizers")
DIM = 384
SHIPPED = f"{INDEX_CACHE_MB},{METADATA_CACHE_MB},{Settings.malloc_arenas},{Settings.arrow_memory_pool}"
#: Arrow's memory pools a variant may name (``ARROW_DEFAULT_MEMORY_POOL``; '' is pyarrow's own).
POOLS = tuple(p for p in ARROW_POOLS if p)


def source_files(tree: Path | None) -> list[tuple[str, str]]:
    """``(relative path, text)`` of the ``.py`` files the watcher would index under *tree*; with no
    tree, of the packages named in ``PACKAGES`` as installed in this venv (a realistic mix)."""
    import importlib.util

    from daemons.lib.filtering import indexable_files

    if tree is not None:
        return [(rel, data.decode("utf-8", "replace")) for rel, data in indexable_files(tree)[0] if rel.endswith(".py")]
    out = []
    for pkg in dict.fromkeys(PACKAGES):
        spec = importlib.util.find_spec(pkg)
        if spec and spec.submodule_search_locations:
            base = Path(list(spec.submodule_search_locations)[0])
            out += [(f"{pkg}/{p.relative_to(base)}", p.read_text("utf-8", "replace")) for p in sorted(base.rglob("*.py"))]
    return out


def run_variant(tree: Path | None, index_mb: int, metadata_mb: int, arenas: int, writes: int, every: int, per_write: int, seed: int) -> dict[str, Any]:
    """One variant in this process (``--worker``): the records and the table's size."""
    import numpy as np

    from daemons.lib.chunking import chunk_text
    from daemons.lib.indexing import plan_rows
    from daemons.lib.runtime import limit_malloc_arenas
    from daemons.lib.store import IndexStore, cache_usage, configure_caches

    limit_malloc_arenas(arenas)
    configure_caches(index_mb, metadata_mb)
    s = Settings()
    rng = np.random.default_rng(seed)
    files = source_files(tree)
    shape = s.chunk_settings()

    def rows_for(rel: str, text: str, version: int) -> list[dict[str, Any]]:
        rows, _ = plan_rows(rel, f"h{version}", chunk_text(text, rel, shape), s)
        for row in rows:
            v = rng.standard_normal(DIM).astype(np.float32)
            row["vector"] = v / np.linalg.norm(v)
        return rows

    folder = Path(tempfile.mkdtemp(prefix="store-memory-ix-"))
    meta = {"model_id": "bench@1", "dim": DIM, "chunker_version": "bench", **{k: getattr(s, k) for k in s.index_shape()}}
    writer = IndexStore.open_writer(folder, meta)
    t0 = time.perf_counter()
    batch: dict[str, list[dict[str, Any]]] = {}
    for rel, text in files:
        batch[rel] = rows_for(rel, text, 0)
        if len(batch) >= 200:
            writer.replace_files(batch)
            batch = {}
    if batch:
        writer.replace_files(batch)
    writer.optimize()
    built_s = time.perf_counter() - t0
    reader = IndexStore.open_reader(folder)
    assert reader is not None
    words = sorted({w for _, text in files[:200] for w in text.split() if w.isidentifier() and len(w) > 4})
    records = [{"writes": 0, "rss_mb": round(rss_mb(), 1), "cache_mb": round(cache_usage()["bytes"] / 2**20, 1),
                "cache_items": cache_usage()["items"], "search_ms": None, "s": round(time.perf_counter() - t0, 1)}]
    times: list[float] = []
    for n in range(1, writes + 1):
        picked = rng.choice(len(files), per_write, replace=False)
        writer.replace_files({files[i][0]: rows_for(files[i][0], files[i][1], n) for i in picked})
        writer.optimize_if_due(s.optimize_every)
        for _ in range(3):
            q0 = time.perf_counter()
            reader.keyword_search(" ".join(rng.choice(words, 4)), 20)
            v = rng.standard_normal(DIM).astype(np.float32)
            reader.vector_search(v / np.linalg.norm(v), 20)
            times.append((time.perf_counter() - q0) * 1000)
        reader.paths()
        if n % every == 0:
            use = cache_usage()
            records.append({"writes": n, "rss_mb": round(rss_mb(), 1), "cache_mb": round(use["bytes"] / 2**20, 1),
                            "cache_items": use["items"], "search_ms": round(statistics.median(times), 1),
                            "s": round(time.perf_counter() - t0, 1)})
            times = []
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    rows = writer.table.count_rows()
    IndexStore.destroy(folder)
    import pyarrow

    return {"index_mb": index_mb, "metadata_mb": metadata_mb, "arenas": arenas,
            "arrow_pool": pyarrow.default_memory_pool().backend_name, "files": len(files), "rows": rows, "build_s": round(built_s, 1),
            "records": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writes", type=int, default=600)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--files", type=int, default=5, help="files rewritten per write")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=INDEX_MB,METADATA_MB[,ARENAS[,POOL]]",
                    help=f"cache bounds, malloc arenas and Arrow pool to run (default: lancedb=0,0,0,mimalloc and shipped={SHIPPED})")
    ap.add_argument("--tree", type=Path, default=None, help="folder to index (default: installed packages' code)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        index_mb, metadata_mb, arenas = (int(x) for x in args.worker.split(","))
        print(json.dumps(run_variant(args.tree, index_mb, metadata_mb, arenas, args.writes, args.every, args.files, args.seed)))
        return
    variants: dict[str, tuple[int, int, int, str]] = {}
    for item in args.variant or ["lancedb=0,0,0,mimalloc", f"shipped={SHIPPED}"]:
        name, _, spec = item.partition("=")
        fields = spec.split(",")
        pool = fields.pop() if len(fields) == 4 else ""
        try:
            numbers = [int(x) for x in fields]
        except ValueError:
            numbers = []
        if len(numbers) not in (2, 3) or pool not in ("", *POOLS):
            ap.error(f"--variant {item!r}: expected NAME=INDEX_MB,METADATA_MB[,ARENAS[,POOL]], POOL one of {', '.join(POOLS)}")
        index_mb, metadata_mb, arenas = (numbers + [0])[:3]
        variants[name] = (index_mb, metadata_mb, arenas, pool)
    tree = ["--tree", str(args.tree)] if args.tree else []
    results: dict[str, Any] = {}
    for name, (index_mb, metadata_mb, arenas, pool) in variants.items():
        print(f"== {name}: index cache {index_mb or 'lancedb default'} MB, metadata cache {metadata_mb or 'lancedb default'} MB, "
              f"malloc arenas {arenas or 'glibc default'}, Arrow pool {pool or 'default'}", file=sys.stderr, flush=True)
        env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | ({"ARROW_DEFAULT_MEMORY_POOL": pool} if pool else {})
        done = subprocess.run([sys.executable, "-m", "bench.store_memory", "--worker", f"{index_mb},{metadata_mb},{arenas}", *tree,
                               "--writes", str(args.writes), "--every", str(args.every), "--files", str(args.files),
                               "--seed", str(args.seed)], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True, env=env)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    for name, r in results.items():
        print(f"\n{name}: index cache {r['index_mb'] or 'default'} MB, metadata cache {r['metadata_mb'] or 'default'} MB, "
              f"malloc arenas {r['arenas'] or 'default'}, Arrow pool {r['arrow_pool']}; "
              f"{r['files']} files, {r['rows']} rows, built in {r['build_s']} s")
        print(f"{'writes':>7} {'RSS MB':>8} {'cache MB':>9} {'items':>7} {'search ms (median)':>19} {'s':>6}")
        for rec in r["records"]:
            ms = "" if rec["search_ms"] is None else f"{rec['search_ms']:.1f}"
            print(f"{rec['writes']:>7} {rec['rss_mb']:>8.0f} {rec['cache_mb']:>9.1f} {rec['cache_items']:>7} {ms:>19} {rec['s']:>6.0f}")
    print("\nsummary (growth from the first record after the build to the last)")
    print(f"{'variant':<10} {'RSS start':>9} {'RSS end':>8} {'MB/100 writes':>14} {'cache end MB':>12} {'search ms':>10}")
    summary = {}
    for name, r in results.items():
        recs = r["records"]
        first, last = recs[1] if len(recs) > 1 else recs[0], recs[-1]
        span = max(1, last["writes"] - first["writes"])
        growth = 100 * (last["rss_mb"] - first["rss_mb"]) / span
        med = statistics.median(x["search_ms"] for x in recs if x["search_ms"] is not None) if len(recs) > 1 else float("nan")
        summary[name] = {"rss_start_mb": first["rss_mb"], "rss_end_mb": last["rss_mb"], "mb_per_100_writes": round(growth, 1),
                         "cache_end_mb": last["cache_mb"], "search_ms_median": round(med, 1)}
        print(f"{name:<10} {first['rss_mb']:>9.0f} {last['rss_mb']:>8.0f} {growth:>14.1f} {last['cache_mb']:>12.1f} {med:>10.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"host": platform.node(), "cpus": os.cpu_count(), "writes": args.writes, "files_per_write": args.files,
                                    "variants": results, "summary": summary}, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
