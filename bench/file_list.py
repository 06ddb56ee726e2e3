"""What the file-ranked keyword lists cost: keyword search at ``keyword_k`` against the wider
``file_keyword_pool``, the whole-file BM25 search, and the whole ``hybrid_search`` with no file
list, each one alone and both (the default), on an index the other benches built (a
repository's, or the replicated million-row table of ``bench.speed --part scale``). A table made
before the whole-file column gets it first (``IndexStore.add_file_keywords``, timed). Median and
p95 of ``--queries`` questions of the eval cases asked ``--rounds`` times, the paths interleaved,
one run.

    python -m bench.file_list --index ~/.cache/wsctx-bench/scale/requests-2.34.2-1000000 --name requests
"""
from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

from bench.common import bench_settings, settings_embedder
from bench.speed import OUT, machine, queries_for, stats_ms
from daemons.lib.keywords import query_keywords
from daemons.lib.fusion import FILE_LISTS
from daemons.lib.search import SearchParams, hybrid_search
from daemons.lib.store import IndexStore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, help="a folder holding a LanceDB 'chunks' table")
    ap.add_argument("--name", required=True, help="PyPI name whose eval questions to ask (e.g. requests)")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="times each question is asked on every path")
    ap.add_argument("--out", default=str(OUT / "file_list.json"))
    args = ap.parse_args(argv)

    settings = bench_settings()
    store = IndexStore.open_reader(Path(args.index).expanduser())
    if store is None:
        raise SystemExit(f"no table under {args.index}")
    migration_s = None
    if not store.has_file_keywords:
        t0 = time.perf_counter()
        store = IndexStore.open_writer(store.folder, store.meta)  # fills the column, then optimises
        migration_s = round(time.perf_counter() - t0, 1)
        print(f"added the whole-file column in {migration_s} s")
    embedder = settings_embedder(settings)
    qs = queries_for(args.name, args.queries)
    if not qs:
        raise SystemExit(f"no eval questions for {args.name}")
    kws = [query_keywords(q) for q in qs]
    vecs = [embedder.embed_query(q) for q in qs]
    runs = {
        f"keyword k={settings.keyword_k}": lambda i: store.keyword_search(kws[i], settings.keyword_k),
        f"keyword k={settings.file_keyword_pool}": lambda i: store.keyword_search(kws[i], settings.file_keyword_pool),
        f"whole-file k={2 * settings.keyword_k}": lambda i: store.file_keyword_search(kws[i], 2 * settings.keyword_k),
        "hybrid, four lists": lambda i: hybrid_search(store, kws[i], vecs[i], params=SearchParams(file_pool=0)),
        **{
            f"hybrid, file_list={mode}": (lambda i, mode=mode: hybrid_search(store, kws[i], vecs[i], params=SearchParams(file_pool=settings.file_keyword_pool, file_list=mode)))
            for mode in FILE_LISTS
        },
    }
    for fn in runs.values():  # warm every path once
        fn(0)
    times: dict[str, list[float]] = {label: [] for label in runs}
    # Interleaved, so page-cache warmth and machine noise fall on every path alike.
    for _ in range(args.rounds):
        for i in range(len(qs)):
            for label, fn in runs.items():
                t = time.perf_counter(); fn(i); times[label].append((time.perf_counter() - t) * 1000)
    res = {label: stats_ms(ts) for label, ts in times.items()}
    rows = store.table.count_rows()
    print(f"\n{args.index}: {rows:,} rows, {len(qs)} questions x {args.rounds} rounds, interleaved")
    print(f"{'':28s} {'median ms':>10s} {'p95 ms':>8s}")
    for label, m in res.items():
        print(f"{label:28s} {m['median']:10.1f} {m['p95']:8.1f}")
    doc = {"date": date.today().isoformat(), "machine": machine(), "index": str(args.index), "rows": rows, "whole_file_column_added_s": migration_s, "questions": len(qs), "rounds": args.rounds, "latency_ms": res}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
