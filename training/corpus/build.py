"""Rebuild the corpus pack from the manifest in one command: mine every pinned repository, then pack.

    python -m training.corpus.build [--jobs 2]

The git directories must be under ``--mirror`` (``WSCTX_MIRROR``, default ``/work/.mirror``), one
``OWNER+NAME/repo`` per manifest entry, as the session's fetch tool lays them; the command lists
any that are missing and stops. Mining resumes per repository (finished ones are skipped), and
the pack is deterministic for the same manifest and caps. Everything it writes lies under
``training/.work/`` (ignored by git): nothing taken from those repositories is committed, only
the counts in ``training/corpus/stats.json``.
"""
from __future__ import annotations

import argparse

from training.corpus import mine, pack


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirror", default=str(mine.MIRROR))
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--max-mib", default="35")
    args = ap.parse_args(argv)
    rc = mine.main(["--mirror", args.mirror, "--jobs", args.jobs])
    if rc:
        return rc
    return pack.main(["--max-mib", args.max_mib])


if __name__ == "__main__":
    raise SystemExit(main())
