"""Tests for the local ONNX embedder (models/embedding.py) and its manifest checks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from models.embedding import ARTIFACTS_DIR, DEFAULT_NAME, ModelUnavailable, load_embedder
from models.manifest import verify

FOLDER = ARTIFACTS_DIR / DEFAULT_NAME

pytestmark = pytest.mark.skipif(
    not (FOLDER / "manifest.json").exists(), reason="artifact missing: run python -m training.build_embedder"
)

DATE_FN = '''def parse_date(value: str) -> datetime.date:
    """Parse an ISO date string like 2024-01-31 into a date."""
    return datetime.strptime(value, "%Y-%m-%d").date()
'''
RETRY_FN = '''def fetch_with_retry(url, attempts=5):
    for i in range(attempts):
        resp = requests.get(url, timeout=10)
        if resp.status_code < 500:
            return resp
        time.sleep(2 ** i)
    raise HTTPError(f"gave up on {url}")
'''
TEXTS = [
    DATE_FN,
    RETRY_FN,
    "class LRUCache: evicts the least recently used entry when full",
    "x",
    "def add(a, b):\n    return a + b\n" * 40,  # longer than max_tokens: truncated
]


@pytest.fixture(scope="module")
def emb():
    return load_embedder()


def test_manifest_verifies():
    """The committed artifact folder passes its own manifest checks."""
    assert verify(FOLDER) == []


def test_shape_dim_and_normalisation(emb):
    """Document and query embeddings have the manifest's dimension, float32 and unit length."""
    assert emb.dim == 384 and emb.max_tokens == 256
    assert emb.document_prefix == "" and emb.query_prefix == ""
    assert emb.model_id.startswith("minilm-l6-v2-int8@")
    d = emb.embed_documents(TEXTS)
    assert d.shape == (len(TEXTS), 384) and d.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-5)
    q = emb.embed_query("parse a date string")
    assert q.shape == (384,) and q.dtype == np.float32
    assert abs(float(np.linalg.norm(q)) - 1.0) < 1e-5
    assert emb.embed_documents([]).shape == (0, 384)


def test_query_prefers_relevant_code(emb):
    """A query about parsing dates is nearer to the date parser than to the HTTP retry loop."""
    d = emb.embed_documents([DATE_FN, RETRY_FN])
    q = emb.embed_query("parse a date string")
    assert float(d[0] @ q) > float(d[1] @ q) + 0.1


@pytest.mark.parametrize("rule", [{"batch_size": 16}, {}], ids=["16 per batch", "token-bounded"])
def test_batch_matches_single(emb, rule):
    """Embedding texts in padded batches gives nearly the same vectors as one at a time."""
    # dynamic int8 quantises activations per tensor, so batch companions move rows slightly
    batch = emb.embed_documents(TEXTS, **rule)
    single = np.stack([emb.embed_documents([t])[0] for t in TEXTS])
    cos = np.sum(batch * single, axis=1)
    assert cos.min() > 0.95 and cos.mean() > 0.98


def test_small_token_budget_keeps_rows_in_order():
    """An embedder with a tiny token budget (many batches) returns each text's vector in its place."""
    tight = load_embedder(threads=1, batch_tokens=64, batch_max=2)
    many = tight.embed_documents(TEXTS)
    single = np.stack([tight.embed_documents([t], batch_size=1)[0] for t in TEXTS])
    assert np.sum(many * single, axis=1).min() > 0.95
    with pytest.raises(ValueError):
        load_embedder(batch_max=0)


def test_order_preserved(emb):
    """Length-sorting inside a batch does not reorder the output rows."""
    fwd = emb.embed_documents(TEXTS)
    rev = emb.embed_documents(TEXTS[::-1])
    np.testing.assert_allclose(fwd, rev[::-1], atol=1e-6)
    distinct = fwd @ fwd.T
    assert np.all(np.diag(distinct) > distinct.max(axis=1) - 1e-6)


def test_deterministic(emb):
    """The same input gives the same embedding on repeated calls and a fresh load."""
    a = emb.embed_documents(TEXTS)
    b = emb.embed_documents(TEXTS)
    c = load_embedder(threads=1).embed_documents(TEXTS)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, c, atol=1e-5)


def test_missing_file_raises(tmp_path, monkeypatch):
    """A folder with the model file removed raises ModelUnavailable naming the build command."""
    folder = tmp_path / "m"
    shutil.copytree(FOLDER, folder)
    (folder / "model.int8.onnx").unlink()
    monkeypatch.setenv("WSCTX_EMBEDDER_DIR", str(folder))
    with pytest.raises(ModelUnavailable, match="training.build_embedder"):
        load_embedder()


def test_corrupted_file_raises(tmp_path, monkeypatch):
    """A tokenizer whose bytes no longer match the manifest checksum raises ModelUnavailable."""
    folder = tmp_path / "m"
    shutil.copytree(FOLDER, folder)
    with open(folder / "tokenizer.json", "ab") as f:
        f.write(b" ")
    monkeypatch.setenv("WSCTX_EMBEDDER_DIR", str(folder))
    with pytest.raises(ModelUnavailable, match="sha256"):
        load_embedder()


def test_corrupted_manifest_raises(tmp_path, monkeypatch):
    """A manifest that is not valid JSON, or lacks the file list, raises ModelUnavailable."""
    folder = tmp_path / "m"
    shutil.copytree(FOLDER, folder)
    monkeypatch.setenv("WSCTX_EMBEDDER_DIR", str(folder))
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(ModelUnavailable):
        load_embedder()
    m = json.loads((FOLDER / "manifest.json").read_text())
    del m["files"]
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelUnavailable):
        load_embedder()
