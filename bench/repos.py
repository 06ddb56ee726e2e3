"""Source trees of the evaluation repositories, from their PyPI sdists, cached outside the repo.

The eval cases (``../shared/eval/*.jsonl``) name a repository and the release tag nearest to the
commit the question was asked against. This module maps that to a PyPI sdist, downloads it once
(from the index's JSON simple API, sha256 checked, else ``pip download --no-deps --no-binary :all:
NAME==VER``), unpacks it and returns the tree.

Version rule (eval README): strip a leading ``v`` or ``sympy-``; a ``.dev``/``rc``/``a``/``b``
tag means "the release just before it", looked up once with ``pip index versions NAME`` and cached
in ``<cache>/versions/NAME.json``.

    python -m bench.repos --cases commits           # fetch every tree the commit cases need
    python -m bench.repos --repo psf/requests --cache /tmp/wb

Cache layout (default ``~/.cache/wsctx-bench``, ``--cache`` / ``$WSCTX_BENCH_CACHE``)::

    sdists/NAME-VER.tar.gz     trees/NAME-VER/...     versions/NAME.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

EVAL_DIR = Path(__file__).resolve().parents[2] / "shared" / "eval"
if not EVAL_DIR.is_dir():
    EVAL_DIR = Path("/work/shared/eval")
DEFAULT_CACHE = Path(os.environ.get("WSCTX_BENCH_CACHE") or Path.home() / ".cache" / "wsctx-bench")

CASE_FILES = {
    "commits": "commits.jsonl",
    "swebench_dev": "swebench_lite_dev.jsonl",
    "swebench": "swebench_lite.jsonl",
}

PYPI_NAMES = {
    "psf/requests": "requests",
    "pallets/flask": "flask",
    "pallets/click": "click",
    "encode/httpx": "httpx",
    "pytest-dev/pytest": "pytest",
    "pylint-dev/pylint": "pylint",
    "mwaskom/seaborn": "seaborn",
    "sphinx-doc/sphinx": "sphinx",
    "sympy/sympy": "sympy",
    "pydata/xarray": "xarray",
    "astropy/astropy": "astropy",
    # swebench_lite_dev
    "marshmallow-code/marshmallow": "marshmallow",
    "pvlib/pvlib-python": "pvlib",
    "pydicom/pydicom": "pydicom",
    "pylint-dev/astroid": "astroid",
    "sqlfluff/sqlfluff": "sqlfluff",
}

_PRE_RE = re.compile(r"(\.?dev\d*|rc\d*|-?alpha[.\d]*|-?beta[.\d]*|a\d+|b\d+)$", re.I)


def load_cases(which: str) -> list[dict]:
    names = list(CASE_FILES) if which == "all" else [which]
    out = []
    for n in names:
        with open(EVAL_DIR / CASE_FILES[n]) as fh:
            for line in fh:
                if line.strip():
                    case = json.loads(line)
                    case["set"] = n
                    out.append(case)
    return out


def _vkey(v: str) -> tuple:
    parts = []
    for p in re.split(r"[.\-]", v):
        m = re.match(r"(\d+)(.*)", p)
        parts.append((int(m.group(1)), m.group(2)) if m else (-1, p))
    return tuple(parts)


def _is_final(v: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", v) is not None


def available_versions(name: str, cache: Path) -> list[str]:
    f = cache / "versions" / f"{name}.json"
    if f.is_file():
        return json.loads(f.read_text())
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True, timeout=120)
    m = re.search(r"Available versions:\s*(.*)", out.stdout)
    versions = [v.strip() for v in m.group(1).split(",")] if m else []
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(versions))
    return versions


def release_for_tag(name: str, tag: str, cache: Path) -> str:
    """The PyPI version an eval ``nearest_tag`` stands for (see module docstring)."""
    v = tag
    for prefix in ("sympy-", "v"):
        if v.startswith(prefix):
            v = v[len(prefix):]
    if _is_final(v) and not _PRE_RE.search(v):
        return v
    # a pre-release tag: the release just before it
    base = _PRE_RE.sub("", v).rstrip(".-")
    finals = sorted((x for x in available_versions(name, cache) if _is_final(x)), key=_vkey)
    before = [x for x in finals if _vkey(x) < _vkey(base)]
    if not before:
        raise LookupError(f"{name}: no release before {tag}")
    return before[-1]


def _download_sdist(name: str, version: str, dest: Path) -> list[Path]:
    """The release's sdist straight from the package index (its JSON simple API), its sha256
    checked; [] when that fails.

    pip download prepares metadata, which for some sdists (astropy's Cython) means minutes of
    compiling on two cores: the archive alone is all the bench needs.
    """
    import hashlib
    import urllib.request

    def norm(s: str) -> str:
        return re.sub(r"[-_.]+", "_", s).lower()

    try:
        req = urllib.request.Request(f"https://pypi.org/simple/{norm(name).replace('_', '-')}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
        for f in files:
            base = re.sub(r"\.(tar\.gz|tar\.bz2|zip)$", "", f["filename"])
            project, _, ver = base.rpartition("-")
            if base == f["filename"] or ver != version or norm(project) != norm(name):
                continue
            target = dest / f["filename"]
            part = target.with_name(target.name + ".part")
            with urllib.request.urlopen(f["url"], timeout=300) as r, part.open("wb") as out:
                shutil.copyfileobj(r, out)
            if hashlib.sha256(part.read_bytes()).hexdigest() != f["hashes"]["sha256"]:
                part.unlink()
                return []
            part.rename(target)
            return [target]
    except (OSError, ValueError, KeyError):
        pass
    return []


def fetch_tree(name: str, version: str, cache: Path = DEFAULT_CACHE) -> Path:
    """Download (once) and unpack (once) the sdist; return the unpacked source root."""
    tree = cache / "trees" / f"{name}-{version}"
    if (tree / ".complete").is_file():
        return tree
    sdists = cache / "sdists" / f"{name}-{version}"
    sdists.mkdir(parents=True, exist_ok=True)
    files = [p for p in sdists.iterdir() if p.suffix in (".gz", ".zip", ".bz2")]
    if not files:
        files = _download_sdist(name, version, sdists)
    if not files:
        # --no-clean + a private TMPDIR: when pip fails to prepare metadata for an old sdist (a
        # setup.py that no longer runs on this Python), the unpacked sdist is still in pip's
        # download folder and is taken from there; the archive itself is the same either way.
        tmpdir = cache / "tmp" / f"{name}-{version}"
        shutil.rmtree(tmpdir, ignore_errors=True)
        tmpdir.mkdir(parents=True)
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-clean",
             f"{name}=={version}", "-d", str(sdists)], capture_output=True, text=True, timeout=600,
            env={**os.environ, "TMPDIR": str(tmpdir)})
        files = [p for p in sdists.iterdir() if p.suffix in (".gz", ".zip", ".bz2")]
        if not files:
            unpacked = [d for d in tmpdir.glob("pip-download-*/*") if d.is_dir()]
            if unpacked:
                shutil.rmtree(tree, ignore_errors=True)
                tree.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(unpacked[0]), str(tree))
                shutil.rmtree(tmpdir, ignore_errors=True)
                (tree / ".complete").write_text("unpacked by pip (metadata step failed)")
                return tree
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise RuntimeError(f"pip download {name}=={version} failed: {r.stderr.strip()[-400:]}")
        shutil.rmtree(tmpdir, ignore_errors=True)
    archive = files[0]
    tmp = cache / "trees" / f".{name}-{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")
    entries = list(tmp.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    shutil.rmtree(tree, ignore_errors=True)
    shutil.move(str(root), str(tree))
    shutil.rmtree(tmp, ignore_errors=True)
    (tree / ".complete").write_text(archive.name)
    return tree


def resolve_gold(tree: Path, gold: str) -> str | None:
    """The path of a gold file in the sdist tree (sdists sometimes move ``src/``); None if absent."""
    if (tree / gold).is_file():
        return gold
    # e.g. repo 'src/flask/app.py' but sdist lays out the same path: handled above; try without src/
    if gold.startswith("src/") and (tree / gold[4:]).is_file():
        return gold[4:]
    if (tree / "src" / gold).is_file():
        return "src/" + gold
    return None


def tree_for_case(case: dict, cache: Path = DEFAULT_CACHE) -> tuple[Path | None, str, str]:
    """(tree or None, pypi name, version or skip reason)."""
    name = PYPI_NAMES.get(case["repo"])
    if name is None:
        return None, "", f"no PyPI name known for {case['repo']}"
    try:
        version = release_for_tag(name, case["nearest_tag"], cache)
    except Exception as e:  # noqa: BLE001 - reported as a skip
        return None, name, f"no release for tag {case['nearest_tag']}: {e}"
    try:
        return fetch_tree(name, version, cache), name, version
    except Exception as e:  # noqa: BLE001
        return None, name, f"sdist {name}=={version} unavailable: {str(e)[:200]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="all", choices=[*CASE_FILES, "all"])
    ap.add_argument("--repo", default=None, help="only this repository (owner/name or PyPI name)")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    args = ap.parse_args(argv)
    cache = Path(args.cache).expanduser()
    seen: dict[tuple[str, str], str] = {}
    for case in load_cases(args.cases):
        if args.repo and args.repo not in (case["repo"], PYPI_NAMES.get(case["repo"])):
            continue
        key = (case["repo"], case["nearest_tag"])
        if key in seen:
            continue
        tree, name, info = tree_for_case(case, cache)
        seen[key] = str(tree) if tree else "SKIP " + info
        print(f"{case['repo']:28s} {case['nearest_tag']:14s} -> {seen[key]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
