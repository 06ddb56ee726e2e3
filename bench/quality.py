"""File-level retrieval quality on the outside eval cases (../shared/eval), real library path.

For each case the repository's sdist tree (bench/repos.py) is indexed once (cached under
``<cache>/indexes/NAME-VER/<model>-c<chunker>-<shape>/``) with the product's own functions, and
the question is answered five ways:

* ``bm25_file``  whole-file BM25 over the non-test ``.py`` files (bench/common.py ``WholeFileBM25``):
  the floor, as the eval README measured it
* ``keyword``    ``IndexStore.keyword_search(keyword query, 50)``  (chunk hits -> files)
* ``vector``     ``IndexStore.vector_search(query vector, 50)`` folded to chunks

  (the keyword query, query vector and cross-encoder question are the product's: ``question.plan``
  under the settings, as ``bench.common.question_queries`` makes them)
* ``unweighted`` ``hybrid_search`` with tests and docs weighed like source and no file-ranked
  keyword list (``file_pool=0``), top 12: fusion of the four lists as SPEC §2 states it
* ``no_file_list`` the product's fusion without the file-ranked keyword lists (role weights on)
* ``no_mentions`` the product's fusion without the list of files the question names (``mentions``)
* ``fused``      ``hybrid_search`` with the product's settings (20 + 20 + the file-ranked keyword
  lists: the 100 best chunks ranked by file and the whole-file BM25 list, as ``file_list``
  says; RRF k=30, role weights, top 12, or 16 for a long question without a traceback): so its
  recall@10 is over the chunk list the product reranks; no focus files (none in the cases). ``--set file_list=chunks`` measures
  either file list alone
* ``cross_encoder`` the fused candidates rescored by the cross-encoder (passage ``f"{path}\\n{text}"``),
  ordered by probability times role weight alone (SPEC §2 as written)
* ``reranked``   the product's final order: fused rank and cross-encoder rank blended by
  ``pipeline.final_files`` (k and weight from the settings), as the front orders its blocks
  (no threshold cut, so recall is comparable)

Metrics per case set and per repository: recall@1/5/10, acc@1/3/5, MRR at file level (a chunk
counts for its file at its first occurrence). With the reranker, a second table says what the
threshold (``rerank_threshold``, ``--set`` changes it) leaves in the answer: chunks kept, the share
of them from a gold file, the gold files among the kept chunks' files, and empty answers. A case is skipped, with the reason, when its sdist
cannot be had or a gold file is missing from it. Per-case rankings are cached in
``<cache>/caseruns/`` so a rerun (e.g. with the reranker) only computes what is missing.

    python -m bench.quality --cases commits --limit 20
    python -m bench.quality --cases swebench --repo psf/requests
    python -m bench.quality --cases all --no-rerank
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import replace
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

from bench.common import (
    EmbedCache, apply_overrides, WholeFileBM25, bench_settings, index_key, is_test_file, open_or_build, question_kind, question_queries,
    robustness, robustness_table, settings_embedder, workspace_files, write_result,
)
from daemons.lib.config import RANKINGS, TUNED, with_overrides
from daemons.lib.metrics import METRIC_NAMES, file_metrics, files_in_order, mean_metrics
from bench.validation import LONG_LIMIT, SUFFIXES, traceback_cases, validation_cases, validation_tree, vendored_cases
from bench.repos import CASE_FILES, DEFAULT_CACHE, PYPI_NAMES, load_cases, resolve_gold, tree_for_case
from daemons.lib.fusion import fold_windows
from daemons.lib.pipeline import blend, final_files
from daemons.lib import fusion, roles, search
from daemons.lib import mentions as mentions_mod, question as question_mod, subjects as subjects_mod
from daemons.lib.search import hybrid_search, question_params
from models.cross_encoder import rerank_passage

METHODS = ["bm25_file", "keyword", "vector", "unweighted", "no_file_list", "no_mentions", "fused", "cross_encoder", "reranked"]
#: The file-role multipliers (``roles.role_weights``), in one place for this key and ``bench.tune``'s.
ROLE_WEIGHT_SETTINGS = ("test_weight", "doc_weight", "config_weight", "vendored_weight")
SEARCH_SETTINGS = ("vector_k", "keyword_k", "rerank_top", "rerank_top_long", "rrf_k", *ROLE_WEIGHT_SETTINGS, "question_copy_weight",
                   "file_keyword_pool", "file_list",
                   "path_mentions", "test_subjects", "question_analysis", "keyword_max_terms", "dense_query", "dense_windows", "rerank_query_chars",
                   *(f"list_weight_{name}" for name in fusion.LIST_WEIGHTS),
                   *(f"list_weight_{name}{fusion.TRACEBACK}" for name in fusion.TRACEBACK_LIST_WEIGHTS))
#: Settings of the final order only: derived from the cached probabilities, so not in the cache key.
ORDER_SETTINGS = ("rerank_fusion_k", "rerank_fusion_weight", "rerank_fusion_k_long", "rerank_fusion_weight_long", "rerank_threshold")
OUT = Path(__file__).resolve().parent / "results" / "quality.json"


def reranker_note(reranker: Any) -> str:
    """The cross-encoder as the case runs name it: version and model file digest (the version
    alone may name two candidates)."""
    sha = (reranker.manifest.get("sha256") or {}).get(reranker.manifest.get("model_file", "model.int8.onnx"), "")
    return f"{reranker.model_id} (model sha256 {sha[:12]})"


def ranking_code_digest() -> str:
    """A digest of the role, search, fusion, mention, test-subject and question code: any edit to them changes
    the rankings a cache holds, so it names the cache (here and in ``bench.tune``)."""
    return hashlib.sha1(b"".join(Path(m.__file__).read_bytes() for m in (roles, search, fusion, mentions_mod, question_mod, subjects_mod))).hexdigest()[:10]


def search_key(settings: Any, rerank_note: str) -> str:
    """The case runs' folder name under an index: the search settings, the cross-encoder and the
    ranking code (``ranking_code_digest``) all change the cached rankings."""
    return "s" + hashlib.sha1(json.dumps([{k: getattr(settings, k) for k in SEARCH_SETTINGS}, rerank_note, ranking_code_digest()]).encode()).hexdigest()[:10]


def caserun_file(runs: Path, case: dict) -> Path:
    """One case's cached rankings in the folder *runs*."""
    return runs / (hashlib.sha1((case["set"] + case["id"]).encode()).hexdigest()[:16] + ".json")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def table(title: str, rows: list[tuple[str, int, dict[str, dict[str, float]]]]) -> str:
    lines = [f"\n{title}", f"{'':28s} {'n':>4s} {'method':10s} " + " ".join(f"{m:>9s}" for m in METRIC_NAMES)]
    for label, n, per_method in rows:
        for meth in METHODS:
            m = per_method.get(meth)
            if not m:
                continue
            lines.append(f"{label:28s} {n:4d} {meth:10s} " + " ".join(f"{m[k]:9.1f}" for k in METRIC_NAMES))
    return "\n".join(lines)


def reranked_orders(ranked: dict, settings, long: bool = False) -> tuple[list[str], list[str]]:
    """(cross-encoder order, product order) of the fused chunks' paths from their cached
    probabilities; the product's blend is a long question's when *long* (``pipeline.blend``)."""
    paths, probs, weights = ranked["fused_chunks"], ranked["fused_probs"], ranked["fused_weights"]
    weighted = [p * w for p, w in zip(probs, weights)]
    by_prob = sorted(range(len(paths)), key=lambda i: (-weighted[i], i))
    return files_in_order([paths[i] for i in by_prob]), final_files(paths, weighted, *blend(settings, long))


def kept_at_threshold(ranked: dict, gold: list[str], threshold: float) -> dict[str, float]:
    """What the threshold leaves in the answer of one case, from its cached probabilities: the
    chunks kept (probability at or above *threshold*; named files, which the front keeps whatever
    their probability, are not told apart here), the share of them from a gold file, whether every
    gold file is among the kept chunks' files, and whether the answer is empty."""
    kept = [path for path, p in zip(ranked["fused_chunks"], ranked["fused_probs"]) if p >= threshold]
    files = set(kept)
    return {"kept": float(len(kept)), "kept_gold_share": 100.0 * sum(p in gold for p in kept) / len(kept) if kept else 0.0,
            "answer_recall": 100.0 * sum(g in files for g in gold) / len(gold) if gold else 0.0,
            "empty": 100.0 * (not kept)}


def kept_table(rows: list[tuple[str, int, dict[str, float]]], threshold: float) -> str:
    """``kept_at_threshold`` means, one line per repository and the total."""
    lines = [f"{'kept at threshold ' + str(threshold):28s} {'n':>4s} {'chunks kept':>11s} {'gold share':>10s} {'answer recall':>13s} {'empty':>6s}"]
    for label, n, m in rows:
        lines.append(f"{label:28s} {n:4d} {m['kept']:11.2f} {m['kept_gold_share']:10.1f} {m['answer_recall']:13.1f} {m['empty']:6.1f}")
    return "\n".join(lines)


def select_cases(which: str, cache: Path, repos: list[str] | None = None, tags: list[str] | None = None, limit: int = 0,
                 skip_repos: list[str] = ()) -> tuple[dict[tuple[str, str], list[tuple[dict, Path]]], list[dict]]:
    """The cases of *which* (an eval case file, ``all`` or ``validation``) that can run, grouped by
    tree ``(name, version)`` so each index is opened once (each case gains ``gold_resolved``), and
    the skipped ones with their reasons."""
    if which == "validation":
        cases = validation_cases()
    elif which == "validation-long":
        cases = validation_cases(LONG_LIMIT, long_only=True)
    elif which == "validation-vendored":
        cases = vendored_cases()
    elif which == "validation-traceback":
        cases = traceback_cases()
    else:
        cases = load_cases(which)
    if repos:
        cases = [c for c in cases if c["repo"] in repos or PYPI_NAMES.get(c["repo"]) in repos]
    if tags:
        cases = [c for c in cases if c.get("nearest_tag") in tags]
    if limit:
        per_set: dict[str, int] = defaultdict(int)
        kept = []
        for c in cases:
            if per_set[c["set"]] < limit:
                per_set[c["set"]] += 1
                kept.append(c)
        cases = kept
    skipped: list[dict] = []
    groups: dict[tuple[str, str], list[tuple[dict, Path]]] = defaultdict(list)
    for c in cases:
        if c["repo"] in skip_repos or PYPI_NAMES.get(c["repo"]) in skip_repos:
            skipped.append({"id": c["id"], "set": c["set"], "repo": c["repo"], "reason": "repository left out of this run (--skip-repo)"})
            continue
        if c["set"].startswith("validation"):
            tree, name, info = validation_tree(c["repo"], c["commit"], cache), c["repo"].split("/")[1], c["commit"][:12]
        else:
            tree, name, info = tree_for_case(c, cache)
        if tree is None:
            skipped.append({"id": c["id"], "set": c["set"], "repo": c["repo"], "reason": info})
            continue
        gold = [resolve_gold(tree, g) for g in c["gold_files"]]
        missing = [g for g, r in zip(c["gold_files"], gold) if r is None]
        if missing:
            skipped.append({"id": c["id"], "set": c["set"], "repo": c["repo"], "reason": f"gold file not in sdist {name}-{info}: {', '.join(missing)}"})
            continue
        c["gold_resolved"] = gold
        groups[(name, info)].append((c, tree))
    return groups, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="commits", choices=[*CASE_FILES, "all", "validation", "validation-long", "validation-vendored", "validation-traceback"],
                    help="an eval case file, all of them, or the validation cases (bench/validation.py) that settings are chosen on")
    ap.add_argument("--repo", action="append", help="owner/name or PyPI name; repeatable")
    ap.add_argument("--skip-repo", action="append", default=[], help="leave this repository out (reported)")
    ap.add_argument("--tag", action="append", help="only cases whose nearest_tag is this (e.g. v3.3.1); repeatable")
    ap.add_argument("--limit", type=int, default=0, help="at most N cases per case set (after --repo)")
    ap.add_argument("--embedder", default=None, help="embedding model artifact name (default: the product's setting)")
    ap.add_argument("--ranking", choices=RANKINGS, default=TUNED,
                    help="the ranking preset, applied before --set: spec measures the product with `ranking = \"spec\"` (SPEC §2 exactly)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a search or final-order setting (e.g. file_list=chunks); repeatable")
    ap.add_argument("--no-rerank", action="store_true")
    ap.add_argument("--reranker-dir", default=None)
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    cache = Path(args.cache).expanduser()

    settings = with_overrides(bench_settings(), {"ranking": args.ranking})
    if args.embedder:
        settings.embedder_model = args.embedder
    problem = apply_overrides(settings, args.set, (*SEARCH_SETTINGS, *ORDER_SETTINGS))
    if problem:
        ap.error(problem)
    embedder = settings_embedder(settings)
    emb_cache = EmbedCache(cache / "embcache", embedder.model_id, embedder.dim)
    reranker, rerank_note = None, ""
    if not args.no_rerank:
        try:
            from models.cross_encoder import load_cross_encoder

            reranker = load_cross_encoder(args.reranker_dir, threads=2)
            rerank_note = reranker_note(reranker)
        except Exception as e:  # noqa: BLE001 - ModelUnavailable, ImportError ...
            rerank_note = f"unavailable: {e}"
            log(f"reranker {rerank_note}")
    else:
        rerank_note = "not run (--no-rerank)"

    # the cached rankings depend on the search settings, the role, search and fusion code and the
    # reranker's file, so all of them name the folder
    search_settings = {k: getattr(settings, k) for k in SEARCH_SETTINGS}
    key = search_key(settings, rerank_note)
    groups, skipped = select_cases(args.cases, cache, repos=args.repo, tags=args.tag, limit=args.limit, skip_repos=args.skip_repo)
    results: list[dict] = []

    t_start = time.perf_counter()
    for (name, version), items in groups.items():
        tree = items[0][1]
        store, build = open_or_build(tree, cache, name, version, settings, embedder, emb_cache, log)
        files, _ = workspace_files(tree, settings)
        indexed = {rel for rel, _ in files}
        bm25 = WholeFileBM25(files, suffixes=SUFFIXES.get(items[0][0].get("language", "python"), (".py",)))
        runs = cache / "caseruns" / index_key(name, version, embedder.model_id, settings) / key
        runs.mkdir(parents=True, exist_ok=True)
        log(f"  {name}-{version}: {len(items)} cases")
        for c, _ in items:
            f = caserun_file(runs, c)
            ranked: dict[str, list[str]] = json.loads(f.read_text()) if f.is_file() else {}
            q = c["query"]
            changed = False
            ranked["bm25_file"] = bm25.search(q, 50)  # cheap: always recomputed, never stale
            if not {"keyword", "vector", "unweighted", "no_file_list", "no_mentions", "fused"} <= ranked.keys() or (reranker is not None and "fused_probs" not in ranked):
                plan, kw, vec, _ = question_queries(q, settings, embedder, store)
                ranked["keyword"] = files_in_order(store.keyword_search(kw, 50))
                ranked["vector"] = files_in_order(fold_windows(search._vector_search(store, vec, 50), limit=50))
                product = question_params(settings, plan)
                # the ablations: no list weights, copy weight or named files unless they say so
                bare = replace(product, mentioned=(), test_subjects=False, list_weights=None, copy_weight=1.0)
                # SPEC §2's four lists, and its 12 candidates whatever the question's length
                ranked["unweighted"] = files_in_order(hybrid_search(store, kw, vec, None, replace(bare, file_pool=0, role_weights=None,
                                                                                                   top_n=settings.rerank_top)).candidates)
                ranked["no_file_list"] = files_in_order(hybrid_search(store, kw, vec, None, replace(bare, file_pool=0)).candidates)
                ranked["no_mentions"] = files_in_order(hybrid_search(store, kw, vec, None, bare).candidates)
                res = hybrid_search(store, kw, vec, None, product)
                ranked["fused"] = files_in_order(res.candidates)
                if reranker is not None:
                    cands = res.candidates
                    probs = reranker.score(plan.rerank_query, [rerank_passage(r["path"], r["text"]) for r in cands]) if cands else []
                    ranked["fused_chunks"] = [r["path"] for r in cands]  # one path per chunk, in fused order
                    ranked["fused_probs"] = [round(p, 4) for p in probs]
                    ranked["fused_weights"] = [r["weight"] for r in cands]
                ranked.pop("reranked", None)  # derived below; older caches stored it
                ranked.pop("reranked_probs", None)
                changed = True
            # as the front tells them apart: by the question's analysis, when analysis is on
            long = question_kind(q, settings).long
            if "fused_probs" in ranked:
                ranked["cross_encoder"], ranked["reranked"] = reranked_orders(ranked, settings, long)
            if changed:
                f.write_text(json.dumps({k: v for k, v in ranked.items() if k not in ("cross_encoder", "reranked")}))
            gold = c["gold_resolved"]
            results.append({
                "id": c["id"], "set": c["set"], "repo": c["repo"], "pypi": f"{name}-{version}", "gold": gold, "long": long,
                "gold_not_indexed": [g for g in gold if g not in indexed],
                "gold_is_test": [g for g in gold if is_test_file(g)],
                "metrics": {m: file_metrics(ranked[m], gold) for m in METHODS if m in ranked},
                "first_gold_rank": {m: next((i + 1 for i, p in enumerate(ranked[m]) if p in gold), None) for m in METHODS if m in ranked},
                **({"kept": kept_at_threshold(ranked, gold, settings.rerank_threshold)} if "fused_probs" in ranked else {}),
            })
        log(f"  done {name}-{version} ({time.perf_counter() - t_start:.0f} s so far)")

    # ---------------------------------------------------------------- aggregate
    summary: dict[str, dict] = {}
    out_tables = []
    for cs in sorted({r["set"] for r in results} | {s["set"] for s in skipped}):
        rs = [r for r in results if r["set"] == cs]
        sk = [s for s in skipped if s["set"] == cs]
        per_repo = {}
        rows = []
        for repo in sorted({r["repo"] for r in rs}):
            rr = [r for r in rs if r["repo"] == repo]
            per_repo[repo] = {"n": len(rr), **{m: mean_metrics([r["metrics"][m] for r in rr if m in r["metrics"]]) for m in METHODS}}
            rows.append((repo, len(rr), per_repo[repo]))
        total = {"n": len(rs), **{m: mean_metrics([r["metrics"][m] for r in rs if m in r["metrics"]]) for m in METHODS}}
        rows.append(("ALL", len(rs), total))
        reasons: dict[str, int] = defaultdict(int)
        for s in sk:
            reasons[s["reason"].split(":")[0]] += 1
        rob = robustness(per_repo, METHODS)
        summary[cs] = {"cases_run": len(rs), "cases_skipped": len(sk), "skip_reasons": dict(reasons), "all": total, "per_repo": per_repo,
                       "robustness": rob, "gold_not_indexed_cases": sum(1 for r in rs if r["gold_not_indexed"])}
        out_tables.append(table(f"== {cs}: {len(rs)} cases run, {len(sk)} skipped {dict(reasons)}", rows))
        out_tables.append(f"\n{cs}: across repositories with 5 or more cases\n" + robustness_table(rob))
        kept_rows = []
        for label in [*per_repo, "ALL"]:
            kr = [r["kept"] for r in rs if "kept" in r and (label == "ALL" or r["repo"] == label)]
            if kr:
                kept_rows.append((label, len(kr), {k: float(sum(x[k] for x in kr) / len(kr)) for k in kr[0]}))
        if kept_rows:
            summary[cs]["kept"] = {label: m for label, _, m in kept_rows}
            out_tables.append("\n" + kept_table(kept_rows, settings.rerank_threshold))
    print("\n".join(out_tables))
    print(f"\nreranker: {rerank_note}")
    doc = {
        "date": date.today().isoformat(), "embedder": embedder.model_id, "reranker": rerank_note,
        "settings": {**search_settings, **{k: getattr(settings, k) for k in ORDER_SETTINGS}}, "search_key": key,
        "args": {k: v for k, v in vars(args).items() if k != "cache"},
        "summary": summary, "skipped": skipped, "cases": results,
    }
    write_result(args.out, doc, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
