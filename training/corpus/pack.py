"""Pack the mined queries into one compressed file that a training run carries.

    python -m training.corpus.pack [--max-mib 35]

Reads ``<work>/mined/*.jsonl.gz`` (``training.corpus.mine``) for the repositories of the
manifest and writes ``<work>/pack.jsonl.xz``:

* line 1, ``{"t": "meta", ...}``: format version, manifest digest, the caps, counts;
* ``{"t": "p", "id": N, "text": ...}``: each passage text once (ids in order of first use);
* ``{"t": "q", "repo", "split", "kind", "commit", "query", "pos": [[id, path, start, end], ...],
  "neg": [...]}``: each query, its positives and hard negatives by passage id, with provenance.

Queries are taken per repository up to ``--changes`` and ``--docs`` (chosen by a hash of the
commit and question, so the same mined files give the same pack), with at most
``--positives`` positives and ``--negatives`` negatives each. When the pack would exceed
``--max-mib``, the caps shrink in proportion and it is written again. The same input and caps
give the same bytes. Statistics per repository, language and filter go to
``training/corpus/stats.json`` (committed; it holds counts, no text).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import lzma
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from training.corpus.mine import MANIFEST, WORK, load_manifest

FORMAT = 1
STATS = Path(__file__).resolve().parent / "stats.json"


def _order(row: dict) -> str:
    return hashlib.sha1((row["commit"] + "\0" + row["query"]).encode()).hexdigest()


def read_mined(mined: Path, entries: list[dict]) -> dict[str, list[dict]]:
    """Every mined row of each manifest repository that has been mined, by repository."""
    out: dict[str, list[dict]] = {}
    for e in entries:
        path = mined / (e["repo"].replace("/", "+") + ".jsonl.gz")
        if path.exists():
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                out[e["repo"]] = [json.loads(line) for line in fh]
    return out


def build(rows_by_repo: dict[str, list[dict]], split_of: dict[str, str], changes: int, docs: int, positives: int,
          negatives: int, manifest_digest: str) -> tuple[bytes, dict[str, Any]]:
    """The compressed pack and its counts."""
    chosen_rows: list[tuple[str, str, dict]] = []
    counts: Counter = Counter()
    for repo in sorted(rows_by_repo):
        rows = rows_by_repo[repo]
        for kind, cap in (("change", changes), ("doc", docs)):
            chosen = sorted((r for r in rows if r["kind"] == kind), key=_order)[:cap]
            for r in sorted(chosen, key=lambda r: (r["commit"], r["query"])):
                chosen_rows.append((repo, kind, r))
                counts[f"{split_of[repo]}_{kind}"] += 1
    # passages ordered by repository, path and line, so that a file's versions lie side by side
    # for the compressor (the same chunk at many commits differs by a few lines)
    where: dict[str, tuple] = {}
    for repo, _, r in chosen_rows:
        for p in r["positives"][:positives] + r["negatives"][:negatives]:
            key = (repo, p["path"], p["start"], p["text"])
            if p["text"] not in where or key < where[p["text"]]:
                where[p["text"]] = key
    passages = [k[3] for k in sorted(where.values())]
    texts = {t: i for i, t in enumerate(passages)}

    def ref(p: dict) -> list:
        return [texts[p["text"]], p["path"], p["start"], p["end"]]

    queries = [{"t": "q", "repo": repo, "split": split_of[repo], "kind": kind, "commit": r["commit"], "query": r["query"],
                "pos": [ref(p) for p in r["positives"][:positives]], "neg": [ref(n) for n in r["negatives"][:negatives]]}
               for repo, kind, r in chosen_rows]
    meta = {"t": "meta", "format": FORMAT, "manifest_sha256": manifest_digest, "passages": len(passages),
            "caps": {"changes": changes, "docs": docs, "positives": positives, "negatives": negatives},
            "queries": dict(sorted(counts.items()))}
    buf = io.BytesIO()
    with lzma.open(buf, "wb", preset=9) as fh:
        fh.write((json.dumps(meta, sort_keys=True) + "\n").encode())
        for i, text in enumerate(passages):
            fh.write((json.dumps({"t": "p", "id": i, "text": text}, ensure_ascii=False) + "\n").encode())
        for q in queries:
            fh.write((json.dumps(q, ensure_ascii=False, sort_keys=True) + "\n").encode())
    return buf.getvalue(), meta


def read_pack(path: Path) -> tuple[dict, list[str], list[dict]]:
    """``(meta, passages, queries)`` of a pack file."""
    passages: list[str] = []
    queries: list[dict] = []
    with lzma.open(path, "rt", encoding="utf-8") as fh:
        meta = json.loads(fh.readline())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: pack format {meta.get('format')}, this tool reads {FORMAT}")
        for line in fh:
            row = json.loads(line)
            if row["t"] == "p":
                passages.append(row["text"])
            else:
                queries.append(row)
    return meta, passages, queries


def corpus_stats(mined: Path, entries: list[dict], meta: dict, size: int) -> dict[str, Any]:
    """Counts per repository, per language and in total, after each filter, with the pack's size."""
    per_repo = {}
    by_lang: dict[str, Counter] = defaultdict(Counter)
    total: Counter = Counter()
    for e in entries:
        path = mined / (e["repo"].replace("/", "+") + ".stats.json")
        if not path.exists():
            continue
        s = json.loads(path.read_text())
        keep = {k: v for k, v in s.items() if isinstance(v, int)}
        per_repo[e["repo"]] = {"language": e["language"], "split": e["split"], **keep}
        by_lang[e["language"]].update(keep)
        total.update(keep)
    return {"repositories_mined": len(per_repo), "repositories_in_manifest": len(entries),
            "total": dict(sorted(total.items())), "by_language": {k: dict(sorted(v.items())) for k, v in sorted(by_lang.items())},
            "pack": {"bytes": size, "mib": round(size / 2**20, 2), **{k: v for k, v in meta.items() if k != "t"}},
            "per_repository": per_repo}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", type=Path, default=MANIFEST)
    ap.add_argument("--mined", type=Path, default=WORK / "mined")
    ap.add_argument("--out", type=Path, default=WORK / "pack.jsonl.xz")
    ap.add_argument("--stats", type=Path, default=STATS)
    ap.add_argument("--changes", type=int, default=1000, help="change queries per repository")
    ap.add_argument("--docs", type=int, default=600, help="docstring queries per repository")
    ap.add_argument("--positives", type=int, default=3)
    ap.add_argument("--negatives", type=int, default=4)
    ap.add_argument("--max-mib", type=float, default=35.0)
    args = ap.parse_args(argv)
    entries = load_manifest(args.manifest)
    digest = hashlib.sha256(args.manifest.read_bytes()).hexdigest()
    rows = read_mined(args.mined, entries)
    if not rows:
        print(f"nothing mined under {args.mined}: run python -m training.corpus.mine first", file=sys.stderr)
        return 2
    split_of = {e["repo"]: e["split"] for e in entries}
    changes, docs = args.changes, args.docs
    for _ in range(4):
        data, meta = build(rows, split_of, changes, docs, args.positives, args.negatives, digest)
        mib = len(data) / 2**20
        print(f"pack: {mib:.1f} MiB, {meta['passages']} passages, {meta['queries']} (caps {changes}/{docs})", file=sys.stderr)
        if mib <= args.max_mib:
            break
        shrink = args.max_mib / mib * 0.97
        changes, docs = int(changes * shrink), int(docs * shrink)
    else:
        print(f"could not fit the pack in {args.max_mib} MiB", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.rename(args.out)
    args.stats.write_text(json.dumps(corpus_stats(args.mined, entries, meta, len(data)), indent=1) + "\n")
    print(f"wrote {args.out} and {args.stats}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
