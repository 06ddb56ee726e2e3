"""The cross-encoder reranker: the 512/64 rule, calibration against the 0.08 threshold, loading."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from models.cross_encoder import (DEFAULT_DIR, MAX_TOKENS, QUERY_MAX_TOKENS, ModelUnavailable,
                                  load_cross_encoder)

THRESHOLD = 0.08


@pytest.fixture(scope="module")
def ce():
    return load_cross_encoder()


def _split(ids, types):
    """(question ids, passage ids) of one encoded pair, checked for its frame."""
    cls, sep = ids[0], ids[-1]
    first_sep = ids.index(sep)
    assert ids[first_sep] == sep and ids[-1] == sep and ids[0] == cls
    assert types[:first_sep + 1] == [0] * (first_sep + 1)
    assert types[first_sep + 1:] == [1] * (len(ids) - first_sep - 1)
    return ids[1:first_sep], ids[first_sep + 1:-1]


def _passage_ids(ce, text):
    return ce._tok.encode(text, add_special_tokens=False).ids


LONG_QUESTION = " ".join(f"word{i} alpha beta" for i in range(200))
CODE_LINE = "    total = compute_value(item, offset) + 1\n"


def test_long_question_is_cut_to_64_tokens(ce):
    """A question longer than 64 tokens keeps exactly its first 64 tokens."""
    ids, mask, types = ce.encode_pair(LONG_QUESTION, "pkg/mod.py\ndef f():\n    return 1\n")
    q, _ = _split(ids, types)
    full = _passage_ids(ce, LONG_QUESTION)
    assert len(full) > QUERY_MAX_TOKENS
    assert q == full[:QUERY_MAX_TOKENS]


def test_pair_never_exceeds_512_tokens(ce):
    """However long question and passage are, the pair is at most 512 tokens, mask and types alike."""
    passage = "pkg/big.py\n" + CODE_LINE * 400
    for question in ("short question", LONG_QUESTION):
        ids, mask, types = ce.encode_pair(question, passage)
        assert len(ids) == MAX_TOKENS == len(mask) == len(types)
        assert mask == [1] * len(ids)


def test_passage_fills_the_room_the_question_leaves(ce):
    """A too-long passage gets exactly 512 - 3 - len(question) tokens, from its head."""
    passage = "pkg/big.py\n" + CODE_LINE * 400
    full = _passage_ids(ce, passage)
    for question in ("where is the total computed", LONG_QUESTION):
        ids, _, types = ce.encode_pair(question, passage)
        q, p = _split(ids, types)
        assert len(p) == MAX_TOKENS - 3 - len(q)
        assert p == full[:len(p)]


def test_passage_tail_kept_despite_long_question(ce):
    """A passage of up to 445 tokens is read whole, tail included, even after a very long question."""
    body = "pkg/mod.py\n" + CODE_LINE * 30 + "    return final_sentinel_value\n"
    full = _passage_ids(ce, body)
    assert 300 < len(full) <= MAX_TOKENS - 3 - QUERY_MAX_TOKENS
    ids, _, types = ce.encode_pair(LONG_QUESTION, body)
    _, p = _split(ids, types)
    assert p == full


# Hand-written for these tests (not from shared/eval): a question, the passage that answers it,
# and a passage from an unrelated part of an imaginary code base.
CASES = [
    ("how do we parse an ISO 8601 date string?",
     "src/timeutil/parse.py\ndef parse_iso_date(text: str) -> datetime.date:\n"
     "    year, month, day = text.strip().split(\"-\")\n"
     "    return datetime.date(int(year), int(month), int(day))\n",
     "src/ui/colors.py\ndef blend(c1, c2, t):\n    r = c1[0] * (1 - t) + c2[0] * t\n"
     "    g = c1[1] * (1 - t) + c2[1] * t\n    b = c1[2] * (1 - t) + c2[2] * t\n"
     "    return (int(r), int(g), int(b))\n"),
    ("retry the HTTP request with exponential backoff when the server returns 503",
     "client/transport.py\nasync def send_with_retry(self, request, attempts=5):\n"
     "    delay = 0.5\n    for attempt in range(attempts):\n"
     "        response = await self._send(request)\n"
     "        if response.status_code != 503:\n            return response\n"
     "        await asyncio.sleep(delay)\n        delay *= 2\n    return response\n",
     "app/templates/filters.py\ndef slugify(value):\n"
     "    value = unicodedata.normalize('NFKD', value).encode('ascii', 'ignore').decode()\n"
     "    value = re.sub(r'[^\\w\\s-]', '', value.lower())\n"
     "    return re.sub(r'[-\\s]+', '-', value).strip('-_')\n"),
    ("Fix cache entries never expiring after their ttl",
     "storage/cache.py\nclass TTLCache:\n    def __init__(self, ttl):\n        self.ttl = ttl\n"
     "        self._data = {}\n\n    def get(self, key):\n        value, stored = self._data[key]\n"
     "        if time.monotonic() - stored > self.ttl:\n            del self._data[key]\n"
     "            raise KeyError(key)\n        return value\n",
     "cli/progress.py\ndef render_bar(done, total, width=40):\n"
     "    filled = int(width * done / max(total, 1))\n"
     "    return '[' + '#' * filled + ' ' * (width - filled) + ']'\n"),
    ("where is the config file read from disk?",
     "settings/loader.py\ndef load_config(path=None):\n    path = path or os.path.expanduser('~/.apprc')\n"
     "    with open(path, encoding='utf-8') as fh:\n        data = tomllib.loads(fh.read())\n"
     "    return Config(**data)\n",
     "geometry/shapes.py\ndef polygon_area(points):\n    area = 0.0\n"
     "    for (x1, y1), (x2, y2) in zip(points, points[1:] + points[:1]):\n"
     "        area += x1 * y2 - x2 * y1\n    return abs(area) / 2\n"),
]


@pytest.mark.parametrize("question,relevant,unrelated", CASES)
def test_relevant_passage_kept_and_ranked_above_unrelated(ce, question, relevant, unrelated):
    """The passage that answers the question passes 0.08 and outscores an unrelated one."""
    rel, unrel = ce.score(question, [relevant, unrelated])
    assert rel > THRESHOLD
    assert rel > unrel


def test_unrelated_passages_mostly_dropped(ce):
    """Passages answering other questions fall below 0.08 for most of the questions."""
    dropped = total = 0
    for i, (question, _, _) in enumerate(CASES):
        others = [c[1] for j, c in enumerate(CASES) if j != i] + [c[2] for c in CASES]
        scores = ce.score(question, others)
        dropped += sum(s < THRESHOLD for s in scores)
        total += len(scores)
    assert dropped / total >= 0.75


def test_probabilities_in_open_unit_interval(ce):
    """Every score is a probability strictly between 0 and 1, one per passage, and none for none."""
    passages = [c[1] for c in CASES] + [c[2] for c in CASES] + ["x.py\n"]
    scores = ce.score("how is the area of a polygon computed?", passages)
    assert len(scores) == len(passages)
    assert all(0.0 < s < 1.0 for s in scores)
    assert ce.score("anything", []) == []


def test_batching_does_not_change_scores(ce):
    """A passage's score does not depend on its neighbours or order; bigger batches only add int8 noise."""
    passages = [c[1] for c in CASES] + [c[2] for c in CASES]
    q = CASES[1][0]
    one = ce.score(q, passages)
    assert ce.score(q, passages[::-1])[::-1] == pytest.approx(one, abs=1e-9)
    assert [ce.score(q, [p])[0] for p in passages] == pytest.approx(one, abs=1e-9)
    for bs in (3, 4, 12):  # activations are quantised per run: padded batches shift scores a little
        batched = ce.score(q, passages, batch_size=bs)
        assert batched == pytest.approx(one, abs=0.1)
        assert sorted(range(len(one)), key=one.__getitem__)[-2:] == \
            sorted(range(len(one)), key=batched.__getitem__)[-2:]


def test_model_id_and_manifest(ce):
    """The model names itself and its manifest states the 512/64 rule and the logit output."""
    assert ce.model_id
    assert ce.manifest["max_tokens"] == 512 and ce.manifest["query_max_tokens"] == 64
    assert "logit" in ce.manifest["output"]


def test_missing_model_raises_model_unavailable(tmp_path):
    """An empty or absent folder gives ModelUnavailable, not a crash."""
    with pytest.raises(ModelUnavailable, match="missing"):
        load_cross_encoder(tmp_path)
    with pytest.raises(ModelUnavailable):
        load_cross_encoder(tmp_path / "nowhere")


def _copy_artifacts(dst: Path) -> Path:
    shutil.copytree(DEFAULT_DIR, dst)
    return dst


def test_corrupted_model_raises_model_unavailable(tmp_path):
    """A model file whose bytes no longer match the manifest's sha256 gives ModelUnavailable."""
    d = _copy_artifacts(tmp_path / "ce")
    model = d / "model.int8.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(ModelUnavailable, match="corrupt"):
        load_cross_encoder(d)


def test_missing_file_or_bad_manifest_raises_model_unavailable(tmp_path):
    """A deleted tokenizer or an unreadable manifest gives ModelUnavailable."""
    d = _copy_artifacts(tmp_path / "ce")
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelUnavailable, match="missing"):
        load_cross_encoder(d)
    d2 = _copy_artifacts(tmp_path / "ce2")
    (d2 / "manifest.json").write_text("{not json")
    with pytest.raises(ModelUnavailable, match="manifest"):
        load_cross_encoder(d2)


def test_env_var_overrides_default_folder(tmp_path, monkeypatch):
    """WSCTX_RERANKER_DIR points the loader at another folder."""
    monkeypatch.setenv("WSCTX_RERANKER_DIR", str(tmp_path))
    with pytest.raises(ModelUnavailable):
        load_cross_encoder()
    d = _copy_artifacts(tmp_path / "ce")
    monkeypatch.setenv("WSCTX_RERANKER_DIR", str(d))
    assert json.loads((d / "manifest.json").read_text())["name"] in load_cross_encoder().model_id
