"""A subset of ``product_lists``' candidate lists that weighs long questions up.

The eval's issue reports are long questions; the training lists are mostly commit subjects (median
55 characters, 10 % over 300). This writes every list whose question is longer than ``--min-chars``
(default ``question.RERANK_QUERY_CHARS``: a longer question reaches the cross-encoder condensed; ``product_lists
--long-only`` selects by ``question.Analysis.is_long`` instead, as it mines)
and that can teach an order (a candidate from a modified file and one from elsewhere), plus
``--short`` times as many of the other teachable lists drawn at random (seeded), so a run on them
does not forget short questions. With ``--short 0`` and ``--keep-all`` it makes the long half of the
validation lists, to measure with.

    python -m training.corpus.long_lists --src training/.work/lists --out training/.work/lists-long
    python -m training.corpus.long_lists --src training/.work/lists-val --out training/.work/lists-val-long --short 0 --keep-all

Output: ``OUT/lists.jsonl.gz`` (one list per line, the long ones first). Nothing here is committed.
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

from daemons.lib.question import RERANK_QUERY_CHARS

#: A question longer than this is one the cross-encoder reads condensed (``question.rerank_query``).
MIN_CHARS = RERANK_QUERY_CHARS


def teaches(row: dict) -> bool:
    """Whether a list can teach an order: a candidate from a modified file and one from elsewhere."""
    golds = sum(1 for c in row["candidates"] if c["gold"])
    return 0 < golds < len(row["candidates"])


def split_lists(src: Path, min_chars: int = MIN_CHARS, keep_all: bool = False) -> tuple[list[dict], list[dict]]:
    """(long, short) lists of *src*'s ``*.jsonl.gz`` files in file order; only teachable ones unless *keep_all*."""
    long, short = [], []
    for path in sorted(src.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if keep_all or teaches(row):
                    (long if len(row["query"]) > min_chars else short).append(row)
    return long, short


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--min-chars", type=int, default=MIN_CHARS)
    ap.add_argument("--short", type=float, default=1.0, help="short lists drawn per long one")
    ap.add_argument("--keep-all", action="store_true", help="lists that cannot teach an order too (to measure with)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    long, short = split_lists(args.src, args.min_chars, args.keep_all)
    drawn = random.Random(args.seed).sample(short, min(len(short), round(args.short * len(long))))
    args.out.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out / "lists.jsonl.gz", "wt", encoding="utf-8") as fh:
        for row in long + drawn:
            fh.write(json.dumps(row) + "\n")
    print(f"{len(long)} long and {len(drawn)} short lists (of {len(short)}) -> {args.out / 'lists.jsonl.gz'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
