"""``wsctx models`` and ``wsctx keys``: the installed models (list, verify, score) and CURVE key pairs."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from daemons.supervision import REPO_ROOT
from daemons.status_report import fmt_bytes
from daemons.cli.common import CLIError, settings_of


ARTIFACTS = REPO_ROOT / "models" / "artifacts"


def installed_models(root: Path | None = None) -> list[tuple[Path, dict[str, Any] | None, str]]:
    """``[(folder, manifest or None, error)]`` for every folder under models/artifacts."""
    from models.manifest import MANIFEST_NAME, read_manifest

    root = ARTIFACTS if root is None else root
    out = []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (folder / MANIFEST_NAME).exists():
            out.append((folder, None, "no manifest.json"))
            continue
        try:
            out.append((folder, read_manifest(folder), ""))
        except (OSError, ValueError) as exc:
            out.append((folder, None, str(exc)))
    return out


def format_models(models: list[tuple[Path, dict[str, Any] | None, str]]) -> str:
    if not models:
        return f"no models under {ARTIFACTS}"
    lines = []
    for folder, m, err in models:
        if m is None:
            lines.append(f"{folder.name}: {err}")
            continue
        prefixes = m.get("prefixes") or {}
        pre = ", ".join(f"{k}={v!r}" for k, v in prefixes.items()) or "none"
        lines.append(f"{m.get('name', folder.name)}  ({folder})")
        lines.append(f"  dim {m.get('dim', '-')}, max tokens {m.get('max_tokens', '-')}, prefixes {pre}")
        for name, info in (m.get("files") or {}).items():
            size = info.get("bytes") if isinstance(info, dict) else None
            sha = info.get("sha256", "") if isinstance(info, dict) else str(info)
            lines.append(f"  {name:<24} {fmt_bytes(size) if size is not None else '?':>10}  sha256 {sha[:16]}")
    return "\n".join(lines)


def cmd_models(args: argparse.Namespace) -> int:
    models = installed_models()
    if args.action in (None, "list"):
        print(format_models(models))
        return 0
    if args.action == "verify":
        from models.manifest import verify

        if not models:
            raise CLIError(f"no models under {ARTIFACTS}")
        bad = 0
        for folder, _m, _err in models:
            problems = verify(folder)
            if problems:
                bad += 1
                print(f"{folder.name}: FAILED")
                for p in problems:
                    print(f"  {p}")
            else:
                print(f"{folder.name}: ok")
        if bad:
            raise CLIError(f"{bad} model folder(s) failed verification (rebuild them, see README \"Models\")")
        return 0
    # score
    settings = settings_of(args)
    try:
        from models import cross_encoder
    except ImportError as exc:
        raise CLIError(f"the cross-encoder module is not available ({exc})") from None
    try:
        model = cross_encoder.load_cross_encoder(settings.reranker_dir or None)
    except cross_encoder.ModelUnavailable as exc:
        raise CLIError(f"cross-encoder unavailable: {exc}") from None
    score = model.score(args.query, [args.passage])[0]
    print(f"{score:.4f}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Make a CURVE key pair (for ``front_tcp`` off loopback, and team fronts)."""
    from daemons.lib.security import make_keys

    folder = Path(args.dir)
    if (folder / f"{args.name}.key").exists() or (folder / f"{args.name}.key_secret").exists():
        raise CLIError(f"{folder / args.name}.key already exists: pick another --name or folder")
    public, secret = make_keys(folder, args.name)
    print(f"public key: {public}   (give it to the peer: a server's goes in team_server_key_file, a client's in the server's curve_authorized_keys_dir)")
    print(f"secret key: {secret}   (keep it: curve_secret_key_file)")
    return 0
