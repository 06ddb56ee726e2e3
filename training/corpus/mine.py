"""Mine one repository's history into change -> code and docstring -> definition queries.

    python -m training.corpus.mine [--repo OWNER/NAME ...] [--jobs 2]

Reads the manifest (``training/corpus/manifest.json``), the bare git directories under
``--mirror`` (one ``OWNER+NAME/repo`` each, as the session's fetch tool lays them) and writes
``<out>/<OWNER+NAME>.jsonl.gz`` per repository, plus ``<OWNER+NAME>.stats.json`` with the count
after each filter. A repository whose two files exist is done and skipped, so a killed run
resumes where it stopped; output is deterministic for a given manifest.

Change -> code (``kind: change``), for each commit reachable from the pinned commit, newest first:
  * the question is ``rules.clean_message`` of its message; ``rules.message_skip_reason`` (over
    the whole history) drops bots, merges without a description, short subjects and sweeps, and
    ``rules.files_skip_reason`` commits touching no or more than ``rules.MAX_SOURCE_FILES``
    non-test source files;
  * the tree is the first parent's (the state the question was asked against);
  * positives are the product's chunks (``chunk_text``, SPEC §1 settings) of the modified source
    files at the parent that overlap the lines the commit changed (``-w``: a whitespace-only
    change leaves none, and such a commit counts as ``whitespace_only``);
  * hard negatives are chunks of other files at the parent, ranked by BM25 over the product's
    keyword texts: candidate files from a whole-file BM25 over the pinned tree, their chunks read
    at the parent and scored with that index's statistics; a negative nearly equal to a positive
    is dropped (``rules.near_duplicate``).
Docstring -> definition (``kind: doc``), at the pinned commit: every documented definition of a
non-test source file (``docstrings.definitions``), the doc as question and the definition without
it as positive; negatives are the BM25-best chunks of the pinned tree that do not overlap it.

Each query is capped (``--max-changes``, ``--max-docs`` per repository, chosen deterministically);
the counts before the cap are in the stats.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemons.lib.chunking import Chunk, chunk_text
from daemons.lib.keywords import keyword_text, query_keywords
from daemons.lib.question import analyse
from training.corpus import rules
from daemons.lib.bm25 import Bm25
from training.corpus.docstrings import definitions
from training.corpus.git import Repo

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
WORK = HERE.parent / ".work"
MIRROR = Path(os.environ.get("WSCTX_MIRROR", "/work/.mirror"))
NEGATIVES = 4
#: Candidate files taken from the whole-file index for a change's negatives.
CANDIDATE_FILES = 6
#: Files of the parent scored for negatives when none of the candidates exists there.
FALLBACK_FILES = 12
MAX_FILE_BYTES = 512 * 1024


@dataclass
class Passage:
    path: str
    start: int
    end: int
    text: str

    def row(self) -> dict[str, Any]:
        return {"path": self.path, "start": self.start, "end": self.end, "text": self.text}


def _tokens(text: str, path: str) -> list[str]:
    return keyword_text(text, path).split()


class Snapshot:
    """The pinned tree of one repository: its source chunks, a chunk-level and a file-level BM25."""

    def __init__(self, repo: Repo, commit: str) -> None:
        self.paths: list[str] = []
        self.chunks: list[Passage] = []
        self.chunk_file: list[int] = []
        file_tokens: list[list[str]] = []
        chunk_tokens: list[list[str]] = []
        self.texts: dict[str, str] = {}
        for path, sha in sorted(repo.files(commit).items()):
            if not rules.is_source(path):
                continue
            text = repo.text(sha, MAX_FILE_BYTES)
            if text is None:
                continue
            chunks = chunk_text(text, path)
            if not chunks:
                continue
            fi = len(self.paths)
            self.paths.append(path)
            self.texts[path] = text
            toks: list[str] = []
            for c in chunks:
                t = _tokens(c.full_text, path)
                toks.extend(t)
                chunk_tokens.append(t)
                self.chunks.append(Passage(path, c.start_line, c.end_line, c.full_text))
                self.chunk_file.append(fi)
            file_tokens.append(toks)
        self.chunk_index = Bm25(chunk_tokens)
        self.file_index = Bm25(file_tokens)


class Miner:
    def __init__(self, repo: Repo, snapshot: Snapshot) -> None:
        self.repo = repo
        self.snap = snapshot
        self._chunks: dict[str, list[Chunk]] = {}
        self._tokens: dict[tuple[str, str], list[str]] = {}

    def tokens(self, text: str, path: str) -> list[str]:
        """``_tokens``, cached: the same chunk is scored at many commits."""
        key = (path, text)
        hit = self._tokens.get(key)
        if hit is None:
            if len(self._tokens) > 200000:
                self._tokens.clear()
            hit = self._tokens[key] = _tokens(text, path)
        return hit

    def chunks_at(self, commit: str, path: str) -> list[Chunk] | None:
        """The product's chunks of ``path`` at ``commit`` (cached by blob), None if absent."""
        data = self.repo.blob(f"{commit}:{path}")
        if data is None or len(data) > MAX_FILE_BYTES or b"\x00" in data[:8192]:
            return None
        key = hashlib.sha1(data).hexdigest()
        hit = self._chunks.get(key)
        if hit is None:
            hit = chunk_text(data.decode("utf-8", "replace"), path)
            if len(self._chunks) > 20000:
                self._chunks.clear()
            self._chunks[key] = hit
        return hit

    def change(self, commit_sha: str, parent: str, question: str, files: list[str], stats: Counter) -> dict | None:
        hunks = rules.parse_hunks(self.repo.diff(parent, commit_sha, files))
        if not hunks:
            stats["whitespace_only"] += 1
            return None
        positives: list[Passage] = []
        for path in files:
            ranges = hunks.get(path)
            if not ranges:
                continue
            chunks = self.chunks_at(parent, path)
            for c in chunks or ():
                if rules.overlaps((c.start_line, c.end_line), ranges):
                    positives.append(Passage(path, c.start_line, c.end_line, c.full_text))
        if not positives:
            stats["no_positive_chunk"] += 1
            return None
        q = query_keywords(question).split()
        changed = set(files)
        at_parent = [p for p in self.repo.files(parent) if rules.is_source(p) and p not in changed]
        present = set(at_parent)
        cand = [self.snap.paths[i] for i in self.snap.file_index.top(q, CANDIDATE_FILES * 5)]
        cand = [p for p in cand if p in present][:CANDIDATE_FILES]
        if not cand:
            # an old layout the pinned tree no longer has: any of the parent's files, by a fixed hash
            stats["negatives_from_parent_tree"] += 1
            cand = sorted(at_parent, key=lambda p: hashlib.sha1((parent + p).encode()).hexdigest())[:FALLBACK_FILES]
        scored: list[tuple[float, Passage]] = []
        for path in cand:
            chunks = self.chunks_at(parent, path)
            for c in chunks or ():
                s = self.snap.chunk_index.score_with(q, self.tokens(c.full_text, path))
                if s > 0:
                    scored.append((s, Passage(path, c.start_line, c.end_line, c.full_text)))
        scored.sort(key=lambda x: (-x[0], x[1].path, x[1].start))
        negatives = _pick_negatives([p for _, p in scored], positives, stats)
        if not negatives:
            stats["no_negative"] += 1
            return None
        return {"kind": "change", "commit": commit_sha, "parent": parent, "query": question,
                "positives": [p.row() for p in positives], "negatives": [n.row() for n in negatives]}

    def docs(self, commit: str, stats: Counter) -> list[dict]:
        out = []
        for path in self.snap.paths:
            for d in definitions(self.snap.texts[path], path):
                stats["doc_found"] += 1
                if len(d.doc.split()) < rules.MIN_SUBJECT_WORDS:
                    stats["doc_short"] += 1
                    continue
                q = query_keywords(d.doc).split()
                own = {i for i, p in enumerate(self.snap.chunks)
                       if p.path == path and p.start <= d.end_line and d.start_line <= p.end}
                pool = [self.snap.chunks[i] for i in self.snap.chunk_index.top(q, NEGATIVES * 3, exclude=own)]
                positive = Passage(path, d.start_line, d.end_line, d.passage)
                negatives = _pick_negatives(pool, [positive], stats)
                if not negatives:
                    stats["doc_no_negative"] += 1
                    continue
                out.append({"kind": "doc", "commit": commit, "parent": commit, "query": d.doc,
                            "positives": [positive.row()], "negatives": [n.row() for n in negatives]})
        return out


def _pick_negatives(pool: list[Passage], positives: list[Passage], stats: Counter) -> list[Passage]:
    out: list[Passage] = []
    for p in pool:
        if len(out) >= NEGATIVES:
            break
        if any(p.text == x.text or rules.near_duplicate(p.text, x.text) for x in positives):
            stats["negative_near_duplicate"] += 1
            continue
        if any(p.path == x.path and p.start == x.start for x in out):
            continue
        out.append(p)
    return out


def _keep(items: list[dict], cap: int) -> list[dict]:
    """At most ``cap`` items, chosen by a hash of their query and commit (deterministic, spread
    over the history rather than its newest end)."""
    if len(items) <= cap:
        return items
    ranked = sorted(items, key=lambda r: hashlib.sha1((r["commit"] + r["query"]).encode()).hexdigest())
    return ranked[:cap]


def mine_repo(entry: dict, mirror: Path, out: Path, max_changes: int, max_docs: int, max_scan: int,
              only_frames: bool = False) -> dict:
    """Mine one manifest entry into ``out``; returns its stats (see the module contract). With
    *only_frames*, only the messages that quote a traceback (``question.analyse``'s frames) are
    kept, for the ``validation-traceback`` cases; *max_docs* 0 skips the docstring pass."""
    name = entry["repo"]
    if rules.is_eval_repo(name):
        raise ValueError(f"{name} is an evaluation repository (or a copy of one): it is never mined")
    slug = name.replace("/", "+")
    target, stats_path = out / f"{slug}.jsonl.gz", out / f"{slug}.stats.json"
    if target.exists() and stats_path.exists():
        return json.loads(stats_path.read_text())
    t0 = time.time()
    repo = Repo(mirror / slug / "repo")
    pinned = entry["commit"]
    snap = Snapshot(repo, pinned)
    miner = Miner(repo, snap)
    stats: Counter = Counter()
    # first pass: the message rules alone, over the whole history (cheap)
    candidates: list[tuple[str, str, str]] = []
    for c in repo.commits(pinned):
        stats["commits"] += 1
        if not c.parents:
            stats["root"] += 1
            continue
        question = rules.clean_message(c.message)
        reason = rules.message_skip_reason(c.author, question, c.is_merge)
        if reason is None and only_frames and not analyse(question).frames:
            reason = "no_traceback"
        if reason is not None:
            stats[reason] += 1
            continue
        stats["message_ok"] += 1
        candidates.append((c.sha, c.parents[0], question))
    # second pass, over a deterministic sample of the rest: the file rules, then the diff
    order = sorted(candidates, key=lambda x: hashlib.sha1(x[0].encode()).hexdigest())[:max_scan]
    stats["sampled"] = len(order)
    changes: list[dict] = []
    for sha, parent, question in order:
        if len(changes) >= max_changes:
            break
        try:
            changed = repo.changed_files(parent, sha)
        except subprocess.CalledProcessError:  # a parent the snapshot lacks (grafted or shallow history)
            stats["git_error"] += 1
            continue
        sources = [p for s, p in changed if s in ("M", "R") and rules.is_source(p)]
        touched = [p for s, p in changed if rules.is_source(p)]
        reason = rules.files_skip_reason(touched)
        if reason is not None:
            stats[reason] += 1
            continue
        if changed and all(s == "R" for s, _ in changed):
            stats["rename_only"] += 1
            continue
        if not sources:
            stats["only_new_files"] += 1
            continue
        try:
            row = miner.change(sha, parent, question, sources, stats)
        except subprocess.CalledProcessError:
            stats["git_error"] += 1
            continue
        if row is not None:
            changes.append(row)
    stats["change_queries"] = len(changes)
    docs = miner.docs(pinned, stats) if max_docs else []
    stats["doc_queries_before_cap"] = len(docs)
    docs = _keep(docs, max_docs)
    stats["doc_queries"] = len(docs)
    repo.close()
    rows = sorted(changes + docs, key=lambda r: (r["kind"], r["commit"], r["query"]))
    tmp = target.with_suffix(".part")
    with gzip.GzipFile(tmp, "wb", mtime=0) as fh:
        for r in rows:
            fh.write((json.dumps({"repo": name, **r}, sort_keys=True, ensure_ascii=False) + "\n").encode())
    tmp.rename(target)
    result = {"repo": name, "language": entry.get("language"), "seconds": round(time.time() - t0, 1),
              "source_files": len(snap.paths), "source_chunks": len(snap.chunks), **dict(sorted(stats.items()))}
    stats_path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def load_manifest(path: Path = MANIFEST) -> list[dict]:
    return json.loads(path.read_text())["repositories"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", type=Path, default=MANIFEST)
    ap.add_argument("--mirror", type=Path, default=MIRROR)
    ap.add_argument("--out", type=Path, default=WORK / "mined")
    ap.add_argument("--repo", action="append", default=[], help="only these (owner/name); repeatable")
    ap.add_argument("--max-changes", type=int, default=1000, help="change queries kept per repository")
    ap.add_argument("--max-scan", type=int, default=2000, help="commits past the message rules looked at per repository")
    ap.add_argument("--max-docs", type=int, default=800, help="docstring queries kept per repository")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only-frames", action="store_true", help="only messages that quote a traceback (validation-traceback)")
    args = ap.parse_args(argv)
    entries = [e for e in load_manifest(args.manifest) if not args.repo or e["repo"] in args.repo]
    missing = [e["repo"] for e in entries if not (args.mirror / e["repo"].replace("/", "+") / "repo").is_dir()]
    if missing:
        print(f"missing git directories under {args.mirror} (fetch them first): {', '.join(missing)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    # biggest first, so the long ones do not start last
    entries.sort(key=lambda e: -e.get("commits", 0))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futs = {pool.submit(mine_repo, e, args.mirror, args.out, args.max_changes, args.max_docs, args.max_scan,
                            args.only_frames): e["repo"]
                for e in entries}
        for fut in futs:
            try:
                s = fut.result()
                print(f"{s['repo']:40s} {s.get('change_queries', 0):6d} change {s.get('doc_queries', 0):6d} doc "
                      f"{s['seconds']:7.1f} s", flush=True)
            except Exception as exc:  # one broken repository does not stop the rest
                print(f"{futs[fut]}: failed: {exc!r}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
