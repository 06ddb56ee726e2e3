"""Would the files that define an error line's names find the fix? (issue 19; judged on validation only.)

An error line often names code: ``TypeError: RST.__init__() got an unexpected keyword argument``
names ``RST``; ``AttributeError: 'Wallet' object has no attribute 'get_tx_delta'`` names ``Wallet``
and ``get_tx_delta``. A list of the files that define those names would bring in a file that no
traceback frame names (SWE-bench Lite's astropy-14182 is such a case). Before such a list is built
into ``hybrid_search``, this measures on the ``validation-traceback`` cases, offline over each
case's pinned tree, how often it could matter:

* ``error_names(line)``: the names an error line calls (``name(``, ``Obj.meth(``) or quotes
  (``'name'``), split at dots, without Python's builtins, dunders and the exception's own name;
* ``defining_files(files, name)``: the ``.py`` files with a line ``def name`` or ``class name``;
  a name defined in more than ``MAX_AMBIGUOUS`` files names nothing (as ``run``, ``get``);
* per case: whether an error line names anything, whether any name is defined in the tree, and
  whether a defining file is a gold file, and one that no frame of the traceback already names
  (the ``mentioned`` list holds those).

Prints a table per repository and writes ``bench/results/error_names.json``.

    python -m bench.error_names
"""
from __future__ import annotations

import argparse
import builtins
import re
from collections import Counter
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench.common import write_result
from bench.list_rules import frame_position
from bench.validation import traceback_cases, validation_tree
from daemons.lib.keywords import identifiers
from daemons.lib.question import analyse

OUT = Path(__file__).resolve().parent / "results" / "error_names.json"
#: A name defined in more files than this points at none of them.
MAX_AMBIGUOUS = 3
#: At most this many of a question's error-line names are looked up.
NAMES_MAX = 8
_CALLED = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_QUOTED = re.compile(r"""['"`]([A-Za-z_][\w.]*)['"`]""")
_NOT_NAMES = frozenset(dir(builtins)) | {"object", "module", "NoneType"}
COUNTS = ("cases", "error_line", "names", "defined", "gold_defined", "gold_defined_unframed")


def error_names(line: str) -> list[str]:
    """The names *line* calls or quotes, split at dots, in order, deduplicated; builtins, dunders
    and the line's first identifier (the exception's name) left out."""
    head = set(identifiers(line)[:1])
    out: list[str] = []
    for m in sorted([*_CALLED.finditer(line), *_QUOTED.finditer(line)], key=lambda m: m.start()):
        for part in m.group(1).split("."):
            if part and part not in _NOT_NAMES and not part.startswith("__") and part not in head and part not in out:
                out.append(part)
    return out


@lru_cache(maxsize=256)
def _definition_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{re.escape(name)}(?!\w)", re.MULTILINE)


def defining_files(files: dict[str, str], name: str) -> list[str]:
    """The paths of *files* (path -> text) with a line defining *name*; empty when more than
    ``MAX_AMBIGUOUS`` do."""
    found = [p for p, text in files.items() if name in text and _definition_re(name).search(text)]
    return found if len(found) <= MAX_AMBIGUOUS else []


def python_files(root: Path) -> dict[str, str]:
    """Every ``.py`` file under *root*, by its path relative to *root*."""
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.rglob("*.py")) if p.is_file()}


def judge(case: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """One case's row: its error-line names, the files defining them, and which counts it adds to."""
    a = analyse(case["query"])
    names = list(dict.fromkeys(n for line in a.error_lines for n in error_names(line)))[:NAMES_MAX]
    defined = list(dict.fromkeys(p for n in names for p in defining_files(files, n)))
    gold = [p for p in defined if p in case["gold_files"]]
    framed = [f.path for f in a.frames]
    unframed = [p for p in gold if frame_position(p, framed, "outer") is None]
    return {"id": case["id"], "repo": case["repo"], "names": names, "defined": defined, "gold": gold, "counts": {
        "cases": 1, "error_line": int(bool(a.error_lines)), "names": int(bool(names)), "defined": int(bool(defined)),
        "gold_defined": int(bool(gold)), "gold_defined_unframed": int(bool(unframed))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    trees: dict[tuple[str, str], dict[str, str]] = {}
    for case in traceback_cases():
        key = (case["repo"], case["commit"])
        if key not in trees:
            trees[key] = python_files(validation_tree(*key))
        rows.append(judge(case, trees[key]))
    per: dict[str, Counter] = {}
    for r in rows:
        per.setdefault(r["repo"], Counter()).update(r["counts"])
    per["all"] = sum(per.values(), Counter())
    print(f"{'repository':28s} " + " ".join(f"{c:>21s}" for c in COUNTS))
    for repo, cnt in per.items():
        print(f"{repo:28s} " + " ".join(f"{cnt[c]:21d}" for c in COUNTS))
    write_result(args.out, {"date": date.today().isoformat(), "command": "python -m bench.error_names",
                            "per_repo": {r: {c: cnt[c] for c in COUNTS} for r, cnt in per.items()},
                            "cases": [r for r in rows if r["defined"]]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
