"""The context line's notes: what shaped an answer beyond its blocks, in a few words each.

Each function returns "" (or no line) when it has nothing to say, so the context line skips it:
the role weights and question copies that weighed candidates down, the files the question named,
the focus files used, blocks whose file changed since it was indexed, how much of the index is
built, kinds of file the question asks for that the index lacks, and a follow-up that found
nothing new. ``pipeline.notes`` gathers them in the order they are printed.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from daemons.lib.filtering import content_hash
from daemons.lib.fusion import FOCUS_KEYWORD, FOCUS_VECTOR, MENTIONED
from daemons.lib.roles import CONFIG, DOC, SOURCE, TEST, VENDORED, file_role


def missing_roles_note(roles: Sequence[str]) -> str:
    """``no test files are indexed`` for the kinds of file a question asks for that the workspace's
    index holds none of ("how is it tested?" in a tree without tests); "" when none is missing."""
    if not roles:
        return ""
    names = [f"{role} files" if role != CONFIG else "build or config files" for role in roles]
    return f"no {' or '.join(names)} are indexed"


def copies_note(count: int, weight: float) -> str:
    """``2 candidates quote the question ×0.25`` when *count* candidates hold the question as a
    string literal and were weighted down by *weight* (``echoes``); "" otherwise."""
    if not count or weight >= 1.0:
        return ""
    return f"{count} candidate{'s' if count != 1 else ''} quot{'e' if count != 1 else 'es'} the question ×{weight:g}"


def nothing_new_note(follow_up: bool, previous_files: Sequence[str], files: Sequence[str]) -> str:
    """For a follow-up whose answer names only files the previous answer gave, say so; else ""."""
    if not follow_up or not files or not previous_files or not set(files) <= set(previous_files):
        return ""
    return "no files beyond the previous answer"


def weights_note(candidates: Iterable[tuple[str, float]]) -> str:
    """``tests ×0.5, docs ×0.5`` (``vendored ×0.25`` for vendored code) for the roles among ``(path, weight)`` candidates weighted below 1; "" if none."""
    seen: dict[str, float] = {}
    for path, weight in candidates:
        if weight < 1.0:
            seen.setdefault(file_role(path), weight)
    return ", ".join(f"{role if role == VENDORED else role + 's'} ×{seen[role]:g}" for role in (TEST, DOC, CONFIG, VENDORED, SOURCE) if role in seen)


#: How a block's file differs from what the index holds (``Block.changed``; "" when it does not).
CHANGED_ON_DISK = "changed on disk since indexed"
CHANGED_IN_EDITOR = "unsaved changes in the editor"
CHANGED_GONE = "deleted since indexed"


def file_change(indexed_hash: str, disk: bytes | None, buffer: str | None) -> str:
    """How a file differs from its indexed version (content hash *indexed_hash*): the editor's
    *buffer* when one was sent (compared by content, so its line endings may differ from disk),
    else the bytes on *disk* (None: the file is gone); "" when it is the indexed version."""
    if buffer is not None:
        if content_hash(buffer.encode("utf-8", "surrogatepass")) == indexed_hash:
            return ""
        if disk is not None and _same_text(buffer, disk) and content_hash(disk) != indexed_hash:
            return CHANGED_ON_DISK
        return CHANGED_IN_EDITOR
    if disk is None:
        return CHANGED_GONE
    return "" if content_hash(disk) == indexed_hash else CHANGED_ON_DISK


def _same_text(text: str, data: bytes) -> bool:
    try:
        disk = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text.replace("\r\n", "\n") == disk.replace("\r\n", "\n")


def changed_note(changes: Iterable[str]) -> str:
    """``2 blocks changed since indexed (1 on disk, 1 unsaved in the editor)`` for the answer's
    blocks whose file differs from the indexed version; "" if none."""
    counts = {kind: 0 for kind in (CHANGED_ON_DISK, CHANGED_IN_EDITOR, CHANGED_GONE)}
    for change in changes:
        if change:
            counts[change] += 1
    total = sum(counts.values())
    if not total:
        return ""
    words = {CHANGED_ON_DISK: "on disk", CHANGED_IN_EDITOR: "unsaved in the editor", CHANGED_GONE: "deleted"}
    parts = ", ".join(f"{n} {words[k]}" for k, n in counts.items() if n)
    return f"{total} block{'s' if total != 1 else ''} changed since indexed ({parts})"


def progress_notes(progress: Mapping[str, object]) -> list[str]:
    """What the watcher's counts of a workspace say about the answer: ``index N% built`` while
    files are not in the table yet (or stale), else ``vectors N% built`` while files are in it
    with their keyword text only; nothing once every file is fully indexed."""
    pending = int(progress.get("pending") or 0)
    if not pending:
        return []
    total = int(progress.get("files") or 0)
    keyword_only = int(progress.get("vectors_pending") or 0)
    if pending > keyword_only:
        done = int(progress.get("indexed_files") or 0)
        pct = int(100 * done / total) if total else 0
        return [f"index {pct}% built ({done} of {total} files, {pending} pending)"]
    pct = int(100 * (total - keyword_only) / total) if total else 0
    return [f"vectors {pct}% built ({keyword_only} of {total} files searched by keywords only)"]


#: Focus files named in the context line; more are counted.
FOCUS_NOTE_FILES = 3


def focus_note(focus: Sequence[str], candidates: Iterable[tuple[str, Mapping[str, int]]]) -> str:
    """``focus a.py, b.py (+2)`` for the focus files the search was given (active, visible, the
    previous answer's, open), the first ``FOCUS_NOTE_FILES`` named, and ``, 1 used`` counting
    those that gave a candidate through a focus list; "" without focus files."""
    if not focus:
        return ""
    used = {path for path, ranks in candidates if FOCUS_VECTOR in ranks or FOCUS_KEYWORD in ranks}
    more = f" (+{len(focus) - FOCUS_NOTE_FILES})" if len(focus) > FOCUS_NOTE_FILES else ""
    return f"focus {', '.join(focus[:FOCUS_NOTE_FILES])}{more}, {len(used & set(focus))} used"


def named_note(candidates: Iterable[tuple[str, Mapping[str, int]]]) -> str:
    """``named a.py, b/c.py`` for the files among ``(path, ranks)`` candidates that entered as named
    in the question (the ``mentioned`` list), in that list's order; "" if none."""
    named: dict[str, int] = {}
    for path, ranks in candidates:
        if MENTIONED in ranks:
            named[path] = min(ranks[MENTIONED], named.get(path, ranks[MENTIONED]))
    return "named " + ", ".join(sorted(named, key=named.__getitem__)) if named else ""
