"""Other final-order rules, measured on ``bench.quality``'s cached case runs (issue 19).

The product orders the reranked candidates' files by ``fusion.rerank_order``: a file scores
``1/(k+1+fused rank) + w/(k+1+cross-encoder rank)``. That vote ignores how sure the
cross-encoder is. This script asks whether a vote that grows with its confidence does better,
from the fused candidates and probabilities ``bench.quality`` cached for each case (so nothing is
searched or scored here; run ``bench.quality`` on the same cases first, with the same settings and
cross-encoder). The rules, each over the file's best probability times its role weight:

* ``rank w``          the product's blend (k = ``rerank_fusion_k``) with cross-encoder weight w
* ``margin w a``      the same with weight ``w * (1 + a * (p1 - p2))``: p1, p2 the two best files'
  probabilities, so a clear winner gets a larger vote
* ``top w a``         weight ``w * (1 + a * p1)``: a confident first file gets a larger vote
* ``score w``         ``1/(k+1+fused rank) + w * p / (k+1)``: the probability itself instead of
  its rank

Rules are chosen on the validation sets (``--cases validation --cases validation-long``), never
on ``../shared/eval``; an eval set may be given to report a rule already chosen. Prints one line
per rule and case set (repository-mean recall@5 and MRR, case-mean MRR, the repositories whose
MRR falls below their best single list) and writes ``bench/results/blend_rules.json``.

    python -m bench.blend_rules --cases validation --cases validation-long
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.common import bench_settings, index_key, write_result
from bench.quality import caserun_file, log, reranker_note, search_key, select_cases
from bench.repos import DEFAULT_CACHE
from daemons.lib.metrics import file_metrics, mean_metrics
from daemons.lib.pipeline import final_files

OUT = Path(__file__).resolve().parent / "results" / "blend_rules.json"
WEIGHTS = (0.25, 0.5, 1.0, 2.0)
ALPHAS = (1.0, 2.0, 4.0, 8.0)
SCORE_WEIGHTS = (1.0, 2.0, 4.0, 8.0, 16.0)


def file_order(paths: Sequence[str], weighted: Sequence[float], k: int, w: float, rule: str = "rank", alpha: float = 0.0) -> list[str]:
    """The files of chunks given in fused order (*paths*, one per chunk; *weighted*: each chunk's
    probability times role weight) under *rule* (see the module doc). ``rank``, ``margin`` and
    ``top`` are the product's own order (``pipeline.final_files``) with the cross-encoder's weight
    scaled; ``score`` adds each file's best probability to its fused-rank key instead."""
    best: dict[str, float] = {}  # each file's best probability, files in fused order
    for path, p in zip(paths, weighted):
        best[path] = max(best.get(path, p), p)
    if rule != "score":
        p1, p2 = (sorted(best.values(), reverse=True) + [0.0, 0.0])[:2]
        vote = w * (1 + alpha * (p1 - p2)) if rule == "margin" else w * (1 + alpha * p1) if rule == "top" else w
        return final_files(paths, weighted, k, vote)
    key = {f: 1.0 / (k + 1 + i) + w * best[f] / (k + 1) for i, f in enumerate(best)}
    return sorted(best, key=lambda f: -key[f])  # stable: fused order on equal keys


def rules(k: int) -> list[tuple[str, Callable[[dict], list[str]]]]:
    """Every rule of the grid as (name, case -> file order)."""
    def make(w: float, rule: str, alpha: float = 0.0) -> Callable[[dict], list[str]]:
        return lambda c: file_order(c["fused_chunks"], [p * x for p, x in zip(c["fused_probs"], c["fused_weights"])], k, w, rule, alpha)

    out = [(f"rank w={w:g}", make(w, "rank")) for w in WEIGHTS]
    out += [(f"{rule} w={w:g} a={a:g}", make(w, rule, a)) for rule in ("margin", "top") for w in WEIGHTS[:2] for a in ALPHAS]
    out += [(f"score w={w:g}", make(w, "score")) for w in SCORE_WEIGHTS]
    return out


def cached_cases(which: str, cache: Path, settings: Any, embedder_id: str, note: str) -> tuple[list[dict], int]:
    """The cases of *which* whose cached run holds the cross-encoder's probabilities, with their
    gold files, and how many had none."""
    groups, _ = select_cases(which, cache)
    key = search_key(settings, note)
    out, missing = [], 0
    for (name, version), items in groups.items():
        runs = cache / "caseruns" / index_key(name, version, embedder_id, settings) / key
        for c, _ in items:
            f = caserun_file(runs, c)
            ranked = json.loads(f.read_text()) if f.is_file() else {}
            if "fused_probs" not in ranked:
                missing += 1
                continue
            out.append({"repo": c["repo"], "gold": c["gold_resolved"], **{m: ranked[m] for m in ("keyword", "vector", "fused_chunks", "fused_probs", "fused_weights")}})
    return out, missing


def measure(cases: list[dict], order: Callable[[dict], list[str]]) -> dict[str, Any]:
    """Per-repository metrics of *order*, their repository mean and the case mean."""
    per: dict[str, list[dict[str, float]]] = defaultdict(list)
    for c in cases:
        per[c["repo"]].append(file_metrics(order(c), c["gold"]))
    per_repo = {r: mean_metrics(ms) for r, ms in per.items()}
    return {"per_repo": per_repo, "repo_mean": {m: round(float(np.mean([v[m] for v in per_repo.values()])), 2) for m in ("recall@5", "mrr")},
            "case_mean": mean_metrics([m for ms in per.values() for m in ms])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", action="append", help="validation, validation-long or an eval case set; repeatable (default: both validation sets)")
    ap.add_argument("--reranker-dir", default=None, help="the cross-encoder whose cached probabilities are read (default: the shipped one)")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    cache = Path(args.cache).expanduser()
    from models.cross_encoder import load_cross_encoder
    from models.embedding import load_embedder

    settings = bench_settings()
    embedder_id = load_embedder(settings.embedder_model).model_id
    note = reranker_note(load_cross_encoder(args.reranker_dir, threads=1))
    doc: dict[str, Any] = {"date": date.today().isoformat(), "reranker": note, "rerank_fusion_k": settings.rerank_fusion_k, "sets": {}}
    lines = [f"{'cases':16s} {'rule':22s} {'repo r@5':>8s} {'repo MRR':>8s} {'case MRR':>8s}  below own best list (MRR)"]
    for which in args.cases or ["validation", "validation-long"]:
        cases, missing = cached_cases(which, cache, settings, embedder_id, note)
        if missing:
            log(f"{which}: {missing} cases have no cached probabilities (run bench.quality --cases {which} first); left out")
        if not cases:
            continue
        floor = {r: max(measure(cases, lambda c: c["keyword"])["per_repo"][r]["mrr"], measure(cases, lambda c: c["vector"])["per_repo"][r]["mrr"])
                 for r in {c["repo"] for c in cases}}
        doc["sets"][which] = {"n": len(cases), "missing": missing, "rules": {}}
        for name, order in rules(settings.rerank_fusion_k):
            s = measure(cases, order)
            below = sorted(r.split("/")[-1] for r, v in s["per_repo"].items() if v["mrr"] < floor[r])
            doc["sets"][which]["rules"][name] = {**s, "below_floor": below}
            lines.append(f"{which:16s} {name:22s} {s['repo_mean']['recall@5']:8.1f} {s['repo_mean']['mrr']:8.1f} {s['case_mean']['mrr']:8.1f}  {','.join(below) or '-'}")
    print("\n".join(lines))
    write_result(args.out, doc, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
