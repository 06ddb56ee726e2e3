"""Workspace identity and the registry of workspaces (a JSON file under the data directory).

A workspace id is derived from its absolute path: ``<basename>-<sha1(path)[:12]>``, so the same
folder always maps to the same index folder ``<data_dir>/indexes/<id>/``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from protocol.errors import UnknownWorkspace


#: File systems whose trees are made up by the kernel (endless, or changing on every read).
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore", "bpf",
    "configfs", "fusectl", "mqueue", "hugetlbfs", "autofs", "binfmt_misc", "efivarfs", "rpc_pipefs", "nsfs",
})


def filesystem_type(path: str | Path) -> str:
    """The type of the file system *path* lies on (``/proc/mounts``' longest mount point above it), '' if unknown."""
    target = str(Path(path).resolve())
    best, kind = "", ""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def root_problem(root: str) -> str:
    """Why *root* cannot be a workspace, or '': empty, not a UTF-8 name, missing, not a folder,
    or on a pseudo-filesystem (``/proc``, ``/sys``: endless trees no walk should enter)."""
    if not root.strip():
        return "an empty path names no folder (use `wsctx add .` for this one)"
    try:
        root.encode("utf-8")
    except UnicodeEncodeError:
        return f"{root.encode('utf-8', 'surrogateescape')!r} is not a valid UTF-8 name: no message can carry its files' paths"
    if "\x00" in root:
        return "a path with a NUL byte"
    path = Path(root)
    if not path.exists():
        return f"{root} does not exist"
    if not path.is_dir():
        return f"{root} is not a directory"
    kind = filesystem_type(path)
    if kind in PSEUDO_FILESYSTEMS:
        return f"{root} is on a {kind} pseudo-filesystem, whose files the kernel makes up: not a workspace"
    return ""


def broad_root_problem(root: str | Path, home: str | Path | None = None) -> str:
    """Why registering *root* is most likely a mistake (the whole file system or a home folder:
    the watcher would index all of it), or ''."""
    resolved = Path(root).resolve()
    home_p = Path(home if home is not None else Path.home()).resolve()
    if resolved == Path("/"):
        return "/ is the whole file system"
    if resolved == home_p:
        return f"{resolved} is your home folder"
    return ""


def workspace_id(root: str | Path) -> str:
    path = str(Path(root).resolve())
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(path).name or "root")[:40]
    return f"{name}-{hashlib.sha1(path.encode()).hexdigest()[:12]}"


_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{0,40}-[0-9a-f]{12}$")


def index_dir(data_dir: str | Path, wid: str) -> Path:
    return Path(data_dir) / "indexes" / wid


def is_workspace_id(wid: str) -> bool:
    """Whether *wid* has the form ``workspace_id`` gives (so it names a folder under ``indexes/`` and nothing else)."""
    return bool(_ID_RE.match(wid)) and wid not in (".", "..")


def folder_bytes(folder: str | Path) -> int:
    """Bytes of the files under *folder* (0 when it does not exist)."""
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def remove_index(data_dir: str | Path, wid: str) -> int:
    """Delete a workspace's index folder; the bytes it held. Refuses an id that is not one."""
    if not is_workspace_id(wid):
        raise UnknownWorkspace(f"{wid!r} is not a workspace id")
    folder = index_dir(data_dir, wid)
    freed = folder_bytes(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return freed


class Registry:
    """The registered workspaces: ``{id: root}``, stored atomically in ``<data_dir>/workspaces.json``."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / "workspaces.json"

    def load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return {str(k): str(v) for k, v in data.get("workspaces", {}).items()}

    def add(self, root: str | Path) -> tuple[str, str]:
        """Register ``root`` (an existing directory); return ``(id, resolved root)``.
        UnknownWorkspace says why a folder cannot be one (``root_problem``)."""
        problem = root_problem(str(root))
        if problem:
            raise UnknownWorkspace(problem)
        resolved = Path(root).resolve()
        wid = workspace_id(resolved)
        entries = self.load()
        entries[wid] = str(resolved)
        self._write(entries)
        return wid, str(resolved)

    def remove(self, wid: str) -> None:
        entries = self.load()
        entries.pop(wid, None)
        self._write(entries)

    def resolve(self, ref: str) -> tuple[str, str]:
        """Find a workspace by id or by a path inside it; raise UnknownWorkspace otherwise."""
        entries = self.load()
        if ref in entries:
            return ref, entries[ref]
        if ref:
            try:
                p = Path(ref).resolve()
            except (OSError, RuntimeError):  # a symlink loop (RuntimeError on Python 3.11)
                raise UnknownWorkspace(f"{ref!r} cannot be resolved (symlink loop?)") from None
            except ValueError:  # a NUL byte: check_request_path refuses it before this
                raise UnknownWorkspace(f"{ref!r} is not a path") from None
            best = None
            for wid, root in entries.items():
                r = Path(root)
                if p == r or r in p.parents:
                    if best is None or len(root) > len(best[1]):
                        best = (wid, root)
            if best:
                return best
        elif len(entries) == 1:
            return next(iter(entries.items()))
        if not entries:
            raise UnknownWorkspace("no workspace is registered (run `wsctx add PATH`)")
        listed = ", ".join(f"{root} ({wid})" for wid, root in sorted(entries.items(), key=lambda e: e[1]))
        if not ref:
            raise UnknownWorkspace(f"{len(entries)} workspaces are registered: pass --workspace with one of {listed}")
        raise UnknownWorkspace(f"{ref!r} is in no registered workspace; registered: {listed} "
                               "(pass --workspace, or `wsctx add PATH` to register another)")

    def _write(self, entries: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".workspaces.")
        with os.fdopen(fd, "w") as fh:
            json.dump({"workspaces": entries}, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


#: The longest path a request may name (Linux's PATH_MAX).
MAX_PATH_CHARS = 4096


def check_request_path(field: str, path: str) -> None:
    """BadMessage naming *field* for a path from a request that no file can have: a NUL byte, a
    lone surrogate (not UTF-8), or longer than ``MAX_PATH_CHARS``. Every path field of a request
    passes here before anything resolves or reads it."""
    from protocol.errors import BadMessage

    if "\x00" in path:
        raise BadMessage(f"{field}: a path with a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise BadMessage(f"{field}: a path of {len(path)} characters (the limit is {MAX_PATH_CHARS})")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise BadMessage(f"{field}: a path that is not valid UTF-8") from None


def safe_relpath(root: str | Path, path: str) -> str:
    """Return ``path`` relative to ``root`` if it names a file inside it (no ``..`` out, no link
    that leads out). Raises ``BadMessage`` otherwise; every field that names a file goes through here.

    A link inside the workspace to a file inside it keeps its own path (``README.md`` for
    ``README.md -> crate/README.md``), so it is indexed and answered under the name the user
    sees; a path that reaches the workspace only through a link outside it (an absolute path
    under another name of the root) is given relative to the resolved root.
    """
    from protocol.errors import BadMessage

    if not path or "\x00" in path:
        raise BadMessage("empty path or NUL in path")
    root_p = Path(root).resolve()
    candidate = Path(path) if os.path.isabs(path) else root_p / path
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError on Python 3.11)
        raise BadMessage(f"path {path!r} cannot be resolved (symlink loop?)") from None
    if resolved != root_p and root_p not in resolved.parents:
        raise BadMessage(f"path {path!r} is outside the workspace")
    if ".." not in Path(path).parts:  # ".." after a link is not lexical: only the resolved path is sure
        for base in (root_p, Path(os.path.abspath(root))):
            try:
                own = Path(os.path.normpath(candidate)).relative_to(base)
            except ValueError:
                continue
            if own.parts:
                return own.as_posix()
    return resolved.relative_to(root_p).as_posix()


def inside(root: str | Path, fd: int) -> bool:
    """Whether open file *fd* is a file inside *root* now (``/proc/self/fd`` names what was
    opened, after every link), so a link swapped between a check and a read cannot leak a file."""
    root_p = Path(root).resolve()
    try:
        opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return False
    return root_p in opened.parents


def read_inside(root: str | Path, rel: str, max_bytes: int | None = None) -> bytes:
    """The bytes of workspace file *rel* (``safe_relpath``'d), read only if what is opened is
    inside *root* at the moment it is read; OSError otherwise (or if it cannot be read)."""
    full = Path(root) / rel
    fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not inside(root, fd):
            raise PermissionError(f"{rel} leads outside the workspace")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read() if max_bytes is None else fh.read(max_bytes + 1)
    finally:
        os.close(fd)


def check_event(registry: Registry, workspace: str, root: str, path: str) -> str:
    """Validate an index event's workspace, root and path before anything is read or written.

    The workspace must be registered with exactly this root, and ``path`` must be a plain relative
    path (no ``..``, not absolute, no NUL). Returns the normalised relative path; raises
    ``UnknownWorkspace`` or ``BadMessage``. (Events only come over owner-only ipc sockets, but a
    stray or hostile sender must still not make the chunker read, or the embedder write, outside.)
    """
    from pathlib import PurePosixPath

    from protocol.errors import BadMessage

    registered = registry.load().get(workspace)
    if registered is None:
        raise UnknownWorkspace(f"event for unregistered workspace {workspace!r}")
    if root != registered and str(Path(root).resolve()) != str(Path(registered).resolve()):
        raise BadMessage(f"event root {root!r} is not the root of workspace {workspace!r}")
    # a backslash is an ordinary character of a POSIX file name (``back\\slash.py``), never a
    # separator here: only "/" splits, and ".." parts are refused below
    if not path or "\x00" in path or os.path.isabs(path):
        raise BadMessage(f"bad path {path!r} in event")
    parts = PurePosixPath(path).parts
    if any(p in ("..", ".") for p in parts):
        raise BadMessage(f"path {path!r} in event leaves the workspace")
    return PurePosixPath(*parts).as_posix()
