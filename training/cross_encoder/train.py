"""Fine-tune all-MiniLM-L6-v2 as a cross-encoder on the mined pairs (CPU, torch).

    python training/cross_encoder/train.py --time-budget 2100

Binary cross-entropy on one logit; AdamW with linear warm-up and decay; length-bucketed batches;
sequences built with the product's 512/64 rule but capped at --max-len tokens for speed.
Saves models/.work/ce.pt (state dict) at checkpoints and at the end.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from torch import nn

from common import REPO, CrossEncoderModel, collate, load_tokenizer, pair_ids, read_pairs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="+", default=[str(REPO / "training/cross_encoder/data/pairs.jsonl.gz")],
                    help="pair files; PATH:N takes N query groups of that file (sampled with the seed), "
                         "PATH all of them")
    ap.add_argument("--out", default=str(REPO / "models/.work/ce.pt"))
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=4e-5)
    ap.add_argument("--time-budget", type=float, default=2100.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--freeze-embeddings", type=int, default=1)
    ap.add_argument("--freeze-layers", type=int, default=0, help="also freeze the lowest N encoder layers")
    ap.add_argument("--head-lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=float, default=0.03)
    ap.add_argument("--init", default="", help="state dict to continue from")
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--listwise", type=float, default=0.0,
                    help="weight of a softmax loss over each query's group (its positive against its "
                         "negatives); batches are then whole groups, --batch counts groups")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = load_tokenizer()
    rows = []
    for spec in args.data:
        path, _, n = spec.partition(":")
        part = [r for r in read_pairs(Path(path)) if r["split"] == "train"]
        if n:
            keep = set(rng.sample(sorted({r["group"] for r in part}), int(n)))
            part = [r for r in part if r["group"] in keep]
        print(f"{path}: {len(part)} pairs", flush=True)
        rows.extend(part)
    if args.limit:
        rng.shuffle(rows)
        rows = rows[:args.limit]
    t0 = time.time()
    enc = [pair_ids(tok, r["query"], r["passage"], args.max_len, 64) for r in rows]
    labels = [float(r["label"]) for r in rows]
    print(f"{len(rows)} training pairs, tokenised in {time.time() - t0:.1f}s, "
          f"mean length {sum(len(e[0]) for e in enc) / len(enc):.0f} tokens", flush=True)

    def group_batches():
        by: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by.setdefault(r["group"], []).append(i)
        groups = [g for g in by.values() if any(labels[i] == 1.0 for i in g)]
        rng.shuffle(groups)
        return [sum(groups[k:k + args.batch], []) for k in range(0, len(groups), args.batch)]

    def batches():
        if args.listwise:
            return group_batches()
        idx = list(range(len(enc)))
        rng.shuffle(idx)
        out = []
        chunk = args.batch * 50
        for s in range(0, len(idx), chunk):
            part = sorted(idx[s:s + chunk], key=lambda i: len(enc[i][0]))
            out.extend(part[k:k + args.batch] for k in range(0, len(part), args.batch))
        rng.shuffle(out)
        return out

    model = CrossEncoderModel()
    model.train()
    if args.init:
        model.load_state_dict(torch.load(args.init, map_location="cpu"))
    if args.freeze_embeddings:  # the 30k x 384 word table: a dense gradient and Adam state for little gain
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    if args.freeze_layers:  # CPU time: no backward below the first trained layer
        for p in model.bert.embeddings.parameters():
            p.requires_grad_(False)
        for layer in model.bert.encoder.layer[:args.freeze_layers]:
            for p in layer.parameters():
                p.requires_grad_(False)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [
        {"params": [p for n, p in model.named_parameters() if p.requires_grad
                    and not n.startswith("head.") and not any(x in n for x in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if p.requires_grad
                    and not n.startswith("head.") and any(x in n for x in no_decay)],
         "weight_decay": 0.0},
        {"params": list(model.head.parameters()), "weight_decay": 0.0, "lr": args.head_lr},
    ]
    opt = torch.optim.AdamW(groups, lr=args.lr)
    per_epoch = len(group_batches()) if args.listwise else math.ceil(len(enc) / args.batch)
    total = int(per_epoch * args.epochs)
    warm = max(1, int(args.warmup * total))
    # linear warm-up, then linear decay to zero by whichever comes first: the planned number
    # of steps or the wall-clock budget (so a slow machine still ends with a decayed rate)
    t_start = time.time()

    def factor(s):
        left = min(max(0.0, (total - s) / max(1, total - warm)),
                   max(0.0, 1.0 - (time.time() - t_start) / args.time_budget))
        return min((s + 1) / warm, left)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    loss_fn = nn.BCEWithLogitsLoss()
    step, run_loss, pairs_seen = 0, None, 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    done = False
    while not done:
        for b in batches():
            ids, mask, types = collate([enc[i] for i in b])
            y = torch.tensor([labels[i] for i in b])
            logits = model(ids, mask, types)
            loss = loss_fn(logits, y)
            if args.listwise:
                # each group: one positive against its own negatives (cross entropy over the group)
                listwise = []
                for key in dict.fromkeys(rows[i]["group"] for i in b):
                    pos = [j for j, i in enumerate(b) if rows[i]["group"] == key]
                    target = next(k for k, j in enumerate(pos) if y[j] == 1.0)
                    listwise.append(nn.functional.cross_entropy(logits[pos].unsqueeze(0), torch.tensor([target])))
                loss = loss + args.listwise * torch.stack(listwise).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            pairs_seen += len(b)
            run_loss = loss.item() if run_loss is None else 0.95 * run_loss + 0.05 * loss.item()
            el = time.time() - t_start
            if step % 10 == 0:
                print(f"step {step}/{total} loss {run_loss:.4f} lr {sched.get_last_lr()[0]:.2e} "
                      f"{pairs_seen / el:.1f} pairs/s {el:.0f}s", flush=True)
            if step % args.ckpt_every == 0:
                torch.save(model.state_dict(), args.out)
            if step >= total or el > args.time_budget:
                done = True
                break
    torch.save(model.state_dict(), args.out)
    info = {"data": args.data, "pairs_available": len(enc), "steps": step, "batch": args.batch,
            "pairs_seen": pairs_seen, "epochs_seen": pairs_seen / len(enc),
            "seconds": round(time.time() - t_start), "lr": args.lr, "max_len": args.max_len,
            "threads": args.threads, "frozen_word_embeddings": bool(args.freeze_embeddings),
            "frozen_layers": args.freeze_layers, "head_lr": args.head_lr, "init": args.init,
            "listwise": args.listwise, "final_running_loss": run_loss, "torch": torch.__version__}
    Path(args.out).with_name("train_info.json").write_text(json.dumps(info, indent=2))
    print(f"done: {step} steps, {pairs_seen} pairs, {time.time() - t_start:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
