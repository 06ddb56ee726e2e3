"""Candidate lists shaped like the reranker's input, from the training repositories.

The cross-encoder is asked to order the product's fused top candidates: source, tests, docs,
changelogs and config, ranked by the product's own keyword, vector and file lists. The pack's
hard negatives are BM25-ranked *source* chunks of the commit's parent tree (``mine.py``), and a
model trained on those alone gained on its own held-out figure and nothing in the product (see
training/README.md, "Cross-encoder, CPU run 1"). This tool writes the second kind of example:

* for each training-split repository of the manifest (never a validation or evaluation one), its
  tree at the pinned commit is indexed the way ``bench.quality`` indexes a case tree (the product's
  chunker and embedder, shared index and embedding caches);
* its change -> code questions are ``bench.validation.manifest_cases`` over that repository (the
  mined commit messages whose modified source files all exist in the pinned tree);
* each question is searched with the product's own plan and ``hybrid_search`` (the settings the
  product ships), and its fused candidates are written in fused order, each with its path, its
  text, its fusion weight and whether its file is one the commit modified.

    python -m training.corpus.product_lists [--per-repo 120] [--max-chunks 1400] [--repo OWNER/NAME ...]
    python -m training.corpus.product_lists --split validation --per-repo 60 --max-chunks 100000
    python -m training.corpus.product_lists --long-only --per-repo 200 --max-chunks 100000 --out training/.work/lists-long-all

Output: ``training/.work/lists/OWNER+NAME.jsonl.gz`` (one list per line) and ``.done`` beside it,
so a rerun skips finished repositories. Nothing here is committed: the lists hold the sources' code.
``training.train cross-encoder --lists DIR`` trains on them.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from bench.common import EmbedCache, bench_settings, open_or_build, question_queries
from bench.repos import DEFAULT_CACHE
from bench.validation import MANIFEST, MINED, git_dir, manifest_cases, validation_tree
from daemons.lib.search import hybrid_search, question_params
from training.corpus.mine import load_manifest
from training.corpus.rules import is_eval_repo

WORK = Path(__file__).resolve().parents[1] / ".work"
OUT = WORK / "lists"
STATS = Path(__file__).resolve().parent / "stats.json"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def training_entries(max_chunks: int, names: list[str] | None, split: str = "train") -> list[dict]:
    """Manifest entries of *split*, smallest first, with at most *max_chunks* mined source chunks
    (the index cost grows with the tree), or exactly *names* when given. The validation split's
    lists measure a model while it trains (``training.train --val-lists``); it never trains on them."""
    entries = [e for e in load_manifest(MANIFEST) if e.get("split") == split]
    entries = [e for e in entries if not is_eval_repo(e["repo"])]
    if names:
        return [e for e in entries if e["repo"] in names]
    sizes = json.loads(STATS.read_text())["per_repository"]
    entries = [e for e in entries if sizes.get(e["repo"], {}).get("source_chunks", 10**9) <= max_chunks]
    return sorted(entries, key=lambda e: sizes[e["repo"]]["source_chunks"])


def repo_lists(entry: dict, per_repo: int, cache: Path, settings, embedder, emb_cache, out: Path, long_only: bool = False) -> int:
    """Write *entry*'s lists to ``out/OWNER+NAME.jsonl.gz`` (only issue-sized questions with
    *long_only*); returns how many."""
    repo, commit = entry["repo"], entry["commit"]
    cases = manifest_cases([entry], per_repo, MINED, long_only=long_only, set_name=entry["split"])
    if not cases:
        log(f"{repo}: no case")
        return 0
    tree = validation_tree(repo, commit, cache)
    store, _ = open_or_build(tree, cache, repo.split("/")[1], commit[:12], settings, embedder, emb_cache, log)
    target = out / (repo.replace("/", "+") + ".jsonl.gz")
    part = target.with_suffix(".part")
    n = 0
    with gzip.open(part, "wt", encoding="utf-8") as fh:
        for c in cases:
            plan, kw, vec, _ = question_queries(c["query"], settings, embedder, store)
            res = hybrid_search(store, kw, vec, None, question_params(settings, plan))
            gold = set(c["gold_files"])
            cands = [{"path": r["path"], "text": r["text"], "weight": r["weight"], "gold": r["path"] in gold}
                     for r in res.candidates]
            fh.write(json.dumps({"repo": repo, "commit": commit, "case": c["id"], "query": c["query"],
                                 "rerank_query": plan.rerank_query, "language": entry["language"],
                                 "gold_files": sorted(gold), "candidates": cands}) + "\n")
            n += 1
    part.replace(target)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-repo", type=int, default=120)
    ap.add_argument("--max-chunks", type=int, default=1400, help="skip repositories with more mined source chunks")
    ap.add_argument("--repo", action="append", default=None)
    ap.add_argument("--split", default="train", choices=["train", "validation"],
                    help="validation: the held-out repositories' lists, to measure with (training/.work/lists-val)")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--out", type=Path, default=None, help="default training/.work/lists (lists-val for validation)")
    ap.add_argument("--long-only", action="store_true",
                    help="only issue-sized questions (question.Analysis.is_long), the kind the eval's issue reports are")
    args = ap.parse_args(argv)
    args.out = args.out or (OUT if args.split == "train" else WORK / "lists-val")
    from models.embedding import load_embedder

    cache = Path(args.cache).expanduser()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = bench_settings()
    embedder = load_embedder(settings.embedder_model)
    emb_cache = EmbedCache(cache / "embcache", embedder.model_id, embedder.dim)
    total = 0
    for entry in training_entries(args.max_chunks, args.repo, args.split):
        done = args.out / (entry["repo"].replace("/", "+") + ".done")
        if done.is_file():
            total += int(done.read_text() or 0)
            continue
        if not git_dir(entry["repo"]).is_dir():
            log(f"{entry['repo']}: no git directory (fetch it first)")
            continue
        t = time.perf_counter()
        n = repo_lists(entry, args.per_repo, cache, settings, embedder, emb_cache, args.out, args.long_only)
        done.write_text(str(n))
        total += n
        log(f"{entry['repo']}: {n} lists in {time.perf_counter() - t:.0f} s ({total} in all)")
    log(f"done: {total} lists in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
