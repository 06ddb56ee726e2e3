"""What ``wsctx status`` and ``wsctx ask`` print: the daemons' and the workspaces' tables, the
indexing progress line and an answer for a terminal, from the daemons' status replies (as
builtins) and the registry; no sockets.

``workspace_report`` also reads the registry and, when the embedder does not answer, the tables
themselves (``IndexStore.counts`` and ``mismatch``), so ``status`` still says what is indexed.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_age(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "never"
    return fmt_duration(max(0.0, (now or time.time()) - float(ts))) + " ago"


def fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def daemon_rows(statuses: dict[str, dict[str, Any] | None], slow: dict[str, int] | None = None) -> list[list[Any]]:
    """A row per daemon; one in *slow* (``{name: pid}``: alive but its status probe missed) reads
    "slow", not "down"."""
    rows = []
    slow = slow or {}
    for name, st in statuses.items():
        if st is None and name in slow:
            rows.append([name, "slow", slow[name], "-", "-"])
        elif st is None:
            rows.append([name, "down", "-", "-", "-"])
        else:
            rows.append([name, "up", st.get("pid"), fmt_duration(st.get("uptime_s")), st.get("queue_depth", 0)])
    return rows


def format_daemons(statuses: dict[str, dict[str, Any] | None], slow: dict[str, int] | None = None) -> str:
    return table(["daemon", "state", "pid", "uptime", "queue"], daemon_rows(statuses, slow))


NOT_RUNNING = "wsctx is not running: start it with `wsctx up`"


def workspace_report(settings, statuses: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """Per registered workspace: files on disk, indexed files, chunks, rows, pending, last update, problems."""
    from daemons.lib.store import table_mtime
    from daemons.lib.workspaces import Registry, folder_bytes, index_dir

    watcher = ((statuses.get("watcher") or {}).get("details") or {}).get("workspaces") or {}
    emb_status = statuses.get("embedder")
    emb_details = (emb_status or {}).get("details") or {}
    embedder = emb_details.get("workspaces") or {}
    model_error = emb_details.get("model_error") or ""
    write_error = emb_details.get("write_error") or ""
    writes_failed = emb_details.get("writes_failed") or 0
    out: dict[str, dict[str, Any]] = {}
    # with every daemon down, one plain problem says so, not what each missing daemon would degrade
    all_down = bool(statuses) and all(st is None for st in statuses.values())
    for wid, root in sorted(Registry(settings.data_dir).load().items()):
        w, e = watcher.get(wid), embedder.get(wid)
        problems: list[str] = [NOT_RUNNING] if all_down else []
        entry: dict[str, Any] = {
            "root": root, "files": None, "indexed_files": None, "chunks": None, "rows": None,
            "pending": None, "vectors_pending": None, "skipped": None, "last_update": None, "last_reconcile": None, "problems": problems,
        }
        entry["index_bytes"] = folder_bytes(index_dir(settings.data_dir, wid))
        if not Path(root).is_dir():
            problems.append(f"workspace folder {root} does not exist: `wsctx remove {wid}` or `wsctx gc` drops its index")
        if write_error:
            problems.append(f"writes failing: {_write_reason(write_error)} ({writes_failed} failed); indexing resumes by itself when they succeed")
        if w is not None and w.get("walk_stopped"):
            problems.append(f"the watcher's walk stopped early ({w['walk_stopped']}): files past that point are not indexed; "
                            "raise walk_max_entries or walk_max_s, or add a smaller folder")
        if w is not None:
            entry.update(files=w.get("files"), indexed_files=w.get("indexed_files"), pending=w.get("pending"), vectors_pending=w.get("vectors_pending"),
                         skipped=w.get("skipped"), last_reconcile=w.get("last_reconcile") or None)
        elif statuses.get("watcher") is None:
            if not all_down:
                problems.append("watcher is down: files on disk and pending work unknown")
        else:
            busy = ((statuses.get("watcher") or {}).get("details") or {}).get("reconciling")
            problems.append(f"watcher is walking workspace {busy['workspace']} ({busy['for_s']:g} s so far)" if busy
                            else "watcher has not picked this workspace up yet")
        if e is not None:
            if e.get("problem"):
                problems.append(str(e["problem"]) + f" (run `wsctx rebuild {wid}`)")
            entry.update(chunks=e.get("chunks"), rows=e.get("rows"), last_update=e.get("last_update") or None)
            if entry["indexed_files"] is None:
                entry["indexed_files"] = e.get("files")
        else:
            if emb_status is None:
                if not all_down:
                    problems.append("embedder is down: indexing paused, search is keywords-only")
            elif model_error:
                problems.append(f"embedder has no model: {model_error}")
            folder = index_dir(settings.data_dir, wid)
            counts = _table_counts(folder, settings, problems)
            if counts:
                entry.update(chunks=counts["chunks"], rows=counts["rows"], last_update=table_mtime(folder))
                if entry["indexed_files"] is None:
                    entry["indexed_files"] = counts["files"]
        out[wid] = entry
    return out


def _write_reason(error: str) -> str:
    """A failed write's error as a user reads it: ``no space left on device`` rather than the errno dump."""
    low = error.lower()
    for needle, reason in (("no space left", "no space left on device"), ("disk quota", "disk quota exceeded"),
                           ("read-only file system", "read-only file system"), ("permission denied", "permission denied")):
        if needle in low:
            return reason
    return error[:200]


def _table_counts(folder: Path, settings, problems: list[str]) -> dict[str, int] | None:
    try:
        from daemons.lib.store import IndexStore

        store = IndexStore.open_reader(folder)
        if store is None:
            return {"files": 0, "chunks": 0, "rows": 0}
        # only what the table recorded: an older table may lack a setting added since
        diff = store.mismatch({k: v for k, v in settings.index_shape().items() if k in store.meta})
        if diff:
            problems.append("rebuild needed: " + "; ".join(diff))
        return store.counts()
    except Exception as exc:  # noqa: BLE001 - a table being rebuilt or written right now
        problems.append(f"cannot read the table: {exc}")
        return None


def format_workspaces(report: dict[str, dict[str, Any]], now: float | None = None) -> str:
    if not report:
        return "no workspaces registered (run `wsctx add PATH`)"
    rows = [
        [wid, e["files"], e["indexed_files"], e["chunks"], e["rows"], e["pending"], fmt_age(e["last_update"], now),
         f"{e['index_bytes'] / 1e6:.1f} MB" if e.get("index_bytes") is not None else None]
        for wid, e in report.items()
    ]
    lines = [table(["workspace", "files", "indexed", "chunks", "rows", "pending", "last update", "index"], rows)]
    for wid, e in report.items():
        lines.append(f"  {wid}: {e['root']}")
        if e.get("vectors_pending"):
            lines.append(f"    {e['vectors_pending']} of the pending files are searched by keywords only until their vectors are built")
        for p in e["problems"]:
            lines.append(f"    ! {p}")
    return "\n".join(lines)


def format_ask(reply: dict[str, Any]) -> str:
    """An AskReply (as builtins) for a terminal: blocks, near misses, then the context line."""
    out: list[str] = []
    for block in reply.get("blocks", []):
        head = [f"== {block['label']}"]
        if block.get("probability") is not None:
            head.append(f"p={block['probability']:.2f}")
        if block.get("retrievers"):
            head.append("[" + ", ".join(block["retrievers"]) + "]")
        if block.get("team"):
            head.append(f"(team {block['team']})")
        if block.get("kind") and block["kind"] != "code":
            head.append(f"({block['kind']})")
        if block.get("changed"):
            head.append(f"({block['changed']})")
        out.append("  ".join(head))
        out.append(block.get("text", "").rstrip("\n"))
        out.append("")
    if not reply.get("blocks"):
        out.append("(no code above the threshold)")
        out.append("")
    misses = reply.get("near_misses") or []
    if misses:
        out.append("near misses:")
        for m in misses:
            out.append(f"  {m['label']}  p={m['probability']:.2f}")
        out.append("")
    out.append(reply.get("context_line", ""))
    return "\n".join(out)


def still_indexing(report: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The workspaces not reconciled yet or with files pending."""
    return {w: e for w, e in report.items() if e["pending"] != 0 or not e["last_reconcile"]}


def indexing_done(report: dict[str, dict[str, Any]]) -> bool:
    """True when every workspace has been reconciled and nothing is pending."""
    return not still_indexing(report)


#: Without a terminal, ``status --wait`` prints its progress at most this often.
PROGRESS_EVERY_S = 5.0


def progress_line(report: dict[str, dict[str, Any]], first_indexed: int, elapsed_s: float) -> str:
    """One line of indexing progress over the workspaces not done yet: files indexed of all,
    rows, the rate since waiting began (*first_indexed* files were indexed then) and the time left."""
    busy = list(still_indexing(report).values())
    files = sum(e["files"] or 0 for e in busy)
    done = sum(e["indexed_files"] or 0 for e in busy)
    pending = sum(e["pending"] or 0 for e in busy)
    rows = sum(e["rows"] or 0 for e in busy)
    keyword_only = sum(e.get("vectors_pending") or 0 for e in busy)
    line = f"indexing: {done:,} of {files:,} files" + (f" ({100 * done // files}%)" if files else "") + f", {rows:,} rows"
    if keyword_only:
        line += f" ({keyword_only:,} files keyword-only, vectors to come)"
    rate = (done - first_indexed) / elapsed_s if elapsed_s > 0 else 0.0
    if rate > 0:
        line += f", {rate:.1f} files/s, about {_duration(pending / rate)} left"
    elif pending:
        line += f", {pending:,} pending"
    return line


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds} s" if seconds < 90 else f"{seconds // 60} min {seconds % 60:02d} s"
