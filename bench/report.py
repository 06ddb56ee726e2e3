"""Markdown tables from bench/results/*.json, for docs/benchmarks.md.

    python -m bench.report > /tmp/tables.md
"""
from __future__ import annotations

import json
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"
from bench.quality import METHODS  # noqa: E402  one list of methods for run, report and plot
METRICS = ["recall@1", "recall@5", "recall@10", "acc@1", "acc@3", "acc@5", "mrr"]


def quality_tables() -> list[str]:
    out = []
    for f in sorted(RES.glob("quality*.json")):
        d = json.loads(f.read_text())
        for cs, s in d.get("summary", {}).items():
            out.append(f"\n**{cs}** ({f.name}): {s['cases_run']} cases run, {s['cases_skipped']} skipped "
                       f"({', '.join(f'{k}: {v}' for k, v in s['skip_reasons'].items()) or 'none'}); embedder: {d['embedder']}; reranker: {d['reranker']}\n")
            out.append("| repo | n | method | " + " | ".join(METRICS) + " |")
            out.append("|---|---:|---|" + "---:|" * len(METRICS))
            groups = [*s["per_repo"].items(), ("**all**", s["all"])]
            for repo, m in groups:
                for meth in METHODS:
                    if m.get(meth):
                        out.append(f"| {repo} | {m['n']} | {meth} | " + " | ".join(f"{m[meth][k]:.1f}" for k in METRICS) + " |")
    return out


def speed_tables() -> list[str]:
    out = []
    p = RES / "speed.json"
    if p.is_file():
        d = json.loads(p.read_text())
        if d.get("index"):
            out.append("\n| tree | files | chunks | windows (rows) | total s | files/s | windows/s | list | chunk | embed | write | optimize | disk MB |")
            out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for n, m in d["index"].items():
                sh = m["share"]
                out.append(f"| {n} | {m['files']} | {m['chunks']} | {m['rows']} | {m['total_s']:.0f} | {m['files_per_s']} | {m['rows_per_s']} | "
                           + " | ".join(f"{100 * sh.get(k, 0):.1f}%" for k in ("list", "chunk", "embed", "write", "optimize")) + f" | {m.get('disk_mb', '')} |")
        if d.get("chunkonly"):
            out.append("\n| tree (chunked only) | files | chunks | windows | list s | chunk s | chunk files/s | est. embed s |")
            out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
            for n, m in d["chunkonly"].items():
                out.append(f"| {n} | {m['files']} | {m['chunks']} | {m['rows']} | {m['seconds']['list']} | {m['seconds']['chunk']} | {m['chunk_files_per_s']} | {m.get('estimated_embed_s', '')} |")
        if d.get("latency"):
            keys = ["query_keywords", "embed_query", "keyword", "vector", "hybrid", "hybrid_focus", "rg", "bm25_file"]
            out.append("\n| tree | rows | queries | " + " | ".join(keys) + " |")
            out.append("|---|---:|---:|" + "---:|" * len(keys))
            for n, m in d["latency"].items():
                out.append(f"| {n} | {m['rows']} | {m['queries']} | " + " | ".join(f"{m[k]['median']:.1f} / {m[k]['p95']:.1f}" for k in keys) + " |")
    p = RES / "speed_scale.json"
    if p.is_file():
        s = json.loads(p.read_text()).get("scale")
        if s:
            keys = ["vector", "keyword", "vector_focus", "keyword_focus", "hybrid_focus"]
            out.append(f"\nScale: {s['rows']:,} rows ({s['copies']} copies of {s['source']}), disk {s['disk_mb']} MB; "
                       f"build: " + ", ".join(f"{k} {v} s" for k, v in s["timings"].items()))
            out.append("\n| vector index | " + " | ".join(keys) + " |")
            out.append("|---|" + "---:|" * len(keys))
            for label, m in (("none (flat)", s["flat"]), (s["ann"], s["indexed"])):
                out.append(f"| {label} | " + " | ".join(f"{m[k]['median']:.1f} / {m[k]['p95']:.1f} (n={m[k]['n']})" for k in keys) + " |")
    return out


def splice(doc: Path) -> None:
    """Replace the text between the quality/speed markers of ``doc`` with fresh tables."""
    text = doc.read_text()
    for tag, lines in (("quality", quality_tables()), ("speed", speed_tables())):
        a, b = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
        if a in text and b in text:
            head, rest = text.split(a, 1)
            _, tail = rest.split(b, 1)
            text = head + a + "\n" + "\n".join(lines) + "\n" + b + tail
    doc.write_text(text)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--write":
        splice(Path(sys.argv[2]))
    else:
        print("\n".join(quality_tables() + speed_tables()))
