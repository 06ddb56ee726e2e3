"""The corpus's sources: which public repositories are mined, pinned, and why.

    python -m training.corpus.manifest [--mirror DIR]

``SOURCES`` is the hand-written list (owner/name, main language, licence, why it was chosen);
this command pins each to the commit its fetched git directory's HEAD holds, counts its commits,
and writes ``manifest.json`` beside this file. The pins, not the mirrors, define the corpus: a
later fetch that brings newer history still mines the pinned commit. None of the evaluation
repositories is listed (``rules.is_eval_repo`` refuses them, and a test checks this list).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from training.corpus import rules
from training.corpus.mine import MANIFEST, MIRROR

#: Held out by repository for validation (of the models, and of issue #19's ranking settings).
VALIDATION = ("hynek/structlog", "bottlepy/bottle", "arrow-py/arrow", "jd/tenacity", "sharkdp/fd", "gin-gonic/gin",
              "date-fns/date-fns")

_SQUASH = "squash-merged pull requests, so commit bodies carry the PR description"
_CONV = "conventional, descriptive commit subjects with bodies"
_LONG = "a long history of small, well-described changes"
SOURCES: list[tuple[str, str, str, str]] = [
    # Python
    ("python-attrs/attrs", "python", "MIT", f"class-building library; {_LONG}"),
    ("psf/black", "python", "MIT", f"code formatter (AST and parser code); {_SQUASH}"),
    ("pallets/jinja", "python", "BSD-3-Clause", f"template compiler and runtime; {_LONG}"),
    ("pallets/werkzeug", "python", "BSD-3-Clause", f"WSGI toolkit (routing, HTTP parsing); {_LONG}"),
    ("encode/starlette", "python", "BSD-3-Clause", f"ASGI framework; {_SQUASH}"),
    ("encode/uvicorn", "python", "BSD-3-Clause", f"ASGI server; {_SQUASH}"),
    ("fastapi/fastapi", "python", "MIT", f"web framework on pydantic; {_SQUASH}"),
    ("pydantic/pydantic", "python", "MIT", f"data validation; {_SQUASH}"),
    ("aio-libs/aiohttp", "python", "Apache-2.0", f"async HTTP client/server; {_SQUASH} and CHANGES fragments"),
    ("urllib3/urllib3", "python", "MIT", f"HTTP client pools and retries; {_SQUASH}"),
    ("pypa/setuptools", "python", "MIT", f"packaging and build backend; {_LONG}"),
    ("pypa/packaging", "python", "Apache-2.0 OR BSD-2-Clause", f"version and marker parsing; {_SQUASH}"),
    ("python-poetry/poetry", "python", "MIT", f"dependency resolver and installer; {_SQUASH}"),
    ("tox-dev/tox", "python", "MIT", f"test environment runner; {_SQUASH}"),
    ("pre-commit/pre-commit", "python", "MIT", f"hook runner; {_LONG}"),
    ("PyCQA/flake8", "python", "MIT", f"linter framework; {_LONG}"),
    ("PyCQA/isort", "python", "MIT", f"import sorter; {_LONG}"),
    ("sqlalchemy/alembic", "python", "MIT", "schema migrations; detailed commit bodies (Gerrit reviews)"),
    ("sqlalchemy/sqlalchemy", "python", "MIT", "ORM and SQL toolkit; detailed commit bodies (Gerrit reviews)"),
    ("celery/kombu", "python", "BSD-3-Clause", f"messaging library; {_SQUASH}"),
    ("celery/celery", "python", "BSD-3-Clause", f"task queue; {_SQUASH}"),
    ("python/mypy", "python", "MIT", f"type checker; {_SQUASH} with long descriptions"),
    ("httpie/cli", "python", "BSD-3-Clause", f"HTTP command-line client; {_SQUASH}"),
    ("Textualize/rich", "python", "MIT", f"terminal rendering; {_LONG}"),
    ("Textualize/textual", "python", "MIT", f"terminal UI framework; {_LONG}"),
    ("scrapy/scrapy", "python", "BSD-3-Clause", f"crawling framework; {_SQUASH}"),
    ("tornadoweb/tornado", "python", "Apache-2.0", f"async web server; {_LONG}"),
    ("paramiko/paramiko", "python", "LGPL-2.1", f"SSH protocol implementation; {_LONG}"),
    ("hynek/structlog", "python", "Apache-2.0 OR MIT", f"structured logging; {_SQUASH}"),
    ("agronholm/anyio", "python", "MIT", f"async compatibility layer; {_SQUASH}"),
    ("python-trio/trio", "python", "MIT OR Apache-2.0", f"async runtime; {_SQUASH} with long descriptions"),
    ("beetbox/beets", "python", "MIT", f"music library manager with plugins; {_SQUASH}"),
    ("borgbackup/borg", "python", "BSD-3-Clause", f"deduplicating backup; {_LONG}"),
    ("falconry/falcon", "python", "Apache-2.0", f"web framework; {_SQUASH}"),
    ("getsentry/sentry-python", "python", "MIT", f"error-reporting SDK with many integrations; {_SQUASH}"),
    ("mitmproxy/mitmproxy", "python", "MIT", f"intercepting proxy; {_SQUASH}"),
    ("networkx/networkx", "python", "BSD-3-Clause", f"graph algorithms; {_SQUASH}"),
    ("ipython/ipython", "python", "BSD-3-Clause", f"interactive shell; {_LONG}"),
    ("dask/dask", "python", "BSD-3-Clause", f"parallel arrays and dataframes; {_SQUASH}"),
    ("Pylons/pyramid", "python", "BSD-like (Repoze)", f"web framework; {_LONG}"),
    ("bottlepy/bottle", "python", "MIT", f"single-file web framework; {_LONG}"),
    ("python-pillow/Pillow", "python", "MIT-CMU", f"imaging library (Python side); {_SQUASH}"),
    ("jazzband/pip-tools", "python", "BSD-3-Clause", f"requirements compiler; {_SQUASH}"),
    ("pypa/hatch", "python", "MIT", f"project manager and build backend; {_SQUASH}"),
    ("Delgan/loguru", "python", "MIT", f"logging library; {_LONG}"),
    ("tqdm/tqdm", "python", "MPL-2.0 AND MIT", f"progress bars; {_LONG}"),
    ("jd/tenacity", "python", "Apache-2.0", f"retry library; {_SQUASH}"),
    ("more-itertools/more-itertools", "python", "MIT", f"iterator recipes; {_LONG}"),
    ("python-jsonschema/jsonschema", "python", "MIT", f"JSON Schema validator; {_LONG}"),
    ("arrow-py/arrow", "python", "Apache-2.0", f"date and time library; {_SQUASH}"),
    ("dateutil/dateutil", "python", "Apache-2.0 OR BSD-3-Clause", f"date parsing and time zones; {_LONG}"),
    ("PyGithub/PyGithub", "python", "LGPL-3.0", f"GitHub API client; {_SQUASH}"),
    ("psycopg/psycopg", "python", "LGPL-3.0", f"PostgreSQL adapter; {_LONG}"),
    ("redis/redis-py", "python", "MIT", f"Redis client; {_SQUASH}"),
    # TypeScript / JavaScript
    ("vitejs/vite", "typescript", "MIT", f"build tool and dev server; {_SQUASH}, {_CONV}"),
    ("vuejs/core", "typescript", "MIT", f"UI framework compiler and runtime; {_CONV}"),
    ("prettier/prettier", "javascript", "MIT", f"code formatter (printers per language); {_SQUASH}"),
    ("eslint/eslint", "javascript", "MIT", f"linter and rules; {_CONV} with bodies"),
    ("expressjs/express", "javascript", "MIT", f"web framework; {_LONG}"),
    ("axios/axios", "javascript", "MIT", f"HTTP client; {_CONV}"),
    ("colinhacks/zod", "typescript", "MIT", f"schema validation; {_SQUASH}"),
    ("trpc/trpc", "typescript", "MIT", f"typed RPC; {_SQUASH}, {_CONV}"),
    ("date-fns/date-fns", "typescript", "MIT", f"date utilities; {_LONG}"),
    # Go
    ("spf13/cobra", "go", "Apache-2.0", f"command-line framework; {_SQUASH}"),
    ("gin-gonic/gin", "go", "MIT", f"web framework; {_SQUASH}, {_CONV}"),
    ("go-chi/chi", "go", "MIT", f"HTTP router; {_SQUASH}"),
    ("junegunn/fzf", "go", "MIT", f"fuzzy finder; {_LONG}"),
    ("charmbracelet/bubbletea", "go", "MIT", f"terminal UI framework; {_SQUASH}, {_CONV}"),
    ("cli/cli", "go", "MIT", f"GitHub command-line client; {_SQUASH}"),
    # Rust
    ("BurntSushi/ripgrep", "rust", "Unlicense OR MIT", "search tool; detailed commit bodies"),
    ("sharkdp/bat", "rust", "MIT OR Apache-2.0", f"file viewer; {_SQUASH}"),
    ("sharkdp/fd", "rust", "MIT OR Apache-2.0", f"file finder; {_SQUASH}"),
    ("clap-rs/clap", "rust", "MIT OR Apache-2.0", f"argument parser; {_CONV}"),
    ("tokio-rs/tokio", "rust", "MIT", f"async runtime; {_SQUASH}"),
    ("serde-rs/serde", "rust", "MIT OR Apache-2.0", f"serialization framework; {_LONG}"),
    ("astral-sh/uv", "rust", "MIT OR Apache-2.0", f"Python package manager; {_SQUASH} with long descriptions"),
    ("astral-sh/ruff", "rust", "MIT", f"Python linter and formatter; {_SQUASH} with long descriptions"),
]


def build(mirror: Path) -> dict:
    """The manifest: every source pinned to its mirror's HEAD (missing mirrors are an error)."""
    out = []
    missing = []
    for repo, language, licence, why in SOURCES:
        if rules.is_eval_repo(repo):
            raise ValueError(f"{repo} is an evaluation repository")
        git_dir = mirror / repo.replace("/", "+") / "repo"
        if not git_dir.is_dir():
            missing.append(repo)
            continue
        head = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        commits = int(subprocess.run(["git", "--git-dir", str(git_dir), "rev-list", "--count", head], capture_output=True,
                                     text=True, check=True).stdout)
        out.append({"repo": repo, "commit": head, "language": language, "licence": licence, "commits": commits,
                    "split": "validation" if repo in VALIDATION else "train", "why": why})
    if missing:
        raise SystemExit(f"no git directory under {mirror} for: {', '.join(missing)}")
    return {"note": "pinned sources of the training corpus; rebuilt by `python -m training.corpus.manifest`",
            "repositories": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirror", type=Path, default=MIRROR)
    ap.add_argument("--out", type=Path, default=MANIFEST)
    args = ap.parse_args(argv)
    manifest = build(args.mirror)
    args.out.write_text(json.dumps(manifest, indent=1) + "\n")
    langs: dict[str, int] = {}
    for e in manifest["repositories"]:
        langs[e["language"]] = langs.get(e["language"], 0) + 1
    print(f"{len(manifest['repositories'])} repositories: {langs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
