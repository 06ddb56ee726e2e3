"""SPEC's numbers and the one home of each default: the settings (or, where measurement changed one, SPEC_RANKING)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemons.lib.config import SPEC_RANKING, Settings
from models.cross_encoder import MAX_TOKENS, QUERY_MAX_TOKENS

SPEC = Path(__file__).resolve().parents[1].parent / "shared" / "SPEC.md"

#: (a phrase of SPEC with its number as the group, the product's value for it)
CLAIMS = [
    (r"maximum chunk size \(([\d,]+) characters\)", Settings.chunk_max_chars),
    (r"Chunks under (\d+)\s+characters are merged", Settings.chunk_min_chars),
    (r"starts with up to (\d+) characters of the\s+lines just before it", Settings.chunk_context_chars),
    (r"windows of (\d+) characters overlapping by \d+", Settings.window_chars),
    (r"windows of \d+ characters overlapping by (\d+)", Settings.window_overlap),
    (r"The (\d+) nearest chunks by vector distance", Settings.vector_k),
    (r"the (\d+) best by BM25", Settings.keyword_k),
    (r"restricted to the focus files, (\d+) rows each", Settings.focus_k),
    (r"reciprocal rank fusion with k = (\d+)", SPEC_RANKING["rrf_k"]),
    (r"The top (\d+) of the fused list go on", Settings.rerank_top),
    (r"at\s+most (\d+) tokens in which the question", MAX_TOKENS),
    (r"the question is capped at (\d+) tokens", QUERY_MAX_TOKENS),
    (r"below the threshold \(([\d.]+)\) are dropped", Settings.rerank_threshold),
    (r"the (three) best of the dropped are kept as near misses", Settings.near_misses),
    (r"as long as that node fits ([\d,]+) characters", Settings.widen_max_chars),
    (r"leading run of imports, up to ([\d,]+)\s+characters", Settings.imports_max_chars),
    (r"one block of at most\s+([\d,]+) characters", Settings.block_max_chars),
    (r"the snippet count \((\d+)\)", Settings.snippet_count),
    (r"a ([\d,]+)-character budget", Settings.budget_chars),
]
WORDS = {"three": 3}


@pytest.mark.skipif(not SPEC.is_file(), reason=f"{SPEC} is not beside this checkout")
@pytest.mark.parametrize("phrase, value", CLAIMS, ids=[c[0][:40] for c in CLAIMS])
def test_each_number_spec_states_is_the_products_default(phrase: str, value: float) -> None:
    """Every default SPEC states is the value of its one home (the settings, or SPEC_RANKING where the default was measured away)."""
    m = re.search(phrase, SPEC.read_text(encoding="utf-8"))
    assert m, f"SPEC no longer says {phrase!r}: update this claim and the setting together"
    raw = m.group(1).replace(",", "")
    stated = WORDS[raw] if raw in WORDS else float(raw)
    assert stated == value, f"SPEC says {raw} for {phrase!r}; the product's default is {value}"

