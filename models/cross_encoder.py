"""The reranker: a local cross-encoder run with onnxruntime (SPEC §2, "The cross-encoder").

The question and one passage are read together as one sequence
``[CLS] question [SEP] passage [SEP]`` of at most 512 tokens.  The question is cut to its first
64 tokens; the passage then gets the rest of the 512 (its head is kept when it is longer still),
so a long question never eats the passage: any passage of up to ``512 - 3 - 64 = 445`` tokens is
read whole, tail included.  The model gives one logit per pair, already calibrated (see the
manifest); ``score`` returns its sigmoid, a probability compared against the SPEC's 0.08.

The model files live in ``models/artifacts/cross-encoder/`` (``WSCTX_RERANKER_DIR`` overrides);
their sha256 sums are checked against ``manifest.json`` at load.  Anything missing or corrupt
raises :class:`ModelUnavailable`, which callers turn into the fused-order fallback.

No torch here: onnxruntime, numpy and tokenizers only.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from models.manifest import ModelUnavailable, read_manifest, verify

MAX_TOKENS = 512
QUERY_MAX_TOKENS = 64
DEFAULT_DIR = Path(__file__).resolve().parent / "artifacts" / "cross-encoder"
ENV_DIR = "WSCTX_RERANKER_DIR"


def rerank_passage(path: str, text: str) -> str:
    """The passage the reranker reads for one chunk: its relative path, a newline, its text (what
    the front sends, the benchmark scores and the training tool trains on)."""
    return f"{path}\n{text}"


def pair_ids(tokenizer, query: str, passage: str, max_tokens: int = MAX_TOKENS,
             query_max_tokens: int = QUERY_MAX_TOKENS) -> tuple[list[int], list[int]]:
    """Token ids and token type ids of one pair under the 512/64 rule (no padding)."""
    q = tokenizer.encode(query, add_special_tokens=False).ids
    p = tokenizer.encode(passage, add_special_tokens=False).ids
    return _assemble(q, p, tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"),
                     max_tokens, query_max_tokens)


def _assemble(q: Sequence[int], p: Sequence[int], cls: int, sep: int, max_tokens: int,
              query_max_tokens: int) -> tuple[list[int], list[int]]:
    q = list(q[:query_max_tokens])
    room = max_tokens - 3 - len(q)
    p = list(p[:max(room, 0)])
    ids = [cls] + q + [sep] + p + [sep]
    types = [0] * (len(q) + 2) + [1] * (len(p) + 1)
    return ids, types


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # stable for large |x|


class CrossEncoder:
    """A loaded cross-encoder; use :func:`load_cross_encoder` to make one."""

    def __init__(self, session, tokenizer, manifest: dict, folder: Path):
        self._session = session
        self._tok = tokenizer
        self.manifest = manifest
        self.folder = folder
        self.max_tokens = int(manifest.get("max_tokens", MAX_TOKENS))
        self.query_max_tokens = int(manifest.get("query_max_tokens", QUERY_MAX_TOKENS))
        self._cls = tokenizer.token_to_id("[CLS]")
        self._sep = tokenizer.token_to_id("[SEP]")
        self._pad = tokenizer.token_to_id("[PAD]") or 0
        self._inputs = {i.name for i in session.get_inputs()}

    @property
    def model_id(self) -> str:
        return f"{self.manifest.get('name', 'cross-encoder')}@{self.manifest.get('version', '0')}"

    def encode_pair(self, query: str, passage: str) -> tuple[list[int], list[int], list[int]]:
        """(input_ids, attention_mask, token_type_ids) of one pair under the 512/64 rule."""
        ids, types = pair_ids(self._tok, query, passage, self.max_tokens, self.query_max_tokens)
        return ids, [1] * len(ids), types

    def _encode_all(self, query: str, passages: list[str]) -> list[tuple[list[int], list[int]]]:
        q = self._tok.encode(query, add_special_tokens=False).ids
        enc = self._tok.encode_batch(list(passages), add_special_tokens=False)
        return [_assemble(q, e.ids, self._cls, self._sep, self.max_tokens, self.query_max_tokens)
                for e in enc]

    def logits(self, query: str, passages: list[str], batch_size: int = 1) -> list[float]:
        """Calibrated logits, one per passage, in the order given.

        ``batch_size`` 1 (the default) is both the fastest on one thread (no padding) and exact:
        the int8 model quantises activations per run, so pairs padded into one batch shift each
        other's scores slightly (seen: up to 0.06 in probability).  Larger batches group pairs
        of similar length (sorted by length, order restored).
        """
        if not passages:
            return []
        pairs = self._encode_all(query, passages)
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
        out = np.zeros(len(pairs), dtype=np.float64)
        bs = max(1, int(batch_size))
        for s in range(0, len(order), bs):
            idx = order[s:s + bs]
            width = max(len(pairs[i][0]) for i in idx)
            ids = np.full((len(idx), width), self._pad, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            types = np.zeros((len(idx), width), dtype=np.int64)
            for r, i in enumerate(idx):
                a, t = pairs[i]
                ids[r, :len(a)] = a
                mask[r, :len(a)] = 1
                types[r, :len(t)] = t
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            feed = {k: v for k, v in feed.items() if k in self._inputs}
            res = self._session.run(None, feed)[0].reshape(-1)
            out[idx] = res
        return [float(x) for x in out]

    def score(self, query: str, passages: list[str], batch_size: int = 1) -> list[float]:
        """Probabilities (sigmoid of the calibrated logit), one per passage, in the order given."""
        lg = np.asarray(self.logits(query, passages, batch_size=batch_size), dtype=np.float64)
        return [float(x) for x in _sigmoid(lg)]


def load_cross_encoder(path: str | Path | None = None, threads: int = 1) -> CrossEncoder:
    """Load the cross-encoder from ``path`` (default: $WSCTX_RERANKER_DIR or the shipped one)."""
    folder = Path(path or os.environ.get(ENV_DIR) or DEFAULT_DIR)
    problems = verify(folder)
    if problems:
        raise ModelUnavailable(f"cross-encoder at {folder} is unusable: " + "; ".join(problems))
    manifest = read_manifest(folder)
    model_file = manifest["model_file"]
    tok_file = manifest["tokenizer_file"]
    try:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / tok_file))
        tok.no_truncation()
        tok.no_padding()
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, int(threads))
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        # no arena: it keeps the peak of the largest batch (+150 MB at 4 x 512 tokens) for good
        so.enable_cpu_mem_arena = False
        so.enable_mem_pattern = False
        sess = ort.InferenceSession(str(folder / model_file), sess_options=so,
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime/tokenizers errors have no common base class
        raise ModelUnavailable(f"cross-encoder could not be loaded from {folder}: {exc}") from None
    return CrossEncoder(sess, tok, manifest, folder)
