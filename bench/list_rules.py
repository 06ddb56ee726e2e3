"""Two more rules for the fused lists, measured on ``bench.tune``'s cached lists (issue 19).

* ``frames``: a traceback's files as a list of their own. The product fuses every file the
  question names as one list, ``mentioned``, in order of first mention, each near the top of the
  fused order (weight 2 at rank r gives 2/(30 + r), four times what the vector list's first chunk
  gets). A Python traceback names up to a dozen files, outermost call first, and they can fill the
  fused top while the fix lies in a file no frame names. The rule splits ``mentioned`` into the
  files named outside the frames (kept as ``mentioned``, weight 2) and the frames' files
  (``frames``), ordered outermost first (``outer``, the question's order) or innermost first
  (``inner``, the frame nearest the error first), cut to ``cap`` files, with weight ``w``.
* ``agree``: when the cross-encoder's best file is also the first file of another list (vector,
  keyword, whole-file BM25), it is put first in the final order: two kinds of evidence agreeing.

Nothing is searched here; ``bench.tune`` must have cached the cases' lists (the same settings),
and only the chunks a rule brings into the fused 12 are scored by the cross-encoder. Rules are
judged on the validation sets (``--cases validation-traceback`` first: 63 questions that quote a
traceback), never on ``../shared/eval``. Prints one line per rule and case set (repository-mean
MRR of the fused and the final order, recall@5, each repository's final MRR); writes
``bench/results/list_rules.json``.

    python -m bench.list_rules --cases validation-traceback --cases validation --cases validation-long
"""
from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from bench.common import bench_settings, question_kind, settings_embedder, write_result
from bench.quality import reranker_note
from bench.repos import DEFAULT_CACHE
from bench.tune import final_files, fused_top, load_lists, log, role_weight_of, score, score_missing, shipped_weights
from daemons.lib.fusion import MENTIONED
from daemons.lib.metrics import files_in_order
from daemons.lib.pipeline import blend
from daemons.lib.question import analyse

OUT = Path(__file__).resolve().parent / "results" / "list_rules.json"
FRAMES = "frames"
#: The ``frames`` grid: order, how many files, weight.
FRAME_ORDERS = ("outer", "inner")
FRAME_CAPS = (1, 2, 3, 10)
FRAME_WEIGHTS = (0.5, 1.0, 2.0)
#: The lists whose first file, agreeing with the cross-encoder's best, puts that file first.
AGREE_LISTS = ("vector", "keyword", "file_bm25", "vector+file_bm25")


def frame_position(path: str, frames: Sequence[str], order: str) -> int | None:
    """Where *path* (a workspace path) stands among the traceback's frame paths: the first frame
    naming it counted from the outermost (``outer``), or the last counted from the innermost
    (``inner``); None when no frame names it. A frame names a path when it is the path or ends
    with ``/`` and the path (an absolute frame path ends with the workspace path)."""
    hits = [i for i, fp in enumerate(frames) if fp == path or fp.endswith("/" + path)]
    if not hits:
        return None
    return len(frames) - 1 - hits[-1] if order == "inner" else hits[0]


def split_frames(lists: dict[str, list[str]], paths: dict[str, str], frames: Sequence[str], order: str,
                 cap: int) -> dict[str, list[str]]:
    """*lists* with ``mentioned`` split in two: the chunks whose file no frame names stay
    ``mentioned`` in their order; those of the frames' files become ``frames``, in *order*, at
    most *cap*."""
    out = dict(lists)
    named, framed = [], []
    for cid in lists.get(MENTIONED, []):
        pos = frame_position(paths[cid], frames, order)
        if pos is None:
            named.append(cid)
        else:
            framed.append((pos, cid))
    out[MENTIONED] = named
    out[FRAMES] = [cid for _, cid in sorted(framed)][:cap]
    return out


def promote_agreed(final: list[str], best: str, firsts: Sequence[str]) -> list[str]:
    """*final* with *best* (the cross-encoder's best file) moved first when it is one of *firsts*
    (other lists' first files) and in *final*."""
    if best in firsts and best in final:
        return [best] + [f for f in final if f != best]
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", action="append", help="validation-traceback, validation, validation-long ...; repeatable")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    from models.cross_encoder import load_cross_encoder

    settings = bench_settings()
    embedder = settings_embedder(settings)
    reranker = load_cross_encoder(None, threads=2)
    rerank_id = reranker_note(reranker)
    cache = Path(args.cache).expanduser()
    w = shipped_weights(settings)
    doc: dict[str, Any] = {"date": date.today().isoformat(), "reranker": rerank_id, "sets": {}}
    lines = [f"{'cases':22s} {'rule':26s} {'fused':>6s} {'final':>6s} {'r@5':>6s}  final MRR per repository"]
    print(lines[0], flush=True)
    for which in args.cases or ["validation-traceback"]:
        cases, datas, files, _ = load_lists(which, settings, embedder, cache, rerank_id)
        frames = {c["key"]: [f.path for f in analyse(c["query"]).frames] for c in cases}
        kinds = {c["key"]: question_kind(c["query"], settings) for c in cases}
        blends = {key: blend(settings, kind.long) for key, kind in kinds.items()}
        traceback = {key: kind.traceback for key, kind in kinds.items()}
        top_n = {key: settings.rerank_top_for(kind.long, kind.traceback) for key, kind in kinds.items()}
        rules: list[tuple[str, Any]] = [("shipped", None)]
        rules += [(f"frames {o} cap {n} w {x:g}", (o, n, x)) for o, n, x in itertools.product(FRAME_ORDERS, FRAME_CAPS, FRAME_WEIGHTS)]
        rules += [(f"agree {lst}", lst) for lst in AGREE_LISTS]
        results = []
        for label, rule in rules:
            if isinstance(rule, tuple):
                o, n, x = rule
                tops = {}
                for c in cases:
                    data = datas[c["key"]]
                    lists = split_frames(data["lists"], data["paths"], frames[c["key"]], o, n)
                    tops[c["key"]] = fused_top({**data, "lists": lists}, {**w, FRAMES: x}, settings.rrf_k, top_n[c["key"]], traceback[c["key"]])
            else:
                tops = {c["key"]: fused_top(datas[c["key"]], w, settings.rrf_k, top_n[c["key"]], traceback[c["key"]]) for c in cases}
            scored = score_missing(cases, datas, files, reranker, lambda c: tops[c["key"]])
            if scored:
                log(f"  {label}: cross-encoder scored {scored} new passages")

            def final_of(c: dict, rule: Any = rule) -> list[str]:
                data, top = datas[c["key"]], tops[c["key"]]
                final = final_files(data, top, w, *blends[c["key"]])
                if isinstance(rule, str):
                    rw = role_weight_of(data, w)
                    best = data["paths"][max(top, key=lambda x: data["probs"][x] * rw(x))]
                    firsts = [data["paths"][data["lists"][lst][0]] for lst in rule.split("+") if data["lists"].get(lst)]
                    final = promote_agreed(final, best, firsts)
                return final

            f = score(cases, lambda c: files_in_order([datas[c["key"]]["paths"][x] for x in tops[c["key"]]]))
            g = score(cases, final_of)
            results.append({"rule": label, "fused": f, "final": g})
            per = " ".join(f"{r.split('/')[-1]} {v['mrr']:.1f}" for r, v in sorted(g["per_repo"].items()))
            lines.append(f"{which:22s} {label:26s} {f['repo_mean']['mrr']:6.1f} {g['repo_mean']['mrr']:6.1f} "
                         f"{g['repo_mean']['recall@5']:6.1f}  {per}")
            print(lines[-1], flush=True)
        doc["sets"][which] = {"n": len(cases), "rules": results}
    write_result(args.out, doc, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
