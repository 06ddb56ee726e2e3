"""Embedding throughput on 600-character windows of real code.

Run:  python -m bench.embedder_speed [--threads N] [--repeats R] [--windows W] [--workspace DIR]
                                     [--compare DIR ...] [--batch N ...]

Takes Python source from packages installed in the running interpreter (numpy, lancedb,
onnx, ...), cuts it into 600-character windows, and times ``Embedder.embed_documents``; with
``--workspace DIR``, the windows are those the product embeds for that tree (its files in a fixed
shuffled order, ``plan_rows``: path, chunk context and overlap included). Batches follow the
shipped rule (``models.batching``: at most ``embed_batch_tokens`` padded tokens); each ``--batch N``
adds the shipped artifact again with N windows per batch (16: the rule before 2026-12-05), and
``--all-fusions`` adds it with every onnxruntime fusion, ``SkipLayerNormalization`` included (the
session before 2026-12-05).
Measures the committed int8 artifact and, when it was kept by
``python -m training.build_embedder --keep-fp32 models/.work/fp32``, the fp32 graph too; each
``--compare DIR`` is another artifact (``training.build_embedder --fused --out DIR``, or ``--static``),
and ``--sessions N`` adds the shipped artifact as N one-thread sessions embedding a share of the
windows each at once. The repeats are interleaved across the variants, so a noisy machine weighs
on each alike. Cosines are taken against the fp32 graph run one window at a time.
Writes bench/results/embedder_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "embedder_speed.json"
FP32_PATH = ROOT / "models" / ".work" / "fp32" / "model.fp32.onnx"
WINDOW = 600
TARGET = 50.0


def code_windows(n: int, size: int = WINDOW) -> list[str]:
    """``n`` consecutive windows of real Python source from installed packages (deterministic order)."""
    import importlib.util

    files: list[Path] = []
    for pkg in ("lancedb", "numpy", "onnx", "pyarrow", "tokenizers"):
        spec = importlib.util.find_spec(pkg)
        if spec and spec.submodule_search_locations:
            base = Path(list(spec.submodule_search_locations)[0])
            files += sorted(p for p in base.rglob("*.py") if "test" not in p.name)
    out: list[str] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        rel = f.as_posix().split("site-packages/")[-1]
        for s in range(0, len(text) - size + 1, size):
            out.append(f"{rel}\n{text[s : s + size]}"[:size])
            if len(out) >= n:
                return out
    return out


class Sessions:
    """*n* one-thread sessions of one artifact, each embedding every n-th window at once
    (onnxruntime releases the GIL while it runs): parallel batches instead of parallel operators."""

    def __init__(self, folder: Path, n: int):
        from models.embedding import Embedder

        self.parts = [Embedder(folder, threads=1) for _ in range(n)]
        self.model_id = self.parts[0].model_id

    def embed_documents(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        from concurrent.futures import ThreadPoolExecutor

        n = len(self.parts)
        with ThreadPoolExecutor(n) as pool:
            shares = list(pool.map(lambda i: self.parts[i].embed_documents(texts[i::n], batch_size), range(n)))
        out = np.empty((len(texts), shares[0].shape[1]), np.float32)
        for i, share in enumerate(shares):
            out[i::n] = share
        return out


def workspace_windows(root: Path, n: int) -> list[str]:
    """The first ``n`` texts the product would embed for the tree at ``root``, its files taken in a
    fixed shuffled order (so one large file does not make up the sample)."""
    import random

    from bench.common import bench_settings, workspace_files
    from daemons.lib.chunking import file_chunks
    from daemons.lib.indexing import plan_rows

    settings = bench_settings()
    files, _ = workspace_files(root, settings)
    random.Random(1).shuffle(files)
    out: list[str] = []
    for rel, data in files:
        _, texts = plan_rows(rel, "", file_chunks(data.decode("utf-8"), rel), settings)
        out += texts
        if len(out) >= n:
            break
    return out[:n]


def measure(variants: list[tuple[str, object, int | None]], windows: list[str], repeats: int) -> dict[str, dict]:
    """Windows/s of each (label, embedder, windows per batch or None for the embedder's own rule),
    the repeats interleaved (A, B, A, B ...) so that the machine's load falls on every variant alike."""
    rates: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    for _, emb, batch in variants:
        emb.embed_documents(windows[:16], batch_size=batch)  # warm-up
    for _ in range(repeats):
        for label, emb, batch in variants:
            t = time.perf_counter()
            emb.embed_documents(windows, batch_size=batch)
            rates[label].append(len(windows) / (time.perf_counter() - t))
    return {label: {
        "model_id": emb.model_id,
        "batching": f"{batch} windows" if batch else "shipped rule",
        "windows_per_s_median": round(statistics.median(rates[label]), 2),
        "windows_per_s_min": round(min(rates[label]), 2),
        "windows_per_s_max": round(max(rates[label]), 2),
        "repeats": [round(r, 2) for r in rates[label]],
    } for label, emb, batch in variants}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--workspace", type=Path, default=None, metavar="DIR",
                    help="the windows the product embeds for this tree, instead of slices of installed packages")
    ap.add_argument("--all-fusions", action="store_true",
                    help="also the shipped artifact with every onnxruntime fusion (models.embedding.DISABLED_FUSIONS on)")
    ap.add_argument("--batch", type=int, action="append", default=[], metavar="N",
                    help="also the shipped artifact with N windows per batch, in the same run (16: the earlier rule)")
    ap.add_argument("--compare", type=Path, action="append", default=[], metavar="DIR",
                    help="another artifact folder (e.g. training.build_embedder --fused --out DIR), measured in the same run")
    ap.add_argument("--sessions", type=int, default=0, metavar="N",
                    help="also the shipped artifact as N one-thread sessions run at once, in the same run")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from models.embedding import Embedder, load_embedder

    windows = workspace_windows(args.workspace, args.windows) if args.workspace else code_windows(args.windows)
    int8 = load_embedder(threads=args.threads)
    toks = [len(e.ids) for e in int8._tok.encode_batch(windows)]
    variants: list[tuple[str, object, int | None]] = [("int8", int8, None)]
    variants += [(f"int8 {n} per batch", int8, n) for n in args.batch]
    if args.all_fusions:
        every = Embedder(int8.folder, threads=args.threads, disabled_fusions=())
        variants.append(("int8 all fusions", every, None))
        variants += [(f"int8 {n} per batch, all fusions", every, n) for n in args.batch]
    if FP32_PATH.exists():
        variants.append(("fp32", Embedder(int8.folder, threads=args.threads, model_file=FP32_PATH, variant="fp32"), None))
    for folder in args.compare:
        variants.append((folder.name, Embedder(folder, threads=args.threads), None))
    if args.sessions:
        variants.append((f"int8 {args.sessions}x1 thread", Sessions(int8.folder, args.sessions), None))

    results: dict[str, dict] = measure(variants, windows, args.repeats)
    # the fp32 reference one window at a time: nothing in it from batch companions
    embs = {label: emb.embed_documents(windows, batch_size=1 if label == "fp32" else batch) for label, emb, batch in variants}
    for label in [label for label, _, _ in variants if label != "fp32"]:
        for ref in ("int8", "fp32"):
            if ref in embs and ref != label:
                cos = (embs[label] * embs[ref]).sum(1)
                results[f"{label}_vs_{ref}_cosine"] = {"mean": round(float(cos.mean()), 5), "min": round(float(cos.min()), 5)}

    report = {
        "benchmark": "embedder_speed",
        "window_chars": WINDOW,
        "windows": len(windows),
        "source": str(args.workspace) if args.workspace else "installed packages",
        "batch_tokens": int8.batch_tokens,
        "batch_max": int8.batch_max,
        "tokens_per_window_mean": round(float(np.mean(toks)), 1),
        "tokens_per_window_max": int(max(toks)),
        "threads": int8.threads,
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "machine": platform.processor() or platform.machine(),
        "target_windows_per_s": TARGET,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")

    print(f"{len(windows)} windows from {report['source']}, ~{report['tokens_per_window_mean']} tokens, shipped batches "
          f"of at most {int8.batch_tokens} padded tokens and {int8.batch_max} windows, {int8.threads} threads, "
          f"load avg {report['load_average_1m']}")
    print(f"{'variant':32s} {'median/s':>9s} {'min/s':>8s} {'max/s':>8s}  model_id")
    for label, _, _ in variants:
        r = results[label]
        print(f"{label:32s} {r['windows_per_s_median']:9.1f} {r['windows_per_s_min']:8.1f} "
              f"{r['windows_per_s_max']:8.1f}  {r['model_id']}")
    for key, c in results.items():
        if key.endswith("_cosine"):
            print(f"{key.removesuffix('_cosine').replace('_vs_', ' vs ')} cosine: mean {c['mean']:.4f} min {c['min']:.4f}")
    ok = results["int8"]["windows_per_s_median"] >= TARGET
    print(f"target {TARGET:.0f}/s: {'met' if ok else 'NOT met'}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
