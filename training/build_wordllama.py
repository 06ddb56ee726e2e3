"""Build the second embedding candidate, WordLlama l2_supercat 256, as an ONNX artifact the product can load.

WordLlama (MIT, PyPI ``wordllama``) is a static embedder: one learned 256-d vector per token of
the Llama 2 tokenizer (32,000 SentencePiece-derived BPE tokens), a sentence being the mean of
its token vectors. Its wheel ships the weights (``weights/l2_supercat_256.safetensors``, fp16)
and the tokenizer (``tokenizers/l2_supercat_tokenizer_config.json``, a ``tokenizers`` file).

This script takes the wheel from the package index (pinned by version and sha256), builds the
graph Gather -> masked mean -> L2 norm (output ``sentence_embedding``, inputs ``input_ids`` and
``attention_mask``, so ``models.embedding.Embedder`` runs it unchanged) with the table kept in
fp16, and writes ``models/artifacts/wordllama-l2-256/`` with its manifest. WordLlama encodes
without special tokens, so the tokenizer's BOS post-processor is dropped. The artifact is not
committed (it is a measured alternative, not the default): ``python -m training.build_wordllama``
makes it, and ``WSCTX_EMBEDDER_MODEL=wordllama-l2-256`` selects it (a rebuild of each index).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from training.build_embedder import read_safetensors
from models.manifest import sha256_file, write_manifest

NAME = "wordllama-l2-256"
PACKAGE = "wordllama"
VERSION = "0.4.0.post1"
WHEEL = "wordllama-0.4.0.post1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
WHEEL_SHA256 = "42c2c88907ace0b0681ac6f9092d6a300a6409a5d2d61071a3fb5e7159370c97"
WEIGHTS = "wordllama/weights/l2_supercat_256.safetensors"
TOKENIZER = "wordllama/tokenizers/l2_supercat_tokenizer_config.json"
MAX_TOKENS = 512
OPSET = 17
DEFAULT_OUT = Path(__file__).resolve().parent / "artifacts" / NAME
MODEL_CARD = (
    "WordLlama l2_supercat 256 (github.com/dleemiller/WordLlama, MIT): token embeddings taken from "
    "several Llama-2-tokenizer LLMs, concatenated and trained with a contrastive objective into a "
    "256-dimensional static embedding per token; a text is the mean of its token vectors, "
    "L2-normalised. No attention, so it is very fast and blind to word order. This artifact: the "
    "fp16 table from the PyPI wheel in an ONNX Gather/mean graph, built by training/build_wordllama.py."
)


def fetch_wheel(dest: Path) -> Path:
    """The pinned wheel, downloaded from the package index (pip) unless already in *dest*."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / WHEEL
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
                        f"{PACKAGE}=={VERSION}", "-d", str(dest)], check=True)
    return path


def build_graph(table: np.ndarray):
    """input_ids, attention_mask (int64, [batch, seq]) -> sentence_embedding (float32, [batch, dim])."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tok16"], axis=0),
        helper.make_node("Cast", ["tok16"], ["tok"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),
        helper.make_node("Mul", ["tok", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_seq"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "axis_last"], ["count"], keepdims=1),
        helper.make_node("Max", ["count", "one"], ["count1"]),
        helper.make_node("Div", ["summed", "count1"], ["mean"]),
        helper.make_node("LpNormalization", ["mean"], ["sentence_embedding"], axis=1, p=2),
    ]
    inits = [
        numpy_helper.from_array(table.astype(np.float16), "table"),
        numpy_helper.from_array(np.array([-1], np.int64), "axis_last"),
        numpy_helper.from_array(np.array([1], np.int64), "axis_seq"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    graph = helper.make_graph(
        nodes, NAME,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", table.shape[1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="wsctx")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build(out: Path = DEFAULT_OUT, wheel_dir: Path | None = None, log=print) -> dict:
    import onnx

    wheel_dir = wheel_dir or Path(tempfile.gettempdir()) / "wsctx-wheels"
    wheel = fetch_wheel(wheel_dir)
    digest = sha256_file(wheel)
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256}: refusing to build from it")
    with tempfile.TemporaryDirectory(prefix="wsctx-wordllama-") as tmp:
        tmp = Path(tmp)
        with zipfile.ZipFile(wheel) as z:
            z.extract(WEIGHTS, tmp)
            z.extract(TOKENIZER, tmp)
        table = read_safetensors(tmp / WEIGHTS)["embedding.weight"]
        tok = json.loads((tmp / TOKENIZER).read_text(encoding="utf-8"))
        tok["post_processor"] = None  # WordLlama encodes with add_special_tokens=False
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        onnx.save_model(build_graph(table), str(out / "model.onnx"))
        (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
        manifest = _manifest(int(table.shape[1]))
        write_manifest(out, manifest)
        manifest["build"]["checks"] = _check(out, tmp / WEIGHTS, tmp / TOKENIZER)
    write_manifest(out, manifest)
    log(f"wrote {out}")
    for f in sorted(out.iterdir()):
        log(f"  {f.name:20s} {f.stat().st_size:>10d}  {sha256_file(f)}")
    return manifest


def _manifest(dim: int) -> dict:
    return {
        "name": NAME,
        "variant": "fp16",
        "model_file": "model.onnx",
        "model_output": "sentence_embedding",
        "model_inputs": ["input_ids", "attention_mask"],
        "source": {"package": PACKAGE, "version": VERSION, "wheel": WHEEL, "wheel_sha256": WHEEL_SHA256,
                   "upstream": "github.com/dleemiller/WordLlama", "file": WEIGHTS},
        "licence": "MIT",
        "model_card": MODEL_CARD,
        "tokenizer": "tokenizer.json",
        "dim": dim,
        "max_tokens": MAX_TOKENS,
        "pooling": "mean",
        "normalised": True,
        "prefixes": {"document": "", "query": ""},
        "build": {"command": "python -m training.build_wordllama", "checks": {}},
    }


def _check(out: Path, weights: Path, tokenizer: Path) -> dict:
    """The graph against WordLlama's own numpy recipe (mean of fp16 rows, no special tokens)."""
    from tokenizers import Tokenizer

    from models.embedding import Embedder

    texts = ["def parse_date(value): return datetime.strptime(value, '%Y-%m-%d')",
             "retry the HTTP request with exponential backoff", "a cat sat on the mat"]
    tok = Tokenizer.from_file(str(tokenizer))
    table = read_safetensors(weights)["embedding.weight"].astype(np.float32)
    ref = []
    for t in texts:
        v = table[tok.encode(t, add_special_tokens=False).ids].mean(0)
        ref.append(v / np.linalg.norm(v))
    emb = Embedder(out, threads=1, model_file=out / "model.onnx", variant="fp16")
    got = emb.embed_documents(texts, batch_size=3)
    cos = [float(np.dot(a, b)) for a, b in zip(np.stack(ref), got)]
    if min(cos) < 0.9999:
        raise SystemExit(f"graph disagrees with the numpy recipe: cosines {cos}")
    return {"graph_vs_numpy_cosine_min": round(min(cos), 6)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--wheel-dir", type=Path, default=None, help="where the wheel is downloaded (default: a temp folder)")
    args = ap.parse_args(argv)
    build(args.out, args.wheel_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
