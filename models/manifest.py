"""Model artifact manifests: ``manifest.json`` lists every file of the folder with its sha256."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST_NAME = "manifest.json"
class ModelUnavailable(RuntimeError):
    """A model cannot be loaded: its files are missing, incomplete, fail their checksums or cannot
    be read. The one error both loaders raise (``models.embedding``, ``models.cross_encoder``)."""


REQUIRED_KEYS = ("name", "model_file", "tokenizer", "dim", "max_tokens", "files")
#: A cross-encoder has no embedding dimension; its manifest lists checksums under ``sha256``.
CROSS_ENCODER_KEYS = ("name", "model_file", "tokenizer_file", "max_tokens", "query_max_tokens", "sha256")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def write_manifest(folder: str | Path, manifest: dict) -> Path:
    """Add the ``files`` checksums (every file but the manifest) and write ``manifest.json``."""
    folder = Path(folder)
    files = {
        p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST_NAME
    }
    data = dict(manifest)
    data["files"] = files
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_manifest(folder: str | Path) -> dict:
    """Parse ``manifest.json`` (raises OSError / ValueError on a missing or broken file)."""
    data = json.loads((Path(folder) / MANIFEST_NAME).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("manifest.json is not a JSON object")
    return data


def verify(folder: str | Path) -> list[str]:
    """Check a model folder against its manifest; returns the problems found (empty = ok)."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder}: folder does not exist"]
    try:
        m = read_manifest(folder)
    except FileNotFoundError:
        return [f"{folder / MANIFEST_NAME}: missing"]
    except (OSError, ValueError) as e:
        return [f"{folder / MANIFEST_NAME}: unreadable ({e})"]
    cross = m.get("kind") == "cross-encoder"
    required = CROSS_ENCODER_KEYS if cross else REQUIRED_KEYS
    problems = [f"manifest.json: missing key {k!r}" for k in required if k not in m]
    files = m.get("sha256" if cross else "files")
    if not isinstance(files, dict) or not files:
        problems.append(f"manifest.json: {'sha256' if cross else 'files'!r} must list the folder's files")
        return problems
    for key in ("model_file", "tokenizer_file" if cross else "tokenizer"):
        if key in m and m[key] not in files:
            problems.append(f"manifest.json: {key} {m[key]!r} is not listed in 'files'")
    for name, info in files.items():
        p = folder / name
        if Path(name).name != name:
            problems.append(f"{name}: file names must be plain names inside the folder")
            continue
        if not p.is_file():
            problems.append(f"{name}: missing")
            continue
        want = info.get("sha256") if isinstance(info, dict) else info
        got = sha256_file(p)
        if got != want:
            problems.append(f"{name}: corrupt (sha256 {got} does not match the manifest's {want})")
    return problems
