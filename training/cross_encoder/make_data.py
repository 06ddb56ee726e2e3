"""Mine query-code pairs for the cross-encoder from pinned PyPI source distributions.

Deterministic: the same sdists (pinned by version and sha256 below) and the same seed give the
same file.  Run in the training venv (needs rank-bm25, numpy):

    pip download --no-deps --no-binary :all: NAME==VER -d models/.work/sdists   (for each pin)
    python training/cross_encoder/make_data.py --sdists models/.work/sdists \
        --out training/cross_encoder/data/pairs.jsonl.gz

Queries are written from the code's own documentation (nobody on this project wrote them):
the first sentence of a function's or class's docstring, its first paragraph, the name split
into words, and commit/issue-like phrasings built from those.  The passage is the definition's
source with its docstring removed, cut to about 1,000 characters at a line boundary (the SPEC's
chunk size), with the relative path on the first line.  Negatives per query: hard ones from BM25
over the same repository, a random one from the same repository and a random one from another.

None of the repositories of shared/eval (astropy, requests, flask, click, httpx, pytest, pylint,
seaborn, sphinx, sympy, xarray) is used, and nothing is read from shared/eval.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import random
import re
import tarfile
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi

# name, version, sha256 of the sdist, role
PINS = [
    ("attrs", "26.1.0", "d03ceb89cb322a8fd706d4fb91940737b6642aa36998fe130a9bc96c985eff32", "train"),
    ("rich", "15.0.0", "edd07a4824c6b40189fb7ac9bc4c52536e9780fbbfbddf6f1e2502c31b068c36", "train"),
    ("jinja2", "3.1.6", "0137fb05990d35f1275a587e9aee6d56da821fc83491a0fb838183be43f66d6d", "train"),
    ("werkzeug", "3.1.9", "55ca7c70a75689be937aa27f8ff4b018f06ff4838fc73045560bf0f5a1291060", "train"),
    ("tornado", "6.6.1", "28e6311402af59c8b02e3fa0f5e7d8eb465b25081381803b127d97e6a4395d5a", "train"),
    ("networkx", "3.6.1", "26b7c357accc0c8cde558ad486283728b65b6a95d85ee1cd66bafab4c8168509", "train"),
    ("more_itertools", "11.2.1", "cbf08fd0af284dc69718b9b76a8e6203df624d70209ea511e4219d350c856f63", "train"),
    ("pyparsing", "3.3.3", "928ae7e20211f3b6f3915a72f06a0cfd29ab9d24279dd6346b6b1a7146397d36", "train"),
    ("pydantic", "2.14.4", "7c19f1d46f8accf55a4617a6116e1ade64840870f397b846a2c53fb9019414ba", "train"),
    ("sqlalchemy", "2.1.9", "d700a8b2edfb26282a470333d6bc4a454c4acda4d201a3bea7b72fa76c217d28", "train"),
    ("django", "5.2.19", "ad03d8abc51dbff95ebf34b27123cf0c26a3b62db7ba0cd520783686362533d1", "train"),
    ("docutils", "0.23", "746f5060322511280a1e50eb76846ed6bf2342984b2ac04dc42caa1a8d78799e", "train"),
    ("arrow", "1.4.0", "ed0cc050e98001b8779e84d461b0098c4ac597e88704a655582b21d116e526d7", "train"),
    # held out by repository for validation
    ("marshmallow", "4.4.0", "9e6ffa8511012ca89732324c1c253efd7b4d35632dcbdf80aa793fe01804af3e", "val"),
    ("toolz", "1.2.0", "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490", "val"),
    ("boltons", "26.2.0", "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c", "val"),
]
EVAL_REPOS = {"astropy", "requests", "flask", "click", "httpx", "pytest", "pylint", "seaborn",
              "sphinx", "sympy", "xarray"}
MAX_PASSAGE_CHARS = 1000
STOP = set("""a an the of to in on for and or is are be by with as at from that this it its
into if not no do does when which what how where why we i you use used using return returns
should can will may all any""".split())
SKIP_DIRS = ("test", "tests", "testing", "docs", "doc", "examples", "example", "benchmarks",
             "scripts", "_vendor", "locale", "conf")


def pinned_sdist(folder: Path, name: str, ver: str, sha: str) -> Path:
    """The downloaded sdist of a pin, its sha256 checked; exits with the download command if absent."""
    cands = list(folder.glob(f"{name}-{ver}.tar.gz")) + list(folder.glob(f"{name.replace('_', '-')}-{ver}.tar.gz"))
    if not cands:
        raise SystemExit(f"missing sdist {name}=={ver}: pip download --no-deps --no-binary :all: {name}=={ver} -d {folder}")
    got = hashlib.sha256(cands[0].read_bytes()).hexdigest()
    if got != sha:
        raise SystemExit(f"sha256 mismatch for {cands[0]}: {got}")
    return cands[0]


def write_pairs(rows: list[dict], out: Path) -> Path:
    """Write *rows* as gzipped JSON lines, byte-for-byte reproducible (sorted keys, gzip mtime 0)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as g:
        for row in rows:
            g.write((json.dumps(row, sort_keys=True) + "\n").encode("utf-8"))
    return out


def split_ident(tok: str) -> list[str]:
    parts = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", tok).replace("_", " ").split()
    return [p.lower() for p in parts if p]


def bm25_tokens(text: str) -> list[str]:
    out: list[str] = []
    for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text):
        low = w.lower()
        if low in STOP or len(low) < 2:
            continue
        out.append(low)
        sub = split_ident(w)
        if len(sub) > 1:
            out.extend(s for s in sub if s not in STOP and len(s) > 1)
    return out


def first_sentence(doc: str) -> str:
    para = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    para = " ".join(para.split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return (m.group(1) if m else para).strip()


def first_paragraph(doc: str) -> str:
    return " ".join(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split())


def strip_docstring(src_lines: list[str], node: ast.AST) -> str | None:
    """Source of node with its docstring statement removed, dedented."""
    body = node.body  # type: ignore[attr-defined]
    d = body[0]
    start = node.lineno  # type: ignore[attr-defined]
    if getattr(node, "decorator_list", None):
        start = min(x.lineno for x in node.decorator_list)  # type: ignore[attr-defined]
    lines = src_lines[start - 1:node.end_lineno]  # type: ignore[attr-defined]
    d0, d1 = d.lineno - start, d.end_lineno - start
    kept = lines[:d0] + lines[d1 + 1:]
    if len(kept) < 3:
        return None
    indent = min((len(l) - len(l.lstrip()) for l in kept if l.strip()), default=0)
    return "\n".join(l[indent:] for l in kept).rstrip()


def cut(text: str, limit: int = MAX_PASSAGE_CHARS) -> str:
    if len(text) <= limit:
        return text
    out, n = [], 0
    for line in text.split("\n"):
        if n + len(line) + 1 > limit and out:
            break
        out.append(line[:limit])
        n += len(line) + 1
    return "\n".join(out)


def good_doc(s: str) -> bool:
    words = s.split()
    if not 4 <= len(words) <= 45:
        return False
    low = s.lower()
    bad = ("deprecated", "todo", "xxx", "internal use", "see ", ":meta", "copyright",
           "initialize self", "implement ", "pragma", "same as", "alias for", "backwards compat")
    return not any(b in low for b in bad) and not s.startswith((">>>", ":", "..", "@"))


def python_modules(tf: tarfile.TarFile, keep=lambda rel: True):
    """(path inside the sdist's top folder, source, ast) of its .py files that *keep* and that parse, by name."""
    for m in sorted((m for m in tf.getmembers() if m.isfile() and m.name.endswith(".py")), key=lambda m: m.name):
        rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
        if not keep(rel):
            continue
        try:
            src = tf.extractfile(m).read().decode("utf-8")
            tree = ast.parse(src)
        except Exception:
            continue
        yield rel, src, tree


def iter_definitions(name: str, tar_path: Path):
    def keep(rel: str) -> bool:
        if any(p in SKIP_DIRS or p.startswith("test_") for p in rel.split("/")):
            return False
        return name != "django" or rel.startswith(("django/db/", "django/utils/", "django/http/", "django/core/",
                                                   "django/forms/", "django/template/", "django/urls/"))

    with tarfile.open(tar_path) as tf:
        for rel, src, tree in python_modules(tf, keep):
            src_lines = src.split("\n")
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                doc = ast.get_docstring(node)
                if not doc or node.name.startswith("__") and node.name != "__init__":
                    continue
                code = strip_docstring(src_lines, node)
                if not code or len(code) < 120:
                    continue
                sent = first_sentence(doc)
                if not good_doc(sent):
                    continue
                yield {"repo": name, "path": rel, "name": node.name, "sentence": sent,
                       "paragraph": first_paragraph(doc), "passage": rel + "\n" + cut(code)}


def lower_first(s: str) -> str:
    return s[:1].lower() + s[1:] if s else s


def make_query(d: dict, rng: random.Random) -> tuple[str, str]:
    s = d["sentence"].rstrip(".")
    name_words = " ".join(split_ident(d["name"]))
    r = rng.random()
    if r < 0.40:
        return d["sentence"], "sentence"
    if r < 0.52:
        t = rng.choice(["how to {}", "where do we {}?", "code that {}", "how does it {}?"])
        return t.format(lower_first(s)), "question"
    if r < 0.64 and len(name_words.split()) >= 2:
        return name_words, "name"
    if r < 0.76:
        t = rng.choice(["Fix {n}: {s}", "{s} in {n}", "Make {n} {s2}", "Refactor {n}"])
        return t.format(n=d["name"], s=lower_first(s), s2=lower_first(s)), "commit"
    if r < 0.88 and len(d["paragraph"].split()) > len(d["sentence"].split()) + 3:
        return d["paragraph"], "paragraph"
    t = rng.choice(["`{n}` does not work as expected. It should {s}. Is this a bug?",
                    "I need to {s} - where is that done?",
                    "Question about {p}: what handles the case where we {s}?"])
    return t.format(n=d["name"], s=lower_first(s), p=d["path"].rsplit("/", 1)[-1]), "issue"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdists", default="models/.work/sdists")
    ap.add_argument("--out", default="training/cross_encoder/data/pairs.jsonl.gz")
    ap.add_argument("--train-per-repo", type=int, default=230)
    ap.add_argument("--val-per-repo", type=int, default=90)
    ap.add_argument("--hard", type=int, default=2)
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args()
    sd = Path(args.sdists)
    rng = random.Random(args.seed)
    per_repo: dict[str, list[dict]] = {}
    roles = {}
    for name, ver, sha, role in PINS:
        assert name.lower() not in EVAL_REPOS
        p = pinned_sdist(sd, name, ver, sha)
        defs = list(iter_definitions(name, p))
        # dedupe identical passages / sentences
        seen, uniq = set(), []
        for d in defs:
            k = (d["sentence"].lower(), d["passage"])
            if k in seen:
                continue
            seen.add(k)
            uniq.append(d)
        per_repo[name] = uniq
        roles[name] = role
        print(f"{name}=={ver}: {len(uniq)} documented definitions")
    all_defs = [(r, i) for r in per_repo for i in range(len(per_repo[r]))]
    out_rows = []
    stats = {"train": [0, 0], "val": [0, 0]}
    for name, _, _, role in PINS:
        defs = per_repo[name]
        bm = BM25Okapi([bm25_tokens(d["passage"]) for d in defs])
        n_take = args.train_per_repo if role == "train" else args.val_per_repo
        idx = list(range(len(defs)))
        rng.shuffle(idx)
        for qi in idx[:n_take]:
            d = defs[qi]
            q, kind = make_query(d, rng)
            scores = bm.get_scores(bm25_tokens(q))
            order = np.argsort(-scores, kind="stable")
            hard = []
            for j in order[:30]:
                j = int(j)
                if j == qi or defs[j]["name"] == d["name"] or defs[j]["sentence"].lower() == d["sentence"].lower():
                    continue
                hard.append(j)
                if len(hard) >= 10:
                    break
            group = f"{name}:{qi}"
            rows = [{"group": group, "repo": name, "split": role, "kind": kind, "query": q,
                     "passage": d["passage"], "label": 1, "neg": "pos"}]
            picked = hard[:1] + rng.sample(hard[1:], min(args.hard - 1, len(hard) - 1)) if hard else []
            for j in picked:
                rows.append({"group": group, "repo": name, "split": role, "kind": kind, "query": q,
                             "passage": defs[j]["passage"], "label": 0, "neg": "bm25"})
            j = rng.randrange(len(defs))
            if j != qi:
                rows.append({"group": group, "repo": name, "split": role, "kind": kind, "query": q,
                             "passage": defs[j]["passage"], "label": 0, "neg": "random_same_repo"})
            while True:
                r2, j2 = all_defs[rng.randrange(len(all_defs))]
                if r2 != name:
                    break
            rows.append({"group": group, "repo": name, "split": role, "kind": kind, "query": q,
                         "passage": per_repo[r2][j2]["passage"], "label": 0, "neg": "random_other_repo"})
            if role == "val":  # full hard-negative list for the MRR measure
                rows[0]["val_hard"] = [defs[j]["passage"] for j in hard[:9]]
            out_rows.extend(rows)
            stats[role][0] += 1
            stats[role][1] += len(rows)
    out = write_pairs(out_rows, Path(args.out))
    print(f"queries/pairs: train {stats['train']}, val {stats['val']} -> {out}")


if __name__ == "__main__":
    main()
