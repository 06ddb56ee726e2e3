"""Choose the fusion settings on validation cases: each list's weight, the RRF constant, and the
blend of fused and cross-encoder order (issue 19). Prints the validation table; writes JSON.

Every case's lists are computed once with the product's ``hybrid_search`` at the product's list
lengths, every candidate kept with its rank in each list and its role weight (cached under
``<cache>/tune/``). A setting is then scored by fusing those lists again with
``fusion.weighted_fuse``, the product's own fusion, so the figure is what the product would
answer with that setting. The cross-encoder scores each top-12 chunk once (cached too).

The objective is the mean over repositories of each repository's MRR (each repository counts
once), and a setting must not put any repository below its own vector or keyword list alone
(``floor``). Settings are chosen on ``--cases validation`` (bench/validation.py); ``--cases
commits`` or ``swebench`` only *report* the chosen settings next to the shipped ones.

    python -m bench.tune                                  # choose on validation, no cross-encoder
    python -m bench.tune --rerank                         # also the blend, with the cross-encoder
    python -m bench.tune --cases commits --rerank --report bench/results/tune_validation.json
    python -m bench.tune --cases validation-traceback --rerank --lists-for traceback --grid file_keyword=0,0.25,1 ...
                                                          # the file lists' votes for traceback questions only
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from dataclasses import replace
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    EmbedCache, apply_overrides, bench_settings, index_key, open_or_build, question_kind, question_queries, settings_embedder, write_result,
)
from daemons.lib.metrics import METRIC_NAMES, file_metrics, files_in_order, mean_metrics
from bench.quality import ROLE_WEIGHT_SETTINGS, ranking_code_digest, reranker_note, select_cases
from daemons.lib import pipeline
from bench.repos import DEFAULT_CACHE
from daemons.lib import fusion
from daemons.lib.fusion import FILE_BM25, FILE_KEYWORD, KEYWORD, MENTIONED, TESTED, TRACEBACK, TRACEBACK_LIST_WEIGHTS, VECTOR, kind_weights, weighted_fuse
from daemons.lib.roles import file_role
from daemons.lib.search import hybrid_search, question_params
from models.cross_encoder import rerank_passage

OUT = Path(__file__).resolve().parent / "results" / "tune.json"
#: The grid: each list's weight, and the RRF constant.
GRID: dict[str, tuple[float, ...]] = {
    VECTOR: (0.5, 1.0, 1.5, 2.0, 3.0),
    KEYWORD: (0.0, 0.5, 1.0),
    FILE_KEYWORD: (0.0, 0.5, 1.0, 2.0),
    FILE_BM25: (0.0, 0.5, 1.0, 2.0),
    MENTIONED: (0.5, 1.0, 2.0),
    TESTED: (fusion.LIST_WEIGHTS[TESTED],),  # the list is off unless --set test_subjects=true
    "rrf_k": (10, 30, 60),
}
#: Stage 2: test, doc and config multipliers tried on the best ROLE_FINALISTS list settings.
ROLE_GRID: dict[str, tuple[float, ...]] = {"test": (0.1, 0.25, 0.5, 1.0), "doc": (0.1, 0.25, 0.5, 1.0), "config": (0.25, 0.5, 1.0)}
ROLE_FINALISTS = 10
#: Settings a run can be given (``--set``); the first six (the question's and the lists') and the role weights name the cache.
SETTINGS = ("question_analysis", "keyword_max_terms", "dense_query", "dense_windows", "rerank_query_chars", "test_subjects", "rrf_k", "file_keyword_pool", "test_weight",
            "doc_weight", "config_weight", "rerank_fusion_k", "rerank_fusion_weight", "rerank_fusion_k_long", "rerank_fusion_weight_long", "rerank_top", "rerank_top_long",
            *(f"list_weight_{name}" for name in fusion.LIST_WEIGHTS), *(f"list_weight_{name}{TRACEBACK}" for name in TRACEBACK_LIST_WEIGHTS))
#: Whose probabilities the case files held before they were kept per cross-encoder.
LEGACY_PROBS = "wsctx-minilm-l6-code-ce@2 (model sha256 f1b2a5354dc1)"
BLEND_K = (0, 5, 10, 30, 60)
#: ``--blend-for``: which questions a blend grid point applies to (``pipeline.blend`` tells long from short).
BLEND_FOR = ("all", "long", "short")
#: ``--lists-for``: which questions a grid point's file-ranked list votes apply to (``all``: every
#: question, a traceback question too; ``traceback``: only those quoting one, as their
#: ``list_weight_<name>_traceback``, the others keeping the settings').
LISTS_FOR = ("all", "traceback")
BLEND_WEIGHT = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 100.0)
#: A grid of at most this many points is also tabled point by point at the shipped blends.
GRID_TABLE = 64


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def case_lists(store: Any, embedder: Any, q: str, settings: Any) -> dict[str, Any]:
    """Every list of the question with every candidate: ``lists`` (chunk ids by list, in rank
    order), ``paths``, ``texts`` and ``roles`` (each chunk's role weight for this question)."""
    plan, kw, vec, _ = question_queries(q, settings, embedder, store)
    # every candidate, unweighted by list (the tuner weighs the lists itself)
    res = hybrid_search(store, kw, vec, None, replace(question_params(settings, plan), top_n=10**6, list_weights=None, copy_weight=1.0))
    rows = {r["chunk_id"]: r for r in res.candidates}
    return {"rerank_query": plan.rerank_query, "lists": res.lists, "paths": {c: r["path"] for c, r in rows.items()}, "texts": {c: r["text"] for c, r in rows.items()},
            "roles": {c: r["weight"] for c, r in rows.items()}, "probs": {}}


def load_lists(which: str, settings: Any, embedder: Any, cache: Path, rerank_id: str, repos: list[str] | None = None,
               tags: list[str] | None = None) -> tuple[list[dict], dict[str, dict[str, Any]], dict[str, Path], list[dict]]:
    """The cases of *which* that can run (each gains ``key``), each case's cached lists by key
    (``case_lists``, computed and cached under ``<cache>/tune/`` when missing; ``kinds`` and this
    cross-encoder's ``probs`` added), the file each is cached in, and the skipped cases."""
    emb_cache = EmbedCache(cache / "embcache", embedder.model_id, embedder.dim)
    code = ranking_code_digest()
    key = hashlib.sha1(json.dumps([{k: getattr(settings, k) for k in ("vector_k", "keyword_k", "rrf_k", *ROLE_WEIGHT_SETTINGS,
                                    "file_keyword_pool", "file_list", "path_mentions", "test_subjects",
                                    *SETTINGS[:6])}, code]).encode()).hexdigest()[:10]
    groups, skipped = select_cases(which, cache, repos=repos, tags=tags)
    cases: list[dict] = []
    datas: dict[str, dict[str, Any]] = {}
    files: dict[str, Path] = {}
    t0 = time.perf_counter()
    for (name, version), items in groups.items():
        store, _ = open_or_build(items[0][1], cache, name, version, settings, embedder, emb_cache, log)
        folder = cache / "tune" / index_key(name, version, embedder.model_id, settings) / key
        folder.mkdir(parents=True, exist_ok=True)
        for c, _ in items:
            cid = c["set"] + ":" + c["id"]
            f = folder / (hashlib.sha1(cid.encode()).hexdigest()[:16] + ".json")
            if f.is_file():
                data = json.loads(f.read_text())
            else:
                data = case_lists(store, embedder, c["query"], settings)
                data["probs_by_model"] = earlier_probs(folder, f.name, data["rerank_query"])
                f.write_text(json.dumps(data))
            data["kinds"] = {x: file_role(data["paths"][x]) for x, w in data["roles"].items() if w < 1.0}
            # probabilities are kept per cross-encoder; those written before were the shipped version 2's
            by_model = data.setdefault("probs_by_model", {})
            if data.get("probs") and not by_model:
                by_model[LEGACY_PROBS] = data["probs"]
            data["probs"] = by_model.setdefault(rerank_id, {})
            datas[cid], files[cid] = data, f
            c["key"] = cid
            cases.append(c)
        log(f"  {name}-{version}: {len(items)} cases ({time.perf_counter() - t0:.0f} s so far)")
    return cases, datas, files, skipped


def earlier_probs(folder: Path, name: str, rerank_query: str) -> dict[str, dict[str, float]]:
    """The cross-encoder probabilities a case's file *name* holds in the other cache folders of
    its index (*folder*'s siblings: other settings or ranking code), where they were scored for the
    same *rerank_query*. A chunk id names the same text within one index, so a probability
    carries over; each model's are merged, the newest folder's last."""
    out: dict[str, dict[str, float]] = {}
    for other in sorted(folder.parent.glob(f"*/{name}"), key=lambda p: p.stat().st_mtime):
        if other.parent == folder:
            continue
        try:
            data = json.loads(other.read_text())
        except (OSError, ValueError):
            continue
        if data.get("rerank_query") == rerank_query:
            for model, probs in data.get("probs_by_model", {}).items():
                out.setdefault(model, {}).update(probs)
    return out


def score_missing(cases: list[dict], datas: dict[str, dict[str, Any]], files: dict[str, Path], reranker: Any,
                  tops: Any) -> int:
    """Score with *reranker* every chunk of ``tops(case)`` that has no probability yet, keep the
    probabilities in the case's cache file, and return how many were scored."""
    scored = 0
    for c in cases:
        data = datas[c["key"]]
        need = sorted(set(tops(c)) - data["probs"].keys())
        if need:
            probs = reranker.score(data["rerank_query"], [rerank_passage(data["paths"][x], data["texts"][x]) for x in need])
            data["probs"].update({x: round(float(p), 5) for x, p in zip(need, probs)})
            files[c["key"]].write_text(json.dumps(data))
            scored += len(need)
    return scored


def shipped_weights(settings: Any) -> dict[str, float]:
    """The settings' list weights (a traceback question's ``<name>_traceback`` ones too) and
    ``test``/``doc``/``config`` role multipliers, in the one dict ``fused_top`` and ``final_files`` take."""
    return {**settings.kind_list_weights(), "test": settings.test_weight, "doc": settings.doc_weight, "config": settings.config_weight}


def role_weight_of(data: dict[str, Any], weights: dict[str, float]):
    """Each chunk's role multiplier under *weights*: a test, doc or config chunk the question did
    not ask for takes the setting's ``test``/``doc``/``config`` value, else the shipped one."""
    roles_, kinds = data["roles"], data["kinds"]

    def role_weight(cid: str) -> float:
        return weights.get(kinds[cid], roles_[cid]) if cid in kinds else roles_[cid]

    return role_weight


def fused_top(data: dict[str, Any], weights: dict[str, float], rrf_k: int, top_n: int = fusion.RERANK_TOP, traceback: bool = False) -> list[str]:
    """The product's fused top *top_n* chunk ids under list *weights* and *rrf_k*, for a question
    quoting a traceback (*traceback*: its ``<name>_traceback`` votes, ``fusion.kind_weights``) or
    not; *weights* may also hold ``test``, ``doc`` and ``config`` role multipliers (else the
    shipped ones apply)."""
    return [f.id for f, _, _ in weighted_fuse(data["lists"], role_weight_of(data, weights), rrf_k, kind_weights(weights, traceback))[:top_n]]


def final_files(data: dict[str, Any], top: list[str], weights: dict[str, float], k: int, weight: float) -> list[str]:
    """The product's final file order of *top* (fused order) blended with the cross-encoder, each
    probability times the chunk's role multiplier under *weights*, as the front weighs it."""
    role_weight = role_weight_of(data, weights)
    return pipeline.final_files([data["paths"][c] for c in top], [data["probs"][c] * role_weight(c) for c in top], k, weight)


def score(cases: list[dict], files_of) -> dict[str, Any]:
    """Metrics per repository and their mean over repositories, for ranked files ``files_of(case)``."""
    per: dict[str, list[dict[str, float]]] = defaultdict(list)
    for c in cases:
        per[c["repo"]].append(file_metrics(files_of(c), c["gold_resolved"]))
    per_repo = {r: mean_metrics(ms) for r, ms in per.items()}
    return {"per_repo": per_repo, "repo_mean": {m: round(float(np.mean([v[m] for v in per_repo.values()])), 2) for m in METRIC_NAMES},
            "case_mean": mean_metrics([m for ms in per.values() for m in ms])}


def grid_with(items: list[str]) -> dict[str, tuple[float, ...]]:
    """``GRID`` with each ``NAME=V1,V2`` item's values in place of its own (``rrf_k``'s as integers).
    Raises ValueError naming an unknown setting or a value that is not a number."""
    grid = dict(GRID)
    for item in items:
        name, _, values = item.partition("=")
        if name not in grid:
            raise ValueError(f"--grid {item!r}: {name!r} is not one of {', '.join(GRID)}")
        try:
            grid[name] = tuple(int(v) if name == "rrf_k" else float(v) for v in values.split(","))
        except ValueError:
            raise ValueError(f"--grid {item!r}: the values must be numbers separated by commas") from None
    return grid


def config_name(weights: dict[str, float], rrf_k: int) -> str:
    return " ".join(f"{k}={v:g}" for k, v in weights.items()) + f" rrf_k={rrf_k}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="validation", help="validation (choose), or an eval case set (report only)")
    ap.add_argument("--rerank", action="store_true", help="score with the cross-encoder and choose the blend")
    ap.add_argument("--finalists", type=int, default=8, help="fusion settings, best first, that go on to the blend grid")
    ap.add_argument("--report", help="a tune JSON from a validation run: report its chosen settings on --cases instead of choosing")
    ap.add_argument("--repo", action="append", help="only this repository's cases (owner/name or PyPI name); repeatable")
    ap.add_argument("--tag", action="append", help="only cases whose nearest_tag is this; repeatable")
    ap.add_argument("--embedder", default=None)
    ap.add_argument("--reranker-dir", default=None, help="a cross-encoder artifact folder (default: the shipped one)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help=f"one of {', '.join(SETTINGS)}; repeatable")
    ap.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                    help=f"the values tried for one of {', '.join(GRID)} instead of GRID's; repeatable")
    ap.add_argument("--blend-for", choices=BLEND_FOR, default="all",
                    help="the questions a blend grid point applies to; the others keep the shipped blend of their kind (pipeline.blend)")
    ap.add_argument("--lists-for", choices=LISTS_FOR, default="all",
                    help="the questions a grid point's file_keyword and file_bm25 votes apply to: every question, or only "
                         "those quoting a traceback (their list_weight_<name>_traceback; the others keep the settings')")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        grid = grid_with(args.grid)
    except ValueError as e:
        ap.error(str(e))
    cache = Path(args.cache).expanduser()
    out = Path(args.out or (OUT.with_name(f"tune_{args.cases}.json")))

    settings = bench_settings()
    if args.embedder:
        settings.embedder_model = args.embedder
    problem = apply_overrides(settings, args.set, SETTINGS)
    if problem:
        ap.error(problem)
    embedder = settings_embedder(settings)
    reranker, rerank_id = None, ""
    if args.rerank:
        from models.cross_encoder import load_cross_encoder

        reranker = load_cross_encoder(args.reranker_dir, threads=2)
        rerank_id = reranker_note(reranker)
    cases, datas, files, skipped = load_lists(args.cases, settings, embedder, cache, rerank_id, repos=args.repo, tags=args.tag)
    asked = {c["key"]: question_kind(c["query"], settings) for c in cases}
    long = {key: kind.long for key, kind in asked.items()}

    def top_of(c: dict, w: dict[str, float], k: int) -> list[str]:
        """Case *c*'s fused top under list weights *w* and RRF constant *k*, with its kind's votes and length."""
        kind = asked[c["key"]]
        return fused_top(datas[c["key"]], w, k, top_n=settings.rerank_top_for(kind.long, kind.traceback), traceback=kind.traceback)

    def blend_of(c: dict, point: tuple[int, float] | None) -> tuple[int, float]:
        """The blend case *c* gets: the grid *point* where ``--blend-for`` takes in its kind, else
        the shipped blend of its kind (also when *point* is None)."""
        if point is not None and args.blend_for in ("all", "long" if long[c["key"]] else "short"):
            return point
        return pipeline.blend(settings, long[c["key"]])

    # the product's defaults (or --set): list weights, role multipliers and RRF constant
    shipped = (shipped_weights(settings), settings.rrf_k)

    def grid_point(w: dict[str, float]) -> dict[str, float]:
        """A grid point's list votes with its traceback votes: the grid's file-list votes for every
        question, or (``--lists-for traceback``) for traceback questions only."""
        file_lists = {name: w[name] for name in TRACEBACK_LIST_WEIGHTS}
        if args.lists_for == "traceback":
            return {**w, **{name: shipped[0][name] for name in file_lists}, **{name + TRACEBACK: v for name, v in file_lists.items()}}
        return {**w, **{name + TRACEBACK: v for name, v in file_lists.items()}}

    if args.report:
        given = json.loads(Path(args.report).read_text())["chosen"]
        configs = [shipped, (given["list_weights"], given["rrf_k"])]
        # report mode measures exactly the two settings: nothing is chosen on these cases
        report_blends = {0: None,  # the shipped blend of each question's kind
                         1: (given.get("rerank_fusion_k", settings.rerank_fusion_k), given.get("rerank_fusion_weight", settings.rerank_fusion_weight))}
    else:
        # each grid point: the list weights, and the RRF constant (GRID's last key)
        configs = [(grid_point(dict(zip(list(grid)[:-1], combo[:-1]))), combo[-1]) for combo in itertools.product(*grid.values())]
        if shipped not in configs:
            configs.append(shipped)
    alone = {lst: score(cases, lambda c, lst=lst: files_in_order([datas[c["key"]]["paths"][x] for x in datas[c["key"]]["lists"].get(lst, [])]))
             for lst in (VECTOR, KEYWORD)}
    floor = {r: max(alone[VECTOR]["per_repo"][r]["mrr"], alone[KEYWORD]["per_repo"][r]["mrr"]) for r in alone[VECTOR]["per_repo"]}

    def fused_score(cfg):
        w, k = cfg
        return score(cases, lambda c: files_in_order([datas[c["key"]]["paths"][x] for x in top_of(c, w, k)]))

    log(f"scoring {len(configs)} fusion settings on {len(cases)} cases")
    fused = [(cfg, fused_score(cfg)) for cfg in configs]
    fused.sort(key=lambda t: -t[1]["repo_mean"]["mrr"])
    if not args.report:
        # stage 2: the role multipliers, on the best list settings
        more = []
        for (w, k), _ in fused[:ROLE_FINALISTS]:
            for combo in itertools.product(*ROLE_GRID.values()):
                roles_w = dict(zip(ROLE_GRID, combo))
                if roles_w != {"test": settings.test_weight, "doc": settings.doc_weight, "config": settings.config_weight}:
                    cfg = ({**w, **roles_w}, k)
                    more.append((cfg, fused_score(cfg)))
        fused += more
        fused.sort(key=lambda t: -t[1]["repo_mean"]["mrr"])
    shipped_fused = next(s for cfg, s in fused if cfg == shipped)

    def below_floor(s: dict[str, Any]) -> list[str]:
        return [r for r, v in s["per_repo"].items() if v["mrr"] < floor[r]]

    lines = [f"\n== {args.cases}: {len(cases)} cases, {len(floor)} repositories, {len(skipped)} skipped; objective: repository-mean MRR",
             f"{'setting':64s} {'r@1':>6s} {'r@5':>6s} {'r@10':>6s} {'MRR':>6s}  below own best list"]

    def row(label: str, s: dict[str, Any]) -> str:
        m = s["repo_mean"]
        return f"{label:64s} {m['recall@1']:6.1f} {m['recall@5']:6.1f} {m['recall@10']:6.1f} {m['mrr']:6.1f}  {','.join(below_floor(s)) or '-'}"

    for lst, s in alone.items():
        lines.append(row(f"{lst} list alone", s))
    lines.append(row("shipped fusion (" + config_name(*shipped) + ")", shipped_fused))
    for cfg, s in fused[:10]:
        lines.append(row(config_name(*cfg), s))
    if args.report:
        best_fused = next((cfg, s) for cfg, s in fused if cfg == configs[1])
    else:
        best_fused = next(((cfg, s) for cfg, s in fused if not below_floor(s)), fused[0])

    doc: dict[str, Any] = {"date": date.today().isoformat(), "cases": args.cases, "n": len(cases), "long": sum(long.values()), "blend_for": args.blend_for,
                           "traceback": sum(kind.traceback for kind in asked.values()), "lists_for": args.lists_for, "skipped": len(skipped),
                           "embedder": embedder.model_id, "reranker": rerank_id, "grid": {k: list(v) for k, v in grid.items()},
                           "alone": alone, "shipped_fused": shipped_fused,
                           "top_fused": [{"list_weights": cfg[0], "rrf_k": cfg[1], **s} for cfg, s in fused[:20]]}
    chosen = {"list_weights": best_fused[0][0], "rrf_k": best_fused[0][1], "fused": best_fused[1]}
    if reranker is not None:
        finalists = [cfg for cfg, _ in fused[: args.finalists]]
        if args.report:
            finalists = configs
        elif shipped not in finalists:
            finalists.append(shipped)
        # a small grid's every point also gets its final order at the shipped blends (GRID_TABLE)
        tabled = configs if len(configs) <= GRID_TABLE else []
        scored = score_missing(cases, datas, files, reranker,
                               lambda c: {x for w, k in [*finalists, *tabled] for x in top_of(c, w, k)})
        log(f"cross-encoder scored {scored} new passages")
        at_shipped_blend = []
        for w, k in tabled:
            tops = {c["key"]: top_of(c, w, k) for c in cases}
            at_shipped_blend.append(((w, k), score(cases, lambda c: final_files(datas[c["key"]], tops[c["key"]], w, *blend_of(c, None)))))
        blends = []
        for i, (w, k) in enumerate(finalists):
            tops = {c["key"]: top_of(c, w, k) for c in cases}
            for point in ([report_blends[i]] if args.report else itertools.product(BLEND_K, BLEND_WEIGHT)):
                s = score(cases, lambda c: final_files(datas[c["key"]], tops[c["key"]], w, *blend_of(c, point)))
                bk, bw = point or (settings.rerank_fusion_k, settings.rerank_fusion_weight)
                blends.append(((w, k, bk, bw), s))
            if (w, k) == shipped:
                shipped_final = score(cases, lambda c: final_files(datas[c["key"]], tops[c["key"]], w, *blend_of(c, None)))
        # every blend point at the shipped list weights: the table a blend is chosen from
        shipped_blends = [{"rerank_fusion_k": bk, "rerank_fusion_weight": bw, "repo_mean": s["repo_mean"], "per_repo_mrr":
                           {r: v["mrr"] for r, v in s["per_repo"].items()}} for (w, k, bk, bw), s in blends if (w, k) == shipped]
        blends.sort(key=lambda t: -t[1]["repo_mean"]["mrr"])
        lines.append(f"\nfinal order (fused blended with the cross-encoder: rerank_fusion_k, rerank_fusion_weight; {sum(long.values())} "
                     f"of {len(cases)} questions long; a grid blend applies to {args.blend_for})")
        lines.append(row(f"shipped: {config_name(*shipped)} blend {settings.rerank_fusion_k}/{settings.rerank_fusion_weight:g}, "
                         f"long {settings.rerank_fusion_k_long}/{settings.rerank_fusion_weight_long:g}", shipped_final))
        for (w, k, bk, bw), s in blends[:10]:
            lines.append(row(f"{config_name(w, k)} blend {bk}/{bw:g}", s))
        lines.append(f"blends at the shipped list weights, repository-mean MRR (k/w applied to {args.blend_for}): "
                     + "  ".join(f"{b['rerank_fusion_k']}/{b['rerank_fusion_weight']:g} {b['repo_mean']['mrr']:.1f}" for b in shipped_blends))
        if at_shipped_blend:
            lines.append("every grid point (role weights as shipped), each question at its kind's shipped blend:")
            for (w, k), s in sorted(at_shipped_blend, key=lambda t: -t[1]["repo_mean"]["mrr"]):
                lines.append(row(f"  {config_name(w, k)}", s))
        if args.report:
            (w, k, bk, bw), s = next((cfg, s) for cfg, s in blends if (cfg[0], cfg[1]) == configs[1])
        else:
            (w, k, bk, bw), s = next(((cfg, s) for cfg, s in blends if not below_floor(s)), blends[0])
        chosen = {"list_weights": w, "rrf_k": k, "rerank_fusion_k": bk, "rerank_fusion_weight": bw, "final": s,
                  "fused": fused_score((w, k))}
        doc["shipped_final"] = shipped_final
        doc["shipped_blends"] = shipped_blends
        doc["grid_at_shipped_blend"] = [{"list_weights": w, "rrf_k": k, "repo_mean": s["repo_mean"],
                                         "per_repo_mrr": {r: v["mrr"] for r, v in s["per_repo"].items()}} for (w, k), s in at_shipped_blend]
        doc["top_final"] = [{"list_weights": c[0], "rrf_k": c[1], "rerank_fusion_k": c[2], "rerank_fusion_weight": c[3], **s}
                            for c, s in blends[:20]]
    doc["chosen"] = chosen
    lines.append(f"\n{'measured (chosen on ' + args.report + ')' if args.report else 'chosen'}: {config_name(chosen['list_weights'], chosen['rrf_k'])}"
                 + (f" blend {chosen['rerank_fusion_k']}/{chosen['rerank_fusion_weight']:g}" if "rerank_fusion_k" in chosen else ""))
    lines.append("per repository (MRR): " + "  ".join(
        f"{r} {alone[VECTOR]['per_repo'][r]['mrr']:.1f}/{alone[KEYWORD]['per_repo'][r]['mrr']:.1f}/{shipped_fused['per_repo'][r]['mrr']:.1f}"
        f"->{chosen.get('final', chosen['fused'])['per_repo'][r]['mrr']:.1f}" for r in sorted(floor)) + "  (vector/keyword/shipped fused -> chosen)")
    print("\n".join(lines))
    write_result(out, doc, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
