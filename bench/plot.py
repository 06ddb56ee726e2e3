"""Regenerate the figures of docs/benchmarks.md from bench/results/*.json (matplotlib, Agg).

    python -m bench.plot            # writes docs/bench_quality.png, docs/bench_index.png,
                                    # docs/bench_latency.png, docs/bench_scale.png (those with data)
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
from bench.quality import METHODS  # noqa: E402  one list of methods for run, report and plot


def load(name: str) -> dict:
    p = RES / name
    return json.loads(p.read_text()) if p.is_file() else {}


def quality() -> None:
    sets = []
    for f in sorted(RES.glob("quality*.json")):
        d = json.loads(f.read_text())
        for cs, s in d.get("summary", {}).items():
            if s.get("cases_run"):
                model = d.get("embedder", "").split("@")[0]
                sets.append((f"{cs} (n={s['cases_run']}), {model}", s["all"]))
    if not sets:
        return
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.6), squeeze=False)
    for ax, (title, m) in zip(axes[0], sets):
        meths = [x for x in METHODS if m.get(x)]
        xs = range(len(meths))
        for j, metric in enumerate(["recall@1", "recall@5", "mrr"]):
            ax.bar([x + (j - 1) * 0.27 for x in xs], [m[k][metric] for k in meths], width=0.27, label=metric)
        ax.set_xticks(list(xs), meths, rotation=30, fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("%")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "bench_quality.png", dpi=110)
    plt.close(fig)


def index_speed() -> None:
    d = load("speed.json").get("index", {})
    if not d:
        return
    fig, ax = plt.subplots(figsize=(6, 2.8))
    stages = ["list", "chunk", "embed", "write", "optimize"]
    names = list(d)
    left = [0.0] * len(names)
    for st in stages:
        vals = [d[n]["seconds"].get(st, 0.0) for n in names]
        ax.barh(names, vals, left=left, label=st)
        left = [a + b for a, b in zip(left, vals)]
    for i, n in enumerate(names):
        ax.text(left[i], i, f" {d[n]['rows']} rows, {d[n]['rows_per_s']} win/s", va="center", fontsize=7)
    ax.set_xlabel("seconds (full index)")
    ax.set_xlim(0, max(left) * 1.45)
    ax.legend(fontsize=7, ncol=5, loc="lower right")
    fig.tight_layout()
    fig.savefig(DOCS / "bench_index.png", dpi=110)
    plt.close(fig)


def latency() -> None:
    d = load("speed.json").get("latency", {})
    if not d:
        return
    keys = ["keyword", "vector", "embed_query", "hybrid", "hybrid_focus", "rg", "bm25_file"]
    fig, ax = plt.subplots(figsize=(7, 3))
    w = 0.8 / len(d)
    for i, (name, m) in enumerate(d.items()):
        xs = [k + (i - (len(d) - 1) / 2) * w for k in range(len(keys))]
        ax.bar(xs, [m[k]["median"] for k in keys], width=w, label=f"{name} median",
               yerr=[[0] * len(keys), [max(0, m[k]["p95"] - m[k]["median"]) for k in keys]], capsize=2)
    ax.set_xticks(range(len(keys)), keys, fontsize=8)
    ax.set_ylabel("ms (bar: median, whisker: p95)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(DOCS / "bench_latency.png", dpi=110)
    plt.close(fig)


def scale() -> None:
    d = load("speed_scale.json").get("scale")
    if not d:
        return
    keys = ["vector", "keyword", "vector_focus", "keyword_focus", "hybrid_focus"]
    fig, ax = plt.subplots(figsize=(6.5, 3))
    for i, (label, m) in enumerate((("flat (no vector index)", d["flat"]), (d["ann"], d["indexed"]))):
        xs = [k + (i - 0.5) * 0.38 for k in range(len(keys))]
        ax.bar(xs, [m[k]["median"] for k in keys], width=0.38, label=label,
               yerr=[[0] * len(keys), [max(0, m[k]["p95"] - m[k]["median"]) for k in keys]], capsize=2)
    ax.axhline(100, color="red", lw=0.8, ls="--", label="100 ms target")
    ax.set_xticks(range(len(keys)), keys, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (median, whisker p95)")
    ax.set_title(f"{d['rows']:,} rows", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "bench_scale.png", dpi=110)
    plt.close(fig)


def main() -> int:
    DOCS.mkdir(exist_ok=True)
    for fn in (quality, index_speed, latency, scale):
        fn()
    print("plots written to", DOCS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
