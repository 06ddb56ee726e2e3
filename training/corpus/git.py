"""Reading a bare git directory: commits with their messages, changed files, diffs and blobs.

Every call runs ``git`` with ``--git-dir``; blobs come from one long-lived ``git cat-file --batch``
process, so reading thousands of files costs no process start each.
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_SEP = "\x1e"  # between commits
_FIELD = "\x1f"  # between fields of one commit


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author: str
    message: str

    @property
    def is_merge(self) -> bool:
        return len(self.parents) > 1


class Repo:
    """A bare (or ordinary) git directory, read only."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = Path(git_dir)
        self._batch: subprocess.Popen[bytes] | None = None

    def git(self, *args: str) -> str:
        """Run one git command; its stdout decoded leniently."""
        out = subprocess.run(["git", "--git-dir", str(self.git_dir), *args], capture_output=True, check=True).stdout
        return out.decode("utf-8", "replace")

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def commits(self, tip: str) -> Iterator[Commit]:
        """Every commit reachable from ``tip``, newest first (``git log`` order)."""
        fmt = _SEP + _FIELD.join(["%H", "%P", "%an <%ae>", "%B"])
        proc = subprocess.Popen(["git", "--git-dir", str(self.git_dir), "log", f"--format={fmt}", tip],
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None
        buf = ""
        for raw in iter(lambda: proc.stdout.read(1 << 16), b""):  # type: ignore[union-attr]
            buf += raw.decode("utf-8", "replace")
            *done, buf = buf.split(_SEP)
            for rec in done:
                c = _parse(rec)
                if c is not None:
                    yield c
        c = _parse(buf)
        if c is not None:
            yield c
        proc.wait()

    def changed_files(self, parent: str, commit: str) -> list[tuple[str, str]]:
        """``(status, path)`` of each file the commit changed against ``parent``; a rename's
        path is its old one (``R`` status), since the question is asked of the parent."""
        out = []
        for line in self.git("diff-tree", "-r", "-M", "--no-commit-id", "--name-status", parent, commit).splitlines():
            parts = line.split("\t")
            if len(parts) >= 2:
                out.append((parts[0][:1], parts[1]))
        return out

    def diff(self, parent: str, commit: str, paths: list[str]) -> str:
        """The ``-U0`` diff of ``paths``, whitespace changes ignored (a reformat leaves no hunk)."""
        return self.git("diff", "-U0", "--no-color", "--no-ext-diff", "-w", "--no-renames", parent, commit, "--", *paths)

    def files(self, commit: str) -> dict[str, str]:
        """``{path: blob sha}`` of every file in ``commit``'s tree."""
        out = {}
        for line in self.git("ls-tree", "-r", commit).splitlines():
            meta, _, path = line.partition("\t")
            bits = meta.split()
            if len(bits) == 3 and bits[1] == "blob":
                out[path] = bits[2]
        return out

    def blob(self, spec: str) -> bytes | None:
        """The object named by ``spec`` (a blob sha or ``commit:path``), or None when missing."""
        if self._batch is None:
            self._batch = subprocess.Popen(["git", "--git-dir", str(self.git_dir), "cat-file", "--batch"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._batch.stdin is not None and self._batch.stdout is not None
        self._batch.stdin.write(spec.encode("utf-8", "surrogateescape") + b"\n")
        self._batch.stdin.flush()
        header = self._batch.stdout.readline().decode()
        if header.endswith("missing\n") or header.endswith("ambiguous\n"):
            return None
        size = int(header.split()[2])
        data = self._batch.stdout.read(size)
        self._batch.stdout.read(1)  # the newline after the object
        return data

    def text(self, spec: str, max_bytes: int = 1 << 20) -> str | None:
        """A blob as text, or None when missing, binary or over ``max_bytes``."""
        data = self.blob(spec)
        if data is None or len(data) > max_bytes or b"\x00" in data[:8192]:
            return None
        return data.decode("utf-8", "replace")

    def close(self) -> None:
        if self._batch is not None:
            assert self._batch.stdin is not None
            self._batch.stdin.close()
            self._batch.wait()
            self._batch = None


def _parse(rec: str) -> Commit | None:
    parts = rec.split(_FIELD, 3)
    if len(parts) != 4:
        return None
    sha, parents, author, message = parts
    return Commit(sha.strip(), tuple(parents.split()), author, message.strip())
