"""Which files of a workspace get indexed: git's ignore rules, a default exclude list, a size cap,
the user's include/exclude globs, and a content sniff that skips binary and non-UTF-8 files.

Ignore rules follow git: ``.gitignore`` files at every level (deeper files win), then
``.git/info/exclude`` and the global excludes file (``core.excludesFile``, else
``~/.config/git/ignore``). The last matching pattern decides, so negations (``!keep.log``) work.
A line of an ignore file that makes no pattern (a lone ``!``, a trailing ``\\``, a range such as
``[z-a]``) matches nothing, as in git: it is left out and reported (``ignore_spec``), never fails
the walk. A user glob that makes no pattern is a settings error (``bad_glob``).
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pathspec

DEFAULT_EXCLUDES = [
    ".git/", ".hg/", ".svn/", "node_modules/", "bower_components/", "vendor/", "third_party/",
    "build/", "dist/", "out/", "target/", "_build/", ".next/", ".nuxt/", "coverage/",
    "__pycache__/", ".venv/", "venv/", ".tox/", ".nox/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/",
    ".idea/", ".vscode/", "*.egg-info/", ".eggs/",
    "*.min.js", "*.min.css", "*.map", "*.bundle.js",
    "package-lock.json", "yarn.lock", "pnpm-lock.yaml", "Cargo.lock", "poetry.lock", "Pipfile.lock",
    "uv.lock", "composer.lock", "Gemfile.lock", "go.sum", "*.lock",
    "*.pyc", "*.pyo", "*.so", "*.dylib", "*.dll", "*.exe", "*.o", "*.a", "*.obj", "*.class", "*.jar",
    "*.war", "*.whl", "*.zip", "*.tar", "*.gz", "*.tgz", "*.bz2", "*.xz", "*.7z", "*.rar",
    "*.png", "*.jpg", "*.jpeg", "*.gif", "*.bmp", "*.ico", "*.webp", "*.tiff", "*.psd",
    "*.mp3", "*.mp4", "*.wav", "*.ogg", "*.mov", "*.avi", "*.pdf", "*.woff", "*.woff2", "*.ttf", "*.otf", "*.eot",
    "*.db", "*.sqlite", "*.sqlite3", "*.bin", "*.onnx", "*.safetensors", "*.pt", "*.npy", "*.npz",
    "*.parquet", "*.lance", "*.pkl", ".DS_Store",
]

SNIFF_BYTES = 8192


@dataclass(frozen=True)
class FileVerdict:
    """What the watcher decided about one file: indexable or skipped, and why."""

    ok: bool
    reason: str = ""
    content_hash: str = ""
    size: int = 0


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def sniff(data: bytes, max_bytes: int, data_name: str | None = None) -> FileVerdict:
    """Classify file contents: too large, binary (NUL byte), not UTF-8, empty, data or generated
    (``data_file_reason``, judged when the file's name *data_name* is given), or indexable."""
    if len(data) > max_bytes:
        return FileVerdict(False, f"larger than {max_bytes} bytes", size=len(data))
    if b"\x00" in data[:SNIFF_BYTES] or b"\x00" in data:
        return FileVerdict(False, "binary (NUL byte)", size=len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return FileVerdict(False, f"not UTF-8 ({exc.reason} at byte {exc.start})", size=len(data))
    if not text.strip():
        return FileVerdict(False, "empty", size=len(data))
    reason = data_file_reason(data_name, text, len(data)) if data_name is not None else ""
    if reason:
        return FileVerdict(False, reason, size=len(data))
    return FileVerdict(True, content_hash=content_hash(data), size=len(data))


#: Data formats: a file of one of these over DATA_MAX_BYTES is data, not code to search.
DATA_SUFFIXES = (".json", ".jsonl", ".ndjson", ".geojson", ".csv", ".tsv", ".xml", ".svg", ".yaml", ".yml", ".txt", ".dat", ".tab")
DATA_MAX_BYTES = 64_000
#: A line longer than this is generated (minified code, a one-line vocabulary).
GENERATED_LINE_CHARS = 5_000
#: A file over LITERAL_MIN_BYTES whose non-blank lines are at least LITERAL_SHARE numbers and
#: strings alone (a vocabulary, a fixture table, a results dump) is data too.
LITERAL_MIN_BYTES = 16_000
LITERAL_SHARE = 0.8

_STRING_RE = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'""")
_NUMBER_RE = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?)")
_LITERAL_WORDS_RE = re.compile(r"\b(?:true|false|null|none|nan|inf)\b", re.IGNORECASE)


def _literal_only(line: str) -> bool:
    """A line holding nothing but string and number literals and punctuation."""
    rest = _LITERAL_WORDS_RE.sub("", _NUMBER_RE.sub("", _STRING_RE.sub("", line)))
    return not any(c.isalpha() or c == "_" for c in rest)


def data_file_reason(path: str, text: str, size: int | None = None) -> str:
    """Why a text file is data or generated rather than code to search, or '' (the data-file
    policy; the watcher counts it as skipped with this reason; a file an include glob matches is
    not judged). *size* is its length in bytes, when the caller has it."""
    if size is None:
        size = len(text.encode("utf-8", "surrogatepass"))
    suffix = os.path.splitext(path)[1].lower()
    if suffix in DATA_SUFFIXES and size > DATA_MAX_BYTES:
        return f"data file ({suffix} over {DATA_MAX_BYTES // 1000} KB)"
    lines = text.splitlines()
    longest = max((len(line) for line in lines), default=0)
    if longest > GENERATED_LINE_CHARS:
        return f"generated (a line of {longest} characters)"
    if size > LITERAL_MIN_BYTES:
        rows = [line for line in lines if line.strip()]
        literal = sum(1 for line in rows if _literal_only(line))
        if rows and literal / len(rows) >= LITERAL_SHARE:
            return f"data ({100 * literal // len(rows)} % of lines are only numbers and strings)"
    return ""


#: The skip reason of a file whose path holds bytes that are not UTF-8.
NOT_UTF8_NAME = "file name is not valid UTF-8"


def is_utf8_path(path: str) -> bool:
    """Whether ``path`` encodes as UTF-8 (a name decoded from other bytes holds lone surrogates)."""
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def read_file(path: Path, max_bytes: int, data_policy: bool = True, root: Path | None = None) -> tuple[FileVerdict, bytes | None]:
    """Read and sniff one file; return the verdict and, when it is indexable, the bytes judged.

    A path that is not valid UTF-8 (``os.fsdecode`` left a surrogate for the byte) is skipped: no
    message can carry it, and the skip names the reason. With *data_policy*, a data or generated
    file (``data_file_reason``) is skipped with its reason. With *root*, the file is read only if
    what is opened lies inside it at that moment (``workspaces.inside``: a link swapped to point
    out after it was checked is skipped, never read)."""
    from daemons.lib.workspaces import inside

    if not is_utf8_path(str(path)):
        return FileVerdict(False, NOT_UTF8_NAME), None
    try:
        st = path.stat()
        if st.st_size > max_bytes:
            return FileVerdict(False, f"larger than {max_bytes} bytes", size=st.st_size), None
        with path.open("rb") as fh:
            if root is not None and not inside(root, fh.fileno()):
                return FileVerdict(False, OUTSIDE_TARGET), None
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        return FileVerdict(False, f"unreadable ({exc.strerror or exc})"), None
    verdict = sniff(data, max_bytes, path.name if data_policy else None)
    return verdict, data if verdict.ok else None


#: The skip reason of a link that leads outside the workspace when it is read.
OUTSIDE_TARGET = "leads outside the workspace"


def classify_file(path: Path, max_bytes: int, data_policy: bool = True, root: Path | None = None) -> FileVerdict:
    """Read and sniff one file; unreadable files are skipped with the reason (``read_file``)."""
    return read_file(path, max_bytes, data_policy, root)[0]


def _global_excludes_file() -> Path | None:
    try:
        out = subprocess.run(["git", "config", "--global", "--get", "core.excludesFile"], capture_output=True, text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            return Path(os.path.expanduser(out.stdout.strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "git" / "ignore"


def _pattern_error(line: str) -> str:
    """Why *line* makes no git ignore pattern, or ''."""
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except (ValueError, re.error) as exc:
        return str(exc) or type(exc).__name__
    return ""


def ignore_spec(lines: Iterable[str]) -> tuple[pathspec.GitIgnoreSpec, list[str]]:
    """The patterns of an ignore file's *lines* as one spec, and the lines left out because no
    pattern can be made of them (git matches nothing with such a line and reads on)."""
    lines = list(lines)
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines), []
    except (ValueError, re.error):
        bad = [line for line in lines if _pattern_error(line)]
        return pathspec.GitIgnoreSpec.from_lines([line for line in lines if line not in bad]), bad


def bad_glob(globs: Iterable[str]) -> str:
    """The first of the user's include or exclude *globs* that makes no pattern, with why, or ''."""
    for glob in globs:
        why = _pattern_error(glob)
        if why:
            return f"{glob!r} is not a valid glob ({why})"
    return ""


def own_rel_folders(root: Path, folders: Iterable[str | Path]) -> tuple[str, ...]:
    """Those of *folders* inside *root* (resolved), as paths relative to it."""
    out = []
    for folder in folders:
        try:
            rel = Path(folder).resolve().relative_to(root)
        except (ValueError, OSError, RuntimeError):
            continue
        # the workspace inside the data dir (rather than the other way) is not excluded whole
        if rel.parts:
            out.append(rel.as_posix())
    return tuple(out)


def _read_lines(path: Path, root: Path | None = None) -> list[str]:
    """The lines of ignore file *path*; with *root*, only if the file opened lies inside it (an
    in-tree ``.gitignore`` that is a link out is not read: a link must not show another file's lines)."""
    from daemons.lib.workspaces import inside

    try:
        with path.open("rb") as fh:
            if root is not None and not inside(root, fh.fileno()):
                return []
            return fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []


class WorkspaceFilter:
    """Decides, for paths relative to ``root``, whether they are indexed."""

    def __init__(self, root: str | Path, include_globs: list[str] | None = None, exclude_globs: list[str] | None = None, max_file_bytes: int = 1_000_000,
                 on_bad_lines: Callable[[str, list[str]], None] | None = None, own_folders: Iterable[str | Path] = ()) -> None:
        """ValueError names a user glob that makes no pattern. *on_bad_lines(file, lines)* hears of
        each ignore file's lines that make none, once per reading of that file. *own_folders*
        (the product's data and runtime dirs) are never indexed, whatever the globs say: a
        workspace that holds them would index its own logs and tables, which change with every
        write, in a loop."""
        problem = bad_glob([*(include_globs or []), *(exclude_globs or [])])
        if problem:
            raise ValueError(f"include_globs/exclude_globs: {problem}")
        self.root = Path(root).resolve()
        self.own = own_rel_folders(self.root, own_folders)
        self.max_file_bytes = max_file_bytes
        self.on_bad_lines = on_bad_lines
        self.defaults = pathspec.GitIgnoreSpec.from_lines(DEFAULT_EXCLUDES)
        self.user_excludes = pathspec.GitIgnoreSpec.from_lines(exclude_globs or [])
        self.user_includes = pathspec.GitIgnoreSpec.from_lines(include_globs) if include_globs else None
        gx = _global_excludes_file()
        # the global file's patterns, then .git/info/exclude's: the later ones decide
        self.top = pathspec.GitIgnoreSpec.from_lines([])
        for path, within in ([(gx, None)] if gx is not None else []) + [(self.root / ".git" / "info" / "exclude", self.root)]:
            self.top += self._checked(str(path), _read_lines(path, within))
        self._nested: dict[str, pathspec.GitIgnoreSpec | None] = {}

    def _checked(self, name: str, lines: list[str]) -> pathspec.GitIgnoreSpec:
        """``ignore_spec(lines)``'s spec; the lines that make no pattern are reported under *name*."""
        spec, bad = ignore_spec(lines)
        if bad and self.on_bad_lines is not None:
            self.on_bad_lines(name, bad)
        return spec

    def _spec_for_dir(self, rel_dir: str) -> pathspec.GitIgnoreSpec | None:
        if rel_dir not in self._nested:
            lines = _read_lines(self.root / rel_dir / ".gitignore", self.root)
            self._nested[rel_dir] = self._checked(f"{rel_dir}/.gitignore" if rel_dir else ".gitignore", lines) if lines else None
        return self._nested[rel_dir]

    def data_policy_applies(self, rel: str) -> bool:
        """Whether the data-file policy judges ``rel``: not when an include glob matches it (with
        include globs the user says which files to index, data or not)."""
        return self.user_includes is None or not self.user_includes.match_file(rel)

    def forget_gitignore(self, rel_dir: str) -> None:
        """A ``.gitignore`` changed: re-read it on next use."""
        self._nested.pop(rel_dir, None)

    def is_own(self, rel: str) -> bool:
        """Whether *rel* is one of the product's own folders or inside one."""
        return any(rel == own or rel.startswith(own + "/") for own in self.own)

    def is_ignored(self, rel: str, is_dir: bool = False) -> bool:
        """True if git (or the defaults, or the user's globs) would leave ``rel`` out, or it is
        one of the product's own folders."""
        if self.own and self.is_own(rel):
            return True
        probe = rel + "/" if is_dir else rel
        if self.user_includes is not None and not is_dir and not self.user_includes.match_file(rel):
            return True
        if self.defaults.match_file(probe) or self.user_excludes.match_file(probe):
            return True
        verdict: bool | None = None
        r = self.top.check_file(probe)
        if r.include is not None:
            verdict = r.include
        parts = rel.split("/")
        # .gitignore of each ancestor directory, root first; deeper files override.
        for depth in range(len(parts)):
            rel_dir = "/".join(parts[:depth])
            spec = self._spec_for_dir(rel_dir)
            if spec is None:
                continue
            sub = "/".join(parts[depth:]) + ("/" if is_dir else "")
            r = spec.check_file(sub)
            if r.include is not None:
                verdict = r.include
        return bool(verdict)

    def is_ignored_path(self, rel: str) -> bool:
        """True if ``rel`` or any of its parent directories is ignored."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if self.is_ignored("/".join(parts[:i]), is_dir=True):
                return True
        return self.is_ignored(rel)

    def iter_files(self, on_skip: Callable[[str, str], None] | None = None, folders: bool = False) -> Iterator[str]:
        """Every non-ignored regular file under root (relative posix paths); links to dirs are not followed.
        With *folders*, each folder walked is yielded too, as its path and a slash (``""`` for the
        root), before its files: a caller that bounds or pauses its walk can count them.

        What the walk passes by that is not ignored is told to *on_skip* as ``(relative path,
        reason)``: a folder it cannot list (no permission, a path longer than the system allows:
        the files under it are never seen), a link that leads outside the workspace or to no
        file, a link loop."""
        def unlisted(exc: OSError) -> None:
            if on_skip is not None and exc.filename is not None:
                rel = os.path.relpath(os.fsdecode(exc.filename), self.root).replace(os.sep, "/")
                on_skip(rel + "/", f"folder not listed ({exc.strerror or exc}): the files under it are not indexed")

        def skip(rel: str, reason: str) -> None:
            if on_skip is not None:
                on_skip(rel, reason)

        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False, onerror=unlisted):
            rel_dir = os.path.relpath(dirpath, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
            if folders:
                yield rel_dir + "/" if rel_dir else ""
            keep = []
            for d in sorted(dirnames):
                rel = f"{rel_dir}/{d}" if rel_dir else d
                if not os.path.islink(os.path.join(dirpath, d)) and not self.is_ignored(rel, is_dir=True):
                    keep.append(d)
            dirnames[:] = keep
            for name in sorted(filenames):
                rel = f"{rel_dir}/{name}" if rel_dir else name
                full = os.path.join(dirpath, name)
                if self.is_ignored(rel):
                    continue
                if os.path.islink(full):
                    try:
                        target = Path(full).resolve(strict=True)
                    except RuntimeError:  # a link loop on Python 3.11 (OSError ELOOP on later ones)
                        skip(rel, "a link loop")
                        continue
                    except OSError as exc:
                        skip(rel, "a link loop" if exc.errno == errno.ELOOP else f"a link to nothing ({exc.strerror or exc})")
                        continue
                    if self.root not in target.parents:
                        skip(rel, OUTSIDE_TARGET)
                        continue
                    if not target.is_file():
                        if not target.is_dir():  # links to folders are not followed, by design: no reason to give
                            skip(rel, "a link to something that is not a file")
                        continue
                yield rel


def indexable_files(root: str | Path, include_globs: list[str] | None = None, exclude_globs: list[str] | None = None,
                    max_file_bytes: int = 1_000_000) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """What the watcher would index under ``root``: ``(relative path, bytes)`` of each file, and
    ``{relative path: why not}`` of the files it walks past (binary, too large, data)."""
    wf = WorkspaceFilter(root, include_globs, exclude_globs, max_file_bytes)
    kept: list[tuple[str, bytes]] = []
    skipped: dict[str, str] = {}
    for rel in wf.iter_files():
        verdict, data = read_file(wf.root / rel, max_file_bytes, data_policy=wf.data_policy_applies(rel))
        if data is None:
            skipped[rel] = verdict.reason
        else:
            kept.append((rel, data))
    return kept, skipped


def mtime_ns(path: Path) -> int:
    """*path*'s modification time in ns, 0 when it cannot be read."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def newest_first(root: Path, rels: Iterable[str], mtimes: dict[str, int] | None = None) -> list[str]:
    """*rels* by modification time, newest first (then by name): the files a user is working on
    are indexed first, so a question about them is answered while a large workspace still builds.
    *mtimes* holds times already read (``mtime_ns``); the others are read here."""
    known = mtimes or {}
    return sorted(rels, key=lambda rel: (-(known[rel] if rel in known else mtime_ns(root / rel)), rel))
