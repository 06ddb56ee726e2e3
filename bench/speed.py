"""Index and question speed on real repositories (PyPI sdists), against rg and whole-file BM25.

Parts (``--part``, repeatable; default ``index latency``):

* ``index``    full index of each ``--repo`` tree with the product's library path, writing each
  file with ``IndexStore.replace_file`` as the embedder daemon does; per-stage seconds (list,
  chunk = chunk_text + plan_rows, embed, write, optimize), files/s, windows/s, disk size.
  ``--reuse`` takes the stage timings of an index the quality bench already built uncached
  (its ``build.json``; batch writes) instead of building again.
* ``chunkonly`` the same up to ``plan_rows`` for trees too large to embed here (rows, chunk s);
  embed time is then estimated from the measured windows/s and labelled so.
* ``latency``  on each index: embed_query, keyword_search, vector_search (k=20) and the whole
  ``hybrid_search``; rg (``rg -l -i -e w1 -e w2 ...`` with the query keywords) over the tree; the
  whole-file BM25 floor (build once, then per query). Median and p95 over the repo's eval queries.
* ``scale``    >= ``--scale-rows`` rows made by replicating an index's rows (renamed paths, vectors
  plus Gaussian noise, renormalised; nothing re-embedded), then FTS + btree + HNSW_SQ indexes, then
  keyword / vector / focus-filtered search latency through ``IndexStore`` (median/p95 of 30).

    python -m bench.speed --repo requests-2.34.2 --repo click-8.4.2 --reuse
    python -m bench.speed --part chunkonly --repo sphinx-7.0.1 --repo sympy-1.6
    python -m bench.speed --part scale --scale-source requests-2.34.2 --scale-rows 1000000
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.common import WholeFileBM25, bench_settings, build_index, index_key, pct, settings_embedder, workspace_files
from bench.repos import DEFAULT_CACHE, PYPI_NAMES, fetch_tree, load_cases
from daemons.lib.chunking import ChunkSettings, chunk_text
from daemons.lib.filtering import content_hash
from daemons.lib.indexing import plan_rows
from daemons.lib.keywords import query_keywords
from daemons.lib.search import hybrid_search
from daemons.lib.store import FILE_FTS_CONFIG, FILE_KEYWORDS, FTS_CONFIG, IndexStore

OUT = Path(__file__).resolve().parent / "results"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def du_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def stats_ms(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "p95": round(pct(values, 95), 2), "n": len(values)}


def machine() -> dict:
    mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    spin = []
    for _ in range(10):  # contention gauge: a fixed pure-Python loop, median vs best
        t0 = time.perf_counter(); sum(range(1_000_000)); spin.append((time.perf_counter() - t0) * 1000)
    return {"cpus": os.cpu_count(), "cpu": cpu, "mem_gib": round(mem / 2**20, 1), "load_avg_at_start": os.getloadavg(),
            "python": platform.python_version(),
            "spin_ms_median_vs_min": [round(statistics.median(spin), 1), round(min(spin), 1)]}


def split_name(spec: str) -> tuple[str, str]:
    name, _, version = spec.rpartition("-")
    return name, version


def queries_for(name: str, limit: int = 60) -> list[str]:
    qs = [c["query"] for c in load_cases("all") if PYPI_NAMES.get(c["repo"]) == name]
    return qs[:limit]


def part_index(specs: list[str], cache: Path, reuse: bool, embedder) -> dict:
    settings = bench_settings()
    out = {}
    for spec in specs:
        name, version = split_name(spec)
        tree = fetch_tree(name, version, cache)
        folder = cache / "indexes" / index_key(name, version, embedder.model_id, settings)
        built = folder / "build.json"
        if reuse and built.is_file():
            info = json.loads(built.read_text())
            if info.get("embedded", 0) < 0.95 * info.get("rows", 1):
                log(f"{spec}: existing build used the embedding cache; rebuilding for honest timings")
            else:
                info["source"] = "first (uncached) build by bench.quality, batch writes"
                info["disk_mb"] = du_mb(folder)
                out[spec] = info
                log(f"{spec}: reused {info}")
                continue
        speed_folder = cache / "speed" / spec
        store, st = build_index(tree, speed_folder, settings, embedder, cache=None, write="replace_file",
                                progress=lambda m: log(f"  {spec}: {m}"))
        info = st.as_dict()
        info["source"] = "bench.speed build, IndexStore.replace_file per file, no embedding cache"
        info["disk_mb"] = du_mb(speed_folder)
        out[spec] = info
        log(f"{spec}: {info}")
    return out


def part_chunkonly(specs: list[str], cache: Path, windows_per_s: float | None) -> dict:
    settings = bench_settings()
    cs = ChunkSettings(settings.chunk_max_chars, settings.chunk_min_chars, settings.chunk_context_chars)
    out = {}
    for spec in specs:
        name, version = split_name(spec)
        tree = fetch_tree(name, version, cache)
        t0 = time.perf_counter()
        files, skipped = workspace_files(tree, settings)
        t_list = time.perf_counter() - t0
        t0 = time.perf_counter()
        chunks = rows = 0
        for rel, data in files:
            text = data.decode("utf-8")
            try:
                ch = chunk_text(text, rel, cs)
            except Exception:
                ch = chunk_text(text, rel + ".txt", cs)
            r, _ = plan_rows(rel, content_hash(data), ch, settings)
            chunks += len(ch)
            rows += len(r)
        t_chunk = time.perf_counter() - t0
        info = {"files": len(files), "skipped_files": len(skipped), "chunks": chunks, "rows": rows,
                "seconds": {"list": round(t_list, 2), "chunk": round(t_chunk, 2)},
                "chunk_files_per_s": round(len(files) / t_chunk, 1), "chunk_rows_per_s": round(rows / t_chunk, 1)}
        if windows_per_s:
            info["estimated_embed_s"] = round(rows / windows_per_s, 0)
            info["estimate_basis_windows_per_s"] = windows_per_s
        out[spec] = info
        log(f"{spec}: {info}")
    return out


def rg_time(tree: Path, terms: list[str]) -> float:
    args = ["rg", "-l", "-i", "--no-messages"]
    for t in terms:
        args += ["-e", t]
    t0 = time.perf_counter()
    subprocess.run(args + [str(tree)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def part_latency(specs: list[str], cache: Path, embedder, n_queries: int) -> dict:
    settings = bench_settings()
    out = {}
    for spec in specs:
        name, version = split_name(spec)
        tree = fetch_tree(name, version, cache)
        folder = cache / "indexes" / index_key(name, version, embedder.model_id, settings)
        if not (folder / "build.json").is_file():
            folder = cache / "speed" / spec
        store = IndexStore.open_reader(folder)
        if store is None:
            log(f"{spec}: no index; run --part index first")
            continue
        qs = queries_for(name, n_queries)
        if len(qs) < 30:
            qs = (qs * (30 // max(1, len(qs)) + 1))[:30]
        files, _ = workspace_files(tree, settings)
        t0 = time.perf_counter()
        bm25 = WholeFileBM25(files)
        bm25_build = (time.perf_counter() - t0) * 1000
        t = {k: [] for k in ("embed_query", "keyword", "vector", "hybrid", "hybrid_focus", "rg", "bm25_file", "query_keywords")}
        # warm-up
        store.keyword_search("request", 20)
        store.vector_search(embedder.embed_query("warm up"), 20)
        for q in qs:
            t0 = time.perf_counter(); kw = query_keywords(q); t["query_keywords"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter(); vec = embedder.embed_query(q); t["embed_query"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter(); store.keyword_search(kw, settings.keyword_k); t["keyword"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter(); store.vector_search(vec, settings.vector_k); t["vector"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter(); res = hybrid_search(store, kw, vec, None); t["hybrid"].append((time.perf_counter() - t0) * 1000)
            focus = sorted({r["path"] for r in res.candidates})[:8]
            t0 = time.perf_counter(); hybrid_search(store, kw, vec, focus); t["hybrid_focus"].append((time.perf_counter() - t0) * 1000)
            t["rg"].append(rg_time(tree, kw.split()[:32] or ["x"]))
            t0 = time.perf_counter(); bm25.search(q); t["bm25_file"].append((time.perf_counter() - t0) * 1000)
        out[spec] = {"queries": len(qs), "rows": store.table.count_rows(), "files": len(files),
                     "bm25_file_build_ms": round(bm25_build, 1), "note_rg": "rg -l -i with up to 32 query keywords, whole tree, process spawn included",
                     **{k: stats_ms(v) for k, v in t.items()}}
        log(f"{spec}: {json.dumps(out[spec])}")
    return out


def part_scale(source: str, cache: Path, embedder, target: int, batch: int = 50_000, n: int = 30, ann: str = "hnsw_sq") -> dict:
    from bench.ann import ensure_vector_index

    settings = bench_settings()
    name, version = split_name(source)
    src_folder = cache / "indexes" / index_key(name, version, embedder.model_id, settings)
    src = IndexStore.open_reader(src_folder)
    base = src.table.to_arrow()
    n_base = base.num_rows
    folder = cache / "scale" / f"{source}-{target}"
    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(0)
    vcol = base.column("vector").combine_chunks()
    dim = vcol.type.list_size
    base_vec = np.asarray(vcol.values, dtype=np.float32).reshape(-1, dim)
    import lancedb
    from lancedb.index import FTS, BTree

    db = lancedb.connect(str(folder))
    table = None
    t0 = time.perf_counter()
    copies = (target + n_base - 1) // n_base
    per_batch = max(1, batch // n_base)
    for c0 in range(0, copies, per_batch):
        cs = range(c0, min(copies, c0 + per_batch))
        parts = []
        for c in cs:
            prefix = f"copy{c:04d}/"
            noise = rng.normal(0, 0.03, size=base_vec.shape).astype(np.float32)
            v = base_vec + noise
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            cols = {}
            for f in base.schema:
                col = base.column(f.name)
                if f.name in ("id", "chunk_id", "path"):
                    col = pc.binary_join_element_wise(pa.scalar(prefix), col, "")
                elif f.name in ("keywords", FILE_KEYWORDS):
                    # the copy's path words, as keyword_text would append them
                    col = pc.if_else(pc.equal(col, ""), col, pc.binary_join_element_wise(col, pa.scalar(f"copy{c:04d} copy {c}"), " "))
                elif f.name == "vector":
                    col = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), dim)
                cols[f.name] = col
            parts.append(pa.table(cols, schema=base.schema))
        data = pa.concat_tables(parts)
        if table is None:
            table = db.create_table("chunks", data=data)
        else:
            table.add(data)
        log(f"  scale: {table.count_rows()} rows ({time.perf_counter() - t0:.0f} s)")
    rows = table.count_rows()
    t_add = time.perf_counter() - t0
    timings = {"add_s": round(t_add, 1)}
    t0 = time.perf_counter(); table.create_index("keywords", config=FTS(**FTS_CONFIG), replace=True)
    timings["fts_index_s"] = round(time.perf_counter() - t0, 1); log(f"  fts {timings['fts_index_s']} s")
    if FILE_KEYWORDS in base.schema.names:
        t0 = time.perf_counter(); table.create_index(FILE_KEYWORDS, config=FTS(**FILE_FTS_CONFIG), replace=True)
        timings["file_fts_index_s"] = round(time.perf_counter() - t0, 1); log(f"  file fts {timings['file_fts_index_s']} s")
    t0 = time.perf_counter(); table.create_index("path", config=BTree(), replace=True)
    timings["btree_index_s"] = round(time.perf_counter() - t0, 1); log(f"  btree {timings['btree_index_s']} s")
    store = IndexStore(folder, table, db)
    qs = queries_for(name, 200)
    rng2 = np.random.default_rng(1)
    pick = [qs[i % len(qs)] for i in range(n)]
    vecs = [embedder.embed_query(q) for q in pick]
    kws = [query_keywords(q) for q in pick]
    paths_pool = base.column("path").unique().to_pylist()
    focus = [[f"copy{int(rng2.integers(copies)):04d}/{p}" for p in rng2.choice(paths_pool, 8)] for _ in range(n)]

    def measure(label: str) -> dict:
        res = {}
        store.vector_search(vecs[0], 20); store.keyword_search(kws[0], 20)
        for key, fn in (
            ("vector", lambda i: store.vector_search(vecs[i], 20)),
            ("keyword", lambda i: store.keyword_search(kws[i], 20)),
            ("vector_focus", lambda i: store.vector_search(vecs[i], 6, focus[i])),
            ("keyword_focus", lambda i: store.keyword_search(kws[i], 6, focus[i])),
            ("hybrid_focus", lambda i: hybrid_search(store, kws[i], vecs[i], focus[i])),
        ):
            if label == "flat" and key in ("vector",) and rows > 300_000:
                n_use = 5  # a flat scan of 1M rows is ~2 s: 5 samples are enough to show it
            else:
                n_use = n
            ts = []
            for i in range(n_use):
                t = time.perf_counter(); fn(i); ts.append((time.perf_counter() - t) * 1000)
            res[key] = stats_ms(ts)
        log(f"  {label}: {json.dumps(res)}")
        return res

    flat = measure("flat")
    t0 = time.perf_counter()
    ensure_vector_index(table, rows_threshold=50_000, kind=ann)
    timings["vector_index_s"] = round(time.perf_counter() - t0, 1); log(f"  {ann} {timings['vector_index_s']} s")
    indexed = measure(ann)
    return {"rows": rows, "source": source, "copies": copies, "noise_sigma": 0.03, "ann": ann, "timings": timings,
            "disk_mb": du_mb(folder), "flat": flat, "indexed": indexed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", action="append", choices=["index", "chunkonly", "latency", "scale"])
    ap.add_argument("--repo", action="append", default=[], help="NAME-VERSION (PyPI), repeatable")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--scale-source", default="requests-2.34.2")
    ap.add_argument("--scale-rows", type=int, default=1_000_000)
    ap.add_argument("--ann", default="hnsw_sq", choices=["hnsw_sq", "ivf_pq"])
    ap.add_argument("--windows-per-s", type=float, default=None, help="for chunkonly estimates")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    parts = args.part or ["index", "latency"]
    cache = Path(args.cache).expanduser()

    embedder = settings_embedder(bench_settings())
    out_file = Path(args.out) if args.out else OUT / ("speed_scale.json" if parts == ["scale"] else "speed.json")
    doc = json.loads(out_file.read_text()) if out_file.is_file() else {}
    doc.update({"date": date.today().isoformat(), "machine": machine(), "embedder": embedder.model_id})
    if "index" in parts:
        doc.setdefault("index", {}).update(part_index(args.repo, cache, args.reuse, embedder))
    if "chunkonly" in parts:
        doc.setdefault("chunkonly", {}).update(part_chunkonly(args.repo, cache, args.windows_per_s))
    if "latency" in parts:
        doc.setdefault("latency", {}).update(part_latency(args.repo, cache, embedder, args.queries))
    if "scale" in parts:
        doc["scale"] = part_scale(args.scale_source, cache, embedder, args.scale_rows, ann=args.ann)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
