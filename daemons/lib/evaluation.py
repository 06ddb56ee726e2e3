"""Measuring retrieval on a workspace's own history (``wsctx eval``), with no sockets: the asking is
the caller's.

* ``build(root, settings, limit)`` is an ``Evaluation``: the commit cases of the workspace's git
  history (``history.commit_cases``, over the files the watcher would index) and a whole-file BM25
  over its non-test source files, the floor that the product is shown beside.
* ``Evaluation.run(methods, progress)`` asks every case of every method: a method is a name and a
  function from a question to files, best first. Each case keeps its files' first ten, its metrics
  (``metrics.file_metrics``) and its time.
* ``summary`` / ``table`` / ``report`` are the per-method means (percent), the printed table, and
  the JSON document ``wsctx eval --out`` writes; ``plot`` draws the table as a PNG when
  matplotlib is installed (``pip install 'wsctx[eval]'``) and says why not otherwise.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from daemons.lib.bm25 import WholeFileBM25
from daemons.lib.filtering import indexable_files
from daemons.lib.history import CommitCases, commit_cases, is_source
from daemons.lib.metrics import METRIC_NAMES, file_metrics, files_in_order, mean_metrics  # noqa: F401  (files_in_order: the caller's)

#: Cases asked by default: about a minute per method on two cores, and enough that one case
#: moves a mean by at most two points.
DEFAULT_CASES = 50
#: The name of the whole-file BM25 floor among the methods.
BM25 = "bm25 whole-file"
#: A character budget every answer fits in, so that no block is left out of the order measured.
ANY_SIZE = 10_000_000
#: The columns of the printed table.
SHOWN = ["recall@1", "recall@5", "recall@10", "mrr"]
RANKED_KEPT = 10

Ask = Callable[[str], list[str]]


@dataclass
class Evaluation:
    root: Path
    history: CommitCases
    bm25: WholeFileBM25
    indexed_files: int
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def floor(self, question: str) -> list[str]:
        return self.bm25.search(question, RANKED_KEPT * 5)

    def run(self, methods: Sequence[tuple[str, Ask]], progress: Callable[[int, int], None] | None = None) -> None:
        """Ask every case of every method, in turn per case (so a slow machine slows all alike)."""
        cases = self.history.cases
        for name, _ in methods:
            self.results[name] = []
        for n, case in enumerate(cases, 1):
            for name, ask in methods:
                t0 = time.perf_counter()
                ranked = ask(case.question)
                ms = (time.perf_counter() - t0) * 1000
                self.results[name].append({
                    "commit": case.commit, "gold": case.gold, "ranked": ranked[:RANKED_KEPT], "ms": round(ms, 1),
                    "metrics": file_metrics(ranked, case.gold),
                    "first_gold_rank": next((i + 1 for i, p in enumerate(ranked) if p in case.gold), None),
                })
            if progress is not None:
                progress(n, len(cases))

    def summary(self) -> dict[str, dict[str, float]]:
        """``{method: {metric: percent, "median_ms": ms}}``."""
        out: dict[str, dict[str, float]] = {}
        for name, rows in self.results.items():
            out[name] = {**mean_metrics([r["metrics"] for r in rows]),
                         "median_ms": round(statistics.median(r["ms"] for r in rows), 1) if rows else 0.0}
        return out

    def table(self) -> str:
        """The summary as an aligned text table, one method per row."""
        summary = self.summary()
        width = max([len("method"), *(len(n) for n in summary)])
        lines = [f"{'method':<{width}}  " + "  ".join(f"{c:>9}" for c in SHOWN) + f"  {'median ms':>9}"]
        for name, m in summary.items():
            lines.append(f"{name:<{width}}  " + "  ".join(f"{m.get(c, 0.0):>9.1f}" for c in SHOWN) + f"  {m['median_ms']:>9.1f}")
        return "\n".join(lines)

    def report(self, workspace: str, settings: dict[str, Any]) -> dict[str, Any]:
        """The JSON document of a run: where, when, the cases and the skipped commits, each method's
        summary and per-case results (questions included, so a user can read what was asked)."""
        questions = {c.commit: c.question for c in self.history.cases}
        return {
            "workspace": workspace, "root": str(self.root), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "indexed_files": self.indexed_files, "commits_read": self.history.commits_read, "cases": len(self.history.cases),
            "skipped": dict(self.history.skipped), "metrics": METRIC_NAMES, "settings": settings, "summary": self.summary(),
            "results": {name: [{**r, "question": questions[r["commit"]]} for r in rows] for name, rows in self.results.items()},
        }


def build(root: str | Path, include_globs: list[str] | None, exclude_globs: list[str] | None, max_file_bytes: int,
          limit: int = DEFAULT_CASES) -> Evaluation:
    """The cases of ``root``'s history whose files the workspace indexes, and the BM25 floor over
    its source files (history.NotAGitRepository when it has no history)."""
    files, _ = indexable_files(root, include_globs, exclude_globs, max_file_bytes)
    present = {rel for rel, _ in files}
    history = commit_cases(root, present, limit)
    return Evaluation(root=Path(root), history=history, bm25=WholeFileBM25(files, keep=is_source), indexed_files=len(files))


def skipped_line(history: CommitCases) -> str:
    """Why the commits read were not asked, in one line."""
    why = {"bot": "by bots", "merge_no_description": "merges without a description", "short_subject": "subjects under 5 words",
           "sweep": "formatting, rename or release sweeps", "no_source": "no source file changed",
           "too_many_files": "more than 5 source files", "gone": "a changed file no longer here"}
    parts = [f"{n} {why.get(k, k)}" for k, n in sorted(history.skipped.items(), key=lambda kv: -kv[1])]
    return f"{history.commits_read} commits read, {len(history.cases)} asked" + (f"; skipped: {', '.join(parts)}" if parts else "")


def plot(doc: dict[str, Any], path: str | Path) -> str:
    """Draw the summary as grouped bars into ``path`` (PNG); "" when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'wsctx[eval]')"
    summary = doc["summary"]
    names = list(summary)
    fig, ax = plt.subplots(figsize=(1.6 + 1.9 * len(SHOWN), 3.8))
    bar = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * bar for j in range(len(SHOWN))]
        values = [summary[name].get(c, 0.0) for c in SHOWN]
        ax.bar(xs, values, bar, label=name)
        for x, v in zip(xs, values):
            ax.text(x, v + 1, f"{v:.0f}", ha="center", fontsize=7)
    ax.set_xticks(range(len(SHOWN)), SHOWN)
    ax.set_ylim(0, 105)
    ax.set_ylabel("percent")
    ax.set_title(f"{Path(doc['root']).name}: {doc['cases']} questions from its own commits", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(names), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""
