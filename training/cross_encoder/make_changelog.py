"""Mine (change note, changed code) pairs from the changelogs shipped in the pinned sdists.

The docstring pairs of ``make_data.py`` teach the cross-encoder to match a description to the
code it describes. Questions to the product are more often commit subjects and issue texts:
"``get_host`` also checks that the port is in the valid range", "Fixed regression where the
column key used for a hybrid property might be ...". A project's changelog is exactly that kind
of text, written by its maintainers, and it names what changed. So each bullet (or SQLAlchemy
``.. change::`` block) of a changelog in the same pinned sdists becomes a query, and every
definition it names that resolves to exactly one function, method or class in the non-test
source becomes a positive. Negatives per (query, positive), all from the same repository:

* 2 BM25 hard negatives over every definition (the top one and one sampled from the top 10),
  never from a file that holds a positive of the same note (at file level those are hits);
* 1 test function that mentions the named definition (the candidates the product's fused list
  most often puts above the source), or a third BM25 negative where there is none;
* 1 random definition.

The passage is what the product's chunks hold: the path line, then the definition's source with
its docstring, cut at a line boundary to 1,000 characters. Queries keep the note's words and
names, with markup, issue/PR references, user handles and links removed. Same pins, same seed,
same output (gzip mtime 0); nothing from shared/eval and none of its repositories:

    python training/cross_encoder/make_changelog.py --sdists models/.work/sdists \
        --out training/cross_encoder/data/changelog_pairs.jsonl.gz
"""
from __future__ import annotations

import argparse
import ast
import random
import re
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi

from make_data import EVAL_REPOS, PINS, SKIP_DIRS, bm25_tokens, cut, pinned_sdist, python_modules, write_pairs

#: Changelog files: top-level CHANGES/HISTORY/..., docs/changes.rst, release-note folders.
_CHANGELOG = re.compile(
    r"^(CHANGES|CHANGELOG|HISTORY|NEWS)(\.(rst|md|txt))?$"
    r"|^docs?/(changes|changelog|versions)\.(rst|md)$"
    r"|^docs?/releases?/[^/]+\.(rst|txt)$"
    r"|^doc/build/changelog/changelog_[0-9]+\.rst$",
    re.IGNORECASE,
)
_BULLET = re.compile(r"^(\s*)[-*+]\s+(\S.*)$")
_REFS = re.compile(
    r":(issue|pr|ghsa|ticket|tickets|user|bpo|cve|commit|gh)s?:`[^`]*`"
    r"|\[#\d+\]\([^)]*\)|\(#\d+\)|\bPR #\d+|\b(gh-|#)\d+\b|\bby @[\w-]+( in)?|\bThanks @?[\w-]+[^.]*\.?"
    r"|\[[^\]]*\]\(https?://[^)]*\)|<https?://[^>]*>|https?://\S+",
)
#: A name in markup: ``x``, `x`, :role:`x`, :role:`text <x>`, [`x`][x].
_MARKED = re.compile(r"(?::[a-z:]+:)?``?~?\.?([A-Za-z_][\w.]*)(?:\(\))?``?")
_MIN_WORDS, _MAX_WORDS = 5, 80


def changelog_members(tf: tarfile.TarFile) -> list[tarfile.TarInfo]:
    out = []
    for m in tf.getmembers():
        rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
        if m.isfile() and _CHANGELOG.search(rel):
            out.append(m)
    return sorted(out, key=lambda m: m.name)


def split_entries(text: str) -> list[str]:
    """Bullet items (with their continuation lines) and ``.. change::`` bodies, as raw text."""
    lines = text.split("\n")
    entries: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith(".. change::"):
            base = len(line) - len(line.lstrip())
            body, i = [], i + 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > base):
                s = lines[i].strip()
                if s and not s.startswith(":"):
                    body.append(s)
                i += 1
            entries.append(" ".join(body))
            continue
        m = _BULLET.match(line)
        if m:
            base = len(m.group(1))
            body, i = [m.group(2)], i + 1
            while i < len(lines):
                nxt = lines[i]
                if not nxt.strip():
                    # a paragraph of the same bullet continues only at a deeper indent
                    if i + 1 < len(lines) and lines[i + 1].strip() and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > base \
                            and not _BULLET.match(lines[i + 1]):
                        i += 1
                        continue
                    break
                if _BULLET.match(nxt) or len(nxt) - len(nxt.lstrip()) <= base:
                    break
                body.append(nxt.strip())
                i += 1
            entries.append(" ".join(body))
            continue
        i += 1
    return entries


def clean(entry: str) -> str:
    """The note as a person would type it: names kept, markup, references and links removed."""
    s = _REFS.sub("", entry)
    s = re.sub(r"\[`([^`]*)`\]\[[^\]]*\]", r"\1", s)
    s = re.sub(r":[a-z:]+:`([^`<]*?)\s*<[^>]*>`", r"\1", s)
    s = re.sub(r":[a-z:]+:`~?\.?([^`]*)`", r"\1", s)
    s = s.replace("``", "").replace("`", "").replace("**", "").replace("*", "")
    s = re.sub(r"\bThanks\b[^.]*\.?", "", s)
    s = re.sub(r"(?<![\w.])\.(?=[A-Za-z_])", "", s)
    s = re.sub(r"\(\s*[,;]?\s*\)", "", s)
    s = " ".join(s.split()).strip(" ,;")
    words = s.split()
    return " ".join(words[:_MAX_WORDS])


def marked_names(entry: str) -> list[str]:
    names = []
    for m in _MARKED.finditer(_REFS.sub("", entry)):
        n = m.group(1).strip(".")
        tail = n.split(".")[-1]
        # a bare lowercase word in markup is as often an argument or a value as a definition
        looks_defined = "." in n or "_" in tail.strip("_") or tail[:1].isupper() or m.group(0).rstrip("`").endswith("()")
        if len(tail) >= 4 and looks_defined and n not in names:
            names.append(n)
    return names


def iter_code(name: str, tf: tarfile.TarFile):
    """(rel, is_test, qualname, source) for every def and class of the sdist's .py files."""
    def is_test(rel: str) -> bool:
        return any(p in ("test", "tests", "testing") or p.startswith("test_") for p in rel.split("/"))

    for rel, src, tree in python_modules(tf, lambda rel: is_test(rel) or not any(p in SKIP_DIRS for p in rel.split("/"))):
        lines = src.split("\n")
        in_tests = is_test(rel)

        def walk(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    q = f"{prefix}.{child.name}" if prefix else child.name
                    start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    text = "\n".join(lines[start - 1:child.end_lineno])
                    indent = min((len(l) - len(l.lstrip()) for l in text.split("\n") if l.strip()), default=0)
                    text = "\n".join(l[indent:] for l in text.split("\n")).rstrip()
                    yield rel, in_tests, q, text
                    if isinstance(child, ast.ClassDef):
                        yield from walk(child, q)

        yield from walk(tree, "")


def resolve(name: str, by_tail: dict[str, list[int]], defs: list[dict]) -> int | None:
    """The one source definition whose qualified name ends with *name* (dotted), else None."""
    parts = name.split(".")
    # module parts may be dropped (``tornado.concurrent.chain_future``), a class part may not
    # (``Color.__hash__`` is not any ``__hash__``)
    narrowest = next((len(parts) - k for k in range(len(parts) - 1) if parts[k][:1].isupper()), 1)
    for width in range(min(len(parts), 3), min(narrowest, 3) - 1, -1):
        tail = ".".join(parts[-width:])
        hits = [i for i in by_tail.get(parts[-1], []) if defs[i]["qual"] == tail or defs[i]["qual"].endswith("." + tail)
                or (defs[i]["module"] + "." + defs[i]["qual"]).endswith("." + tail)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            return None
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdists", default="models/.work/sdists")
    ap.add_argument("--out", default="training/cross_encoder/data/changelog_pairs.jsonl.gz")
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--max-per-repo", type=int, default=700)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sd = Path(args.sdists)
    out_rows: list[dict] = []
    stats: dict[str, list[int]] = {"train": [0, 0], "val": [0, 0]}
    for name, ver, sha, role in PINS:
        assert name.lower() not in EVAL_REPOS
        p = pinned_sdist(sd, name, ver, sha)
        with tarfile.open(p) as tf:
            code = list(iter_code(name, tf))
            notes: list[str] = []
            for m in changelog_members(tf):
                notes.extend(split_entries(tf.extractfile(m).read().decode("utf-8", "replace")))
        defs = [{"path": rel, "qual": q, "module": rel[:-3].replace("/", "."), "passage": rel + "\n" + cut(text)}
                for rel, is_test, q, text in code if not is_test and len(text) >= 80]
        tests: list[dict] = []
        tests_naming: dict[str, list[int]] = defaultdict(list)  # identifier -> the tests whose code has it
        for rel, is_test, q, text in code:
            if is_test and q.split(".")[-1].startswith("test"):
                for ident in set(re.findall(r"[A-Za-z_]\w*", text)):
                    tests_naming[ident].append(len(tests))
                tests.append({"path": rel, "passage": rel + "\n" + cut(text)})
        by_tail: dict[str, list[int]] = defaultdict(list)
        for i, d in enumerate(defs):
            by_tail[d["qual"].split(".")[-1]].append(i)
        bm = BM25Okapi([bm25_tokens(d["passage"]) for d in defs])
        seen_q: set[str] = set()
        groups = []
        for raw in notes:
            q = clean(raw)
            if len(q.split()) < _MIN_WORDS or q.lower() in seen_q:
                continue
            names = marked_names(raw)
            pos = sorted({i for n in names if (i := resolve(n, by_tail, defs)) is not None})
            if not pos or len(pos) > 3:
                continue
            seen_q.add(q.lower())
            groups.append((q, pos, names))
        rng.shuffle(groups)
        groups = groups[:args.max_per_repo]
        n_groups = 0
        for gi, (q, pos, names) in enumerate(groups):
            pos_paths = {defs[i]["path"] for i in pos}
            scores = bm.get_scores(bm25_tokens(q))
            hard = [int(j) for j in np.argsort(-scores, kind="stable")[:40] if defs[int(j)]["path"] not in pos_paths][:10]
            tails = [n.split(".")[-1] for n in names]
            mentioning = [tests[ti] for ti in sorted({ti for x in tails for ti in tests_naming.get(x, [])})]
            for pi in pos:
                group = f"cl:{name}:{gi}:{pi}"
                base = {"group": group, "repo": name, "split": role, "kind": "changelog", "query": q}
                rows = [dict(base, passage=defs[pi]["passage"], label=1, neg="pos")]
                picked = hard[:1] + rng.sample(hard[1:], min(1, len(hard) - 1)) if hard else []
                for j in picked:
                    rows.append(dict(base, passage=defs[j]["passage"], label=0, neg="bm25"))
                if mentioning:
                    rows.append(dict(base, passage=rng.choice(mentioning)["passage"], label=0, neg="test"))
                elif len(hard) > 2:
                    rows.append(dict(base, passage=defs[rng.choice([h for h in hard[1:] if h not in picked])]["passage"],
                                     label=0, neg="bm25"))
                for _ in range(100):
                    j = rng.randrange(len(defs))
                    if defs[j]["path"] not in pos_paths:
                        rows.append(dict(base, passage=defs[j]["passage"], label=0, neg="random_same_repo"))
                        break
                if role == "val":
                    rows[0]["val_hard"] = [defs[j]["passage"] for j in hard[:9]]
                out_rows.extend(rows)
                stats[role][0] += 1
                stats[role][1] += len(rows)
                n_groups += 1
        print(f"{name}=={ver}: {len(notes)} notes, {len(groups)} with a resolved definition, {n_groups} groups, "
              f"{len(defs)} definitions, {len(tests)} tests", flush=True)
    out = write_pairs(out_rows, Path(args.out))
    print(f"groups/pairs: train {stats['train']}, val {stats['val']} -> {out}")


if __name__ == "__main__":
    main()
