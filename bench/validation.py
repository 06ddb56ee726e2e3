"""Validation cases: change -> code questions from the held-out repositories of the training corpus.

The ranking settings are chosen on these, never on ``../shared/eval`` (issue 19). They are built
the way ``../shared/eval/commits.jsonl`` was: one tree per repository (its pinned commit in
``training/corpus/manifest.json``, the ``validation`` split), and as questions the cleaned commit
messages of that repository's history whose changed source files all still exist in that tree
(``training.corpus.mine`` wrote them to ``training/.work/mined/``; no model was trained on them).
The gold files are the non-test source files each commit modified.

* ``validation_cases(limit)`` is at most ``limit`` cases per repository, chosen by a hash of
  commit and question (the same mined files give the same cases), in the shape of the eval cases
  plus ``tree`` and ``language``.
* ``validation_cases(LONG_LIMIT, long_only=True)`` is the ``validation-long`` set: every long
  question (an issue-sized message) of those repositories, up to ``LONG_LIMIT`` per repository.
* ``vendored_cases(limit)`` is the ``validation-vendored`` set: the same kind of cases from
  ``VENDORED_REPOS``, training repositories that keep vendored libraries in their tree (no
  validation repository does), for choosing ``vendored_weight``. None of their commits is an eval
  case; the cross-encoder's training lists came from the training repositories under 1,400
  chunks, which these are not.
* ``traceback_cases(limit)`` is the ``validation-traceback`` set: the commit messages that quote a
  traceback (``question.analyse`` finds frames in them) from ``TRACEBACK_MANIFEST``'s repositories,
  Python projects that are neither eval nor training repositories, for choosing how far the files
  of a traceback's frames are trusted. Only 3 of the 535 ``validation`` and ``validation-long``
  cases quote one (SWE-bench Lite: 29 of 140). Mined to ``training/.work/mined-traceback/``.
* ``validation_tree(repo, commit, cache)`` is the tree at the commit, unpacked once with ``git
  archive`` from the fetched git directory (``/work/.mirror/OWNER+NAME/repo``, or
  ``$WSCTX_MIRROR``) under ``<cache>/trees/val/``.

Nothing here is committed data: cases are rebuilt from the mined files and the fetched histories.

    python -m bench.validation            # per-repository counts
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from bench.repos import DEFAULT_CACHE
from daemons.lib.question import analyse
from training.corpus.mine import load_manifest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "training" / "corpus" / "manifest.json"
MINED = ROOT / "training" / ".work" / "mined"
MINED_TRACEBACK = ROOT / "training" / ".work" / "mined-traceback"
TRACEBACK_MANIFEST = ROOT / "bench" / "traceback_repos.json"
MIRROR = Path(os.environ.get("WSCTX_MIRROR") or "/work/.mirror")
#: Cases per repository: enough for a per-repository figure, few enough to index and score on 2 cores.
PER_REPO = 60
#: Long cases per repository in ``validation-long``.
LONG_LIMIT = 40
#: Training repositories with vendored libraries (``setuptools/_vendor/``, ``pkg_resources/_vendor/``).
VENDORED_REPOS = ("pypa/setuptools",)
#: Source suffixes per manifest language, for the whole-file BM25 floor.
SUFFIXES = {"python": (".py",), "go": (".go",), "rust": (".rs",), "typescript": (".ts", ".tsx", ".js"), "javascript": (".js", ".jsx", ".ts")}


def validation_repos() -> list[dict]:
    """The manifest entries of the validation split."""
    return [e for e in load_manifest(MANIFEST) if e.get("split") == "validation"]


def git_dir(repo: str) -> Path:
    return MIRROR / repo.replace("/", "+") / "repo"


def tree_files(repo: str, commit: str) -> set[str]:
    out = subprocess.run(["git", "--git-dir", str(git_dir(repo)), "ls-tree", "-r", "--name-only", commit],
                         capture_output=True, text=True, check=True).stdout
    return set(out.splitlines())


def validation_tree(repo: str, commit: str, cache: Path = DEFAULT_CACHE) -> Path:
    """The repository's tree at *commit*, unpacked once under ``<cache>/trees/val/``."""
    tree = cache / "trees" / "val" / f"{repo.replace('/', '+')}-{commit[:12]}"
    if (tree / ".complete").is_file():
        return tree
    tar = subprocess.run(["git", "--git-dir", str(git_dir(repo)), "archive", "--format=tar", commit],
                         capture_output=True, check=True).stdout
    tmp = tree.with_name(tree.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(tmp, filter="data")
    shutil.rmtree(tree, ignore_errors=True)
    tmp.rename(tree)
    (tree / ".complete").write_text(commit)
    return tree


def validation_cases(limit: int = PER_REPO, cache: Path = DEFAULT_CACHE, mined: Path = MINED, long_only: bool = False) -> list[dict]:
    """At most *limit* change -> code cases per validation repository (see the module docstring);
    with *long_only*, only the long ones (``question.Analysis.is_long``: a message with code, a
    traceback, an error line or more than 60 words), the regime of an issue report."""
    return manifest_cases(validation_repos(), limit, mined, long_only)


def vendored_cases(limit: int = PER_REPO, mined: Path = MINED) -> list[dict]:
    """At most *limit* change -> code cases from each of ``VENDORED_REPOS`` (the ``validation-vendored`` set)."""
    entries = [e for e in load_manifest(MANIFEST) if e["repo"] in VENDORED_REPOS]
    return manifest_cases(entries, limit, mined, set_name="validation-vendored")


def traceback_cases(limit: int = PER_REPO, mined: Path = MINED_TRACEBACK) -> list[dict]:
    """At most *limit* cases that quote a traceback from each of ``TRACEBACK_MANIFEST``'s
    repositories (the ``validation-traceback`` set)."""
    return manifest_cases(load_manifest(TRACEBACK_MANIFEST), limit, mined, set_name="validation-traceback")


def manifest_cases(entries: list[dict], limit: int, mined: Path = MINED, long_only: bool = False,
                   set_name: str = "validation") -> list[dict]:
    """At most *limit* change -> code cases for each manifest entry of *entries*, asked against
    its pinned tree: the mined commit messages whose modified source files all still exist there,
    chosen by a hash of commit and question. ``validation_cases`` is this over the held-out split;
    ``training.corpus.product_lists`` runs it over the training split."""
    cases: list[dict] = []
    for entry in entries:
        repo, commit = entry["repo"], entry["commit"]
        path = mined / (repo.replace("/", "+") + ".jsonl.gz")
        if not path.is_file() or not git_dir(repo).is_dir():
            continue
        present = tree_files(repo, commit)
        seen: set[str] = set()
        chosen = []
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if row["kind"] != "change" or row["query"] in seen:
                    continue
                gold = sorted({p["path"] for p in row["positives"]})
                if not gold or any(g not in present for g in gold) or (long_only and not analyse(row["query"]).is_long):
                    continue
                seen.add(row["query"])
                key = hashlib.sha1((row["commit"] + "\0" + row["query"]).encode()).hexdigest()
                chosen.append((key, {
                    "id": f"{repo.replace('/', '__')}@{row['commit'][:12]}", "repo": repo, "commit": commit,
                    "query": row["query"], "gold_files": gold, "source": "commit-message",
                    "set": f"{set_name}-long" if long_only else set_name,
                    "language": entry["language"], "asked_at": row["parent"],
                }))
        chosen.sort(key=lambda kv: kv[0])
        cases.extend(c for _, c in chosen[:limit])
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help=f"cases per repository (default {PER_REPO}, or {LONG_LIMIT} with --long)")
    ap.add_argument("--long", action="store_true", help="the validation-long set")
    args = ap.parse_args(argv)
    cases = validation_cases(args.limit or (LONG_LIMIT if args.long else PER_REPO), long_only=args.long)
    by_repo: dict[str, list[dict]] = {}
    for c in cases:
        by_repo.setdefault(c["repo"], []).append(c)
    print(f"{'repository':24s} {'cases':>5s} {'gold/case':>9s} {'query chars (median)':>21s}")
    for repo, cs in by_repo.items():
        lens = sorted(len(c["query"]) for c in cs)
        print(f"{repo:24s} {len(cs):5d} {sum(len(c['gold_files']) for c in cs) / len(cs):9.2f} {lens[len(lens) // 2]:21d}")
    print(f"{'ALL':24s} {len(cases):5d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
