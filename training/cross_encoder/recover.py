"""Rebuild a torch state dict of the shipped cross-encoder from its int8 ONNX file.

Training continues from the model the product ships, so the fp32 checkpoint of an earlier
version is not needed: every int8 weight of ``models/artifacts/cross-encoder/model.int8.onnx`` is
dequantised (``(q - zero_point) * scale``, per channel where the file is) back into the graph's
torch names, and a projection the export kept in fp32 is taken as it is; the fused QKV matrix is
split into query, key and value; the head keeps its folded calibration (the next export
calibrates again on top). The result is checked against
onnxruntime on validation pairs before it is saved.

    python training/cross_encoder/recover.py --out models/.work/ce_v4.pt
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from common import REPO, CrossEncoderModel, load_tokenizer, predict, read_pairs

SHIPPED = REPO / "models/artifacts/cross-encoder/model.int8.onnx"


def encoder_weight(node_name: str) -> str:
    """The torch name of an encoder projection's weight from its ONNX node's name:
    ``/bert/encoder/layer.0/attention/output/dense/MatMul_quant`` ->
    ``bert.encoder.layer.0.attention.output.dense.weight``."""
    parts = node_name.strip("/").split("/")
    return f"bert.encoder.layer.{parts[2].split('.')[1]}.{'.'.join(parts[3:-1])}.weight"


def dequantised(path: Path) -> dict[str, torch.Tensor]:
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    init = {i.name: numpy_helper.to_array(i) for i in g.initializer}

    def deq(base: str) -> np.ndarray:
        q = init[base + "_quantized"].astype(np.float32)
        return (q - init[base + "_zero_point"].astype(np.float32)) * init[base + "_scale"].astype(np.float32)

    sd: dict[str, np.ndarray] = {}
    for part in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        sd[f"bert.embeddings.{part}.weight"] = deq(f"bert.embeddings.{part}.weight")
    sd["bert.embeddings.LayerNorm.weight"] = deq("bert.embeddings.LayerNorm.weight")
    sd["bert.embeddings.LayerNorm.bias"] = deq("bert.embeddings.LayerNorm.bias")
    for node in g.node:
        if node.op_type == "QAttention":
            layer = int(node.name.split("_")[1])
            w = deq(f"Attention_{layer}_qkv_weight")  # (in, 3 * out): Q | K | V
            b = init[f"Attention_{layer}_qkv_bias"]
            h = w.shape[1] // 3
            for k, name in enumerate(("query", "key", "value")):
                sd[f"bert.encoder.layer.{layer}.attention.self.{name}.weight"] = w[:, k * h:(k + 1) * h].T
                sd[f"bert.encoder.layer.{layer}.attention.self.{name}.bias"] = b[k * h:(k + 1) * h]
        elif node.op_type == "MatMulInteger":
            base = node.input[1][: -len("_quantized")]
            w = deq(base).T
            if node.name.startswith("/head/"):
                sd["head.weight"] = w.reshape(1, -1)
            else:
                sd[encoder_weight(node.name)] = w
        elif node.op_type == "MatMul" and node.input[1] in init and node.name.startswith("/bert/encoder/"):
            # a projection the export kept in fp32 (version 4's "FFN outputs fp32" variant)
            sd[encoder_weight(node.name)] = init[node.input[1]].T
    for name, arr in init.items():
        if name.startswith(("bert.encoder.", "head.bias")):
            sd[name] = arr
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--onnx", default=str(SHIPPED))
    ap.add_argument("--out", default=str(REPO / "models/.work/ce_v2.pt"))
    ap.add_argument("--check", type=int, default=48, help="validation pairs compared with onnxruntime")
    args = ap.parse_args()
    torch.set_num_threads(2)
    model = CrossEncoderModel(attn="eager")
    sd = dequantised(Path(args.onnx))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise SystemExit(f"weights not matched: missing {missing}, unexpected {unexpected}")
    tok = load_tokenizer()
    rows = [r for r in read_pairs(REPO / "training/cross_encoder/data/pairs.jsonl.gz") if r["split"] == "val"]
    sample = [(r["query"], r["passage"]) for r in rows[: args.check]]
    t = np.array(predict(model, tok, sample, 512, 16))
    from export import ort_logits  # the export's own scorer of an ONNX file

    o = np.array(ort_logits(Path(args.onnx), tok, sample, 2))
    corr = float(np.corrcoef(t, o)[0, 1])
    print(f"recovered torch vs shipped int8 on {len(sample)} pairs: pearson {corr:.4f}, "
          f"max |logit diff| {np.abs(t - o).max():.3f}")
    if corr < 0.98:
        raise SystemExit("recovered weights do not reproduce the shipped model")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
