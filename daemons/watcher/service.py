"""The watcher: turns the file system into ``file.changed`` / ``file.deleted`` events for the chunker.

Events from watchdog are only hints. Every ``reconcile_interval_s`` (and on start, and whenever a
downstream daemon asks after a restart) the watcher walks each workspace, hashes what it finds
(re-reading only files whose size or mtime moved) and compares with the hashes the table
holds, as the embedder publishes them beside it (``daemons/lib/catalog.py``; the watcher does
not load LanceDB): files new or different are sent as changed, files the table has and the disk
does not are sent as deleted. So killing any daemon at any moment loses nothing once it is back.

A walk is a resumable step list (``Watcher._walk``) run in slices of ``WALK_SLICE_S``, one slice per
workspace in turn, with the watch's hints checked between slices: a walk of a huge tree holds up
neither the other workspaces nor the control socket, is bounded (``walk_max_entries``,
``walk_max_s``) and ends the moment its workspace is removed.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generator

import zmq
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from daemons.lib import catalog, runtime
from daemons.lib.config import Settings
from daemons.lib.indexing import pending_hash
from daemons.lib.filtering import FileVerdict, WorkspaceFilter, classify_file, mtime_ns, newest_first
from daemons.lib.workspaces import Registry, index_dir, root_problem
from protocol import envelope
from protocol.schema import FileChanged, FileDeleted, ReconcileReply, WorkspaceAddReply

#: A file sent but not yet seen in the table is sent again after this long.
RESEND_AFTER_S = 120.0
#: Seconds a walk runs before the loop takes hints, other workspaces' walks and its own turn again.
WALK_SLICE_S = 0.02
#: Seconds between the status counts the loop refreshes while walks run (the control thread does
#: not wait for the loop: it answers these when the loop holds the workspaces).
STATUS_REFRESH_S = 0.5


@dataclass
class Walk:
    """One workspace's walk in progress: its remaining steps, and whether another is wanted after it."""

    steps: Generator[None, None, None]
    started: float
    again: bool = False
    again_force: bool = False


@dataclass

class WorkspaceState:
    wid: str
    root: Path
    filt: WorkspaceFilter
    stat_cache: dict[str, tuple[int, int, FileVerdict]] = field(default_factory=dict)
    table: dict[str, str] = field(default_factory=dict)  # path -> hash the table holds
    disk: dict[str, str] = field(default_factory=dict)  # path -> hash on disk (indexable files only)
    sent: dict[str, tuple[str, float]] = field(default_factory=dict)  # path -> (hash or "", when)
    skipped: dict[str, str] = field(default_factory=dict)
    last_reconcile: float = 0.0
    watch: Any = None
    #: the root folder's inode when the watch was armed (None: no folder then); a different one
    #: means the folder was deleted and made again, and the old watch sees nothing of it
    root_ino: int | None = None
    #: why the last walk stopped before the end of the tree ("": it went through)
    walk_stopped: str = ""

    def pending(self) -> int:
        changed = sum(1 for p, h in self.disk.items() if self.table.get(p) != h)
        gone = sum(1 for p in self.table if p not in self.disk)
        return changed + gone


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: "Watcher", wid: str) -> None:
        self.watcher, self.wid = watcher, wid

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        if event.event_type in ("deleted", "moved") and event.is_directory:
            self.watcher.folder_gone(self.wid, os.fsdecode(event.src_path))
        for p in (event.src_path, getattr(event, "dest_path", "")):
            if p:
                self.watcher.hint(self.wid, os.fsdecode(p), event.is_directory)


class Watcher(runtime.Service):
    name = "watcher"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.registry = Registry(settings.data_dir)
        self.workspaces: dict[str, WorkspaceState] = {}
        self.lock = threading.RLock()
        #: the status last computed, and the workspace being reconciled (id, since): for ``status``
        self._last_status: dict[str, Any] = {"workspaces": {}}
        self._status_at = 0.0
        self.walks: dict[str, Walk] = {}  # workspace id -> its walk in progress
        self._slice_end = 0.0
        self.hints: dict[tuple[str, str], float] = {}
        self.hint_lock = threading.Lock()
        self.reconcile_wanted: dict[str, bool] = {}  # wid or "" -> force
        self.observer = Observer()
        self.push = runtime.make_socket(self.ctx, zmq.PUSH)
        self.push.setsockopt(zmq.SNDHWM, 100_000)
        self.push.connect(settings.endpoint("chunker.in"))

    # ------------------------------------------------------------------ workspaces

    def load_workspaces(self) -> list[str]:
        """Take up the registered workspaces not yet watched; the ids taken up (each wants a walk)."""
        added = []
        for wid, root in self.registry.load().items():
            if wid not in self.workspaces and self._add(wid, root):
                added.append(wid)
        return added

    def _add(self, wid: str, root: str) -> bool:
        """Watch workspace *wid*; False when its folder is missing or refused."""
        rootp = Path(root)
        if not rootp.is_dir():
            self.log.warning("workspace_missing", workspace=wid, root=root)
            return False
        problem = root_problem(root)
        if problem:  # a registry written by hand: no walk of /proc
            self.log.warning("workspace_refused", workspace=wid, root=root, reason=problem)
            return False
        def bad_lines(name: str, lines: list[str]) -> None:
            self.log.warning("ignore_lines_skipped", workspace=wid, file=name, lines=lines[:5], count=len(lines),
                             reason="no pattern can be made of them; like git, they match nothing")

        ws = WorkspaceState(wid, rootp.resolve(), WorkspaceFilter(rootp, self.s.include_globs, self.s.exclude_globs, self.s.max_file_bytes,
                                                                  on_bad_lines=bad_lines,
                                                                  own_folders=(self.s.data_dir, self.s.runtime_dir)))
        self._arm(ws)
        with self.lock:
            self.workspaces[wid] = ws
        self.log.info("workspace_added", workspace=wid, root=str(ws.root))
        return True

    def _arm(self, ws: WorkspaceState) -> None:
        """(Re)start the recursive watch on the workspace's root, noting the root's inode."""
        if ws.watch is not None:
            try:
                self.observer.unschedule(ws.watch)
            except Exception:  # noqa: BLE001 - the watch may already be gone with its folder
                pass
            ws.watch = None
        try:
            ws.root_ino = ws.root.stat().st_ino
            ws.watch = self.observer.schedule(_Handler(self, ws.wid), str(ws.root), recursive=True)
        except OSError as exc:  # inotify limits: the periodic reconcile still keeps it fresh
            self.log.warning("watch_failed", workspace=ws.wid, error=str(exc))

    def _check_roots(self) -> None:
        """A root folder deleted is reconciled at once (its rows go); one that is back, or made
        again under the same name, gets a new watch and a reconcile, instead of waiting for the
        periodic one with a watch that sees nothing."""
        for ws in self.workspaces.values():
            try:
                ino: int | None = ws.root.stat().st_ino if ws.root.is_dir() else None
            except OSError:
                ino = None
            if ino == ws.root_ino:
                continue
            if ino is None:  # the reconcile asked for below logs workspace_gone
                ws.root_ino = None
            else:
                self.log.info("workspace_back", workspace=ws.wid, root=str(ws.root))
                self._arm(ws)
            self.want_reconcile(ws.wid)

    def _drop(self, wid: str) -> None:
        walk = self.walks.pop(wid, None)
        if walk is not None:
            walk.steps.close()
            self.log.info("walk_abandoned", workspace=wid, reason="workspace removed", after_s=round(time.monotonic() - walk.started, 1))
        ws = self.workspaces.pop(wid, None)
        if ws and ws.watch is not None:
            try:
                self.observer.unschedule(ws.watch)
            except Exception:  # noqa: BLE001 - the watch may already be gone with its folder
                pass

    def folder_gone(self, wid: str, abs_path: str) -> None:
        """The workspace's root folder itself was deleted or moved away: its watch ends with it
        (inotify's IN_DELETE_SELF). Forget the root's inode, so that ``_check_roots`` arms a new
        watch for the folder made again, even one the file system gives the same inode (a folder
        deleted and made again within a second often gets it back)."""
        ws = self.workspaces.get(wid)
        if ws is not None and os.path.normpath(abs_path) == str(ws.root):
            ws.root_ino = None
            self.log.info("workspace_root_gone", workspace=wid, root=str(ws.root))

    def want_reconcile(self, wid: str = "", force: bool = False) -> None:
        with self.hint_lock:
            self.reconcile_wanted[wid] = self.reconcile_wanted.get(wid, False) or force

    # ------------------------------------------------------------------ events

    def hint(self, wid: str, abs_path: str, is_dir: bool) -> None:
        ws = self.workspaces.get(wid)
        if ws is None:
            return
        try:
            rel = Path(abs_path).relative_to(ws.root).as_posix()
        except ValueError:
            return
        if rel == "." or rel.startswith(".git/") or rel == ".git" or ws.filt.is_own(rel):
            return
        if is_dir:
            # A folder appeared, vanished or moved: cheaper to reconcile the workspace than guess.
            self.want_reconcile(wid)
            return
        if rel == ".gitignore" or rel.endswith("/.gitignore"):
            ws.filt.forget_gitignore(rel.rsplit("/", 1)[0] if "/" in rel else "")
            self.want_reconcile(wid)
        with self.hint_lock:
            self.hints[(wid, rel)] = time.monotonic()

    def _due_hints(self) -> list[tuple[str, str]]:
        cut = time.monotonic() - self.s.debounce_ms / 1000
        with self.hint_lock:
            due = [k for k, t in self.hints.items() if t <= cut]
            for k in due:
                del self.hints[k]
        return due

    def _verdict(self, ws: WorkspaceState, rel: str) -> FileVerdict | None:
        """The file's verdict, or None when it does not exist, is not a regular file or is
        ignored. A file that exists but cannot be looked at (no permission, a path longer than
        the system allows) is skipped with that reason, never dropped in silence."""
        full = ws.root / rel
        try:
            if ws.filt.is_ignored_path(rel):
                return None
            st = full.stat()
            if not stat.S_ISREG(st.st_mode):
                return None
            # a link, or a file under a linked folder (``link/passwd``), that leads outside the workspace
            if ws.root not in full.resolve().parents:
                return None
        except (FileNotFoundError, NotADirectoryError, RuntimeError):  # RuntimeError: a link loop on Python 3.11
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            verdict = FileVerdict(False, f"unreadable ({exc.strerror or exc})")
            self._note_skip(ws, rel, verdict.reason)
            return verdict
        cached = ws.stat_cache.get(rel)
        if cached and cached[0] == st.st_mtime_ns and cached[1] == st.st_size:
            return cached[2]
        verdict = classify_file(full, self.s.max_file_bytes, data_policy=ws.filt.data_policy_applies(rel), root=ws.root)
        ws.stat_cache[rel] = (st.st_mtime_ns, st.st_size, verdict)
        if not verdict.ok:
            self._note_skip(ws, rel, verdict.reason)
        else:
            ws.skipped.pop(rel, None)
        return verdict

    def _note_skip(self, ws: WorkspaceState, rel: str, reason: str) -> None:
        """Remember that *rel* is not indexed and why, logging it once per reason."""
        if ws.skipped.get(rel) != reason:
            ws.skipped[rel] = reason
            self.log.info("file_skipped", workspace=ws.wid, path=rel, reason=reason)
            self.stats.incr("files.skipped")

    def _check(self, ws: WorkspaceState, rel: str, now: float) -> int:
        """Compare one file with what the table holds (or will hold, once what was sent lands)
        and send what is needed; return 1 if something was sent."""
        verdict = self._verdict(ws, rel)
        if verdict is None or not verdict.ok:
            ws.disk.pop(rel, None)
            if verdict is None:
                ws.stat_cache.pop(rel, None)
            if rel not in ws.table and rel not in ws.sent:
                return 0
            reason = verdict.reason if verdict else "deleted"
            if self._in_hand(ws, rel, "", now):
                return 0
            return self._send(FileDeleted(workspace=ws.wid, root=str(ws.root), path=rel, reason=reason), ws, rel, "", now)
        h = verdict.content_hash
        ws.disk[rel] = h
        if self._in_hand(ws, rel, h, now):
            return 0
        return self._send(FileChanged(workspace=ws.wid, root=str(ws.root), path=rel, content_hash=h), ws, rel, h, now)

    def _in_hand(self, ws: WorkspaceState, rel: str, h: str, now: float) -> bool:
        """True when the table already has hash ``h`` for ``rel`` ("" = no rows), or it was just sent."""
        sent = ws.sent.get(rel)
        if sent is not None:
            if sent[0] != h:
                return False
            return now - sent[1] < RESEND_AFTER_S or ws.table.get(rel, "") == h
        return ws.table.get(rel, "") == h

    def _send(self, body: FileChanged | FileDeleted, ws: WorkspaceState, rel: str, h: str, now: float) -> int:
        try:
            frames = envelope.encode(body, sender="watcher")
        except (UnicodeEncodeError, ValueError) as exc:  # a path no message can carry: never crash-loop on it
            self.log.warning("event_not_encodable", workspace=ws.wid, path=ascii(rel), error=str(exc))
            self.stats.incr("events.not_encodable")
            return 0
        try:
            self.push.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.stats.incr("events.dropped")  # the next reconcile sends it again
            return 0
        ws.sent[rel] = (h, now)
        self.stats.incr("events." + ("changed" if h else "deleted"))
        return 1

    # ------------------------------------------------------------------ reconcile

    def _refresh_table(self, ws: WorkspaceState) -> None:
        folder = index_dir(self.s.data_dir, ws.wid)
        try:
            listed = catalog.read(folder)
            if listed is None and any(folder.glob("*.lance")):
                # a table made before the embedder published its list, and the embedder has not
                # opened it since: read the table itself (this loads LanceDB, once)
                from daemons.lib.store import IndexStore
                store = IndexStore.open_reader(folder)
                listed = store.catalog() if store else {}
            ws.table = listed or {}
        except Exception as exc:  # noqa: BLE001 - a table being rebuilt reads as empty
            self.log.warning("catalog_failed", workspace=ws.wid, error=str(exc))
            ws.table = {}
        for rel in [r for r, (h, _) in ws.sent.items() if ws.table.get(r, "") == h]:
            del ws.sent[rel]

    def _walk(self, ws: WorkspaceState, force: bool) -> Generator[None, None, None]:
        """Reconcile *ws* with its disk, pausing (a ``yield``) whenever the loop's slice is spent.

        Walks the tree (at most ``walk_max_entries`` files and folders, ``walk_max_s`` seconds),
        then checks every file seen, newest first, and every file the table holds that the walk
        did not see. A walk stopped by its bounds indexes what it saw and deletes nothing: what
        it did not reach may well be there."""
        started, t0 = time.perf_counter(), time.monotonic()
        if not ws.root.is_dir():
            self.log.warning("workspace_gone", workspace=ws.wid, root=str(ws.root))
            ws.disk.clear()
        if force:
            ws.sent.clear()
        self._refresh_table(ws)
        walk_skips: dict[str, str] = {}
        seen: set[str] = set()
        mtimes: dict[str, int] = {}
        entries, stopped = 0, ""
        if ws.root.is_dir():
            for rel in ws.filt.iter_files(on_skip=walk_skips.__setitem__, folders=True):
                entries += 1
                if rel and not rel.endswith("/"):
                    seen.add(rel)
                    mtimes[rel] = mtime_ns(ws.root / rel)
                if entries >= self.s.walk_max_entries:
                    stopped = f"walk_max_entries ({self.s.walk_max_entries}) files and folders walked"
                elif time.monotonic() - t0 > self.s.walk_max_s:
                    stopped = f"walk_max_s ({self.s.walk_max_s:g} s) spent"
                if stopped:
                    break
                if time.perf_counter() >= self._slice_end:
                    yield
        for rel, reason in walk_skips.items():
            self._note_skip(ws, rel, reason)
        if stopped:
            self.log.warning("walk_stopped", workspace=ws.wid, reason=stopped, files_seen=len(seen),
                             note="files past this point are not indexed, and nothing is deleted for them")
        ws.walk_stopped = stopped
        order = newest_first(ws.root, seen, mtimes)
        if not stopped:
            order += sorted((set(ws.table) | set(ws.disk)) - seen)
        sent = 0
        now = time.monotonic()
        for rel in order:
            sent += self._check(ws, rel, now)
            if time.perf_counter() >= self._slice_end:
                yield
                now = time.monotonic()
        if not stopped:
            for rel in set(ws.stat_cache) - seen:
                ws.stat_cache.pop(rel, None)
            for rel in set(ws.skipped) - seen - set(walk_skips):  # gone, or indexable now
                ws.skipped.pop(rel, None)
        ws.last_reconcile = time.time()
        self.stats.incr("reconciles")
        self.log.info("reconcile", workspace=ws.wid, files=len(ws.disk), table_files=len(ws.table), sent=sent, pending=ws.pending(),
                      force=force, walk_s=round(time.monotonic() - t0, 2), ms=round((time.perf_counter() - started) * 1000, 1))

    def want_walk(self, wid: str, force: bool) -> None:
        """Start a walk of *wid*, or, when one is under way, another once it ends (a file it passed
        may have changed since)."""
        walk = self.walks.get(wid)
        if walk is not None:
            walk.again, walk.again_force = True, walk.again_force or force
            return
        self.walks[wid] = Walk(self._walk(self.workspaces[wid], force), time.monotonic())

    def run_walks(self) -> None:
        """One slice of each walk under way, in turn; a walk that ends starts again if wanted."""
        for wid in list(self.walks):
            walk = self.walks.get(wid)
            if walk is None:
                continue
            self._slice_end = time.perf_counter() + WALK_SLICE_S
            try:
                next(walk.steps)
            except StopIteration:
                del self.walks[wid]
                if walk.again:
                    self.want_walk(wid, walk.again_force)

    # ------------------------------------------------------------------ control

    def _ctl_reconcile(self, msg: envelope.Message) -> ReconcileReply:
        self.want_reconcile(msg.body.workspace, msg.body.force)
        return ReconcileReply(queued=1)

    def _ctl_add(self, msg: envelope.Message) -> WorkspaceAddReply:
        wid, root = self.registry.add(msg.body.path)
        with self.hint_lock:
            self.reconcile_wanted.setdefault("", False)
        return WorkspaceAddReply(workspace=wid, root=root)

    def status(self) -> dict[str, Any]:
        """The workspaces' counts, answered at once whatever the loop is doing: fresh when the loop
        is between steps, else the ones it refreshed at most ``STATUS_REFRESH_S`` ago. While walks
        run, ``reconciling`` names the one under way longest and for how long, and each
        workspace's ``walking_s`` says how long its own has run (a status that waited behind
        a walk of 10,000 files read as "watcher down")."""
        if not self.lock.acquire(blocking=False):
            return self._with_walks(self._last_status)
        try:
            return self._with_walks(self._refresh_status())
        finally:
            self.lock.release()

    def _with_walks(self, counts: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        walks = dict(self.walks)  # the loop thread may change it meanwhile
        oldest = min(walks.items(), key=lambda kv: kv[1].started, default=None)
        return {"workspaces": {wid: {**entry, "walking_s": round(now - walks[wid].started, 1) if wid in walks else None}
                               for wid, entry in counts["workspaces"].items()},
                "reconciling": {"workspace": oldest[0], "for_s": round(now - oldest[1].started, 1)} if oldest else None}

    def _refresh_status(self) -> dict[str, Any]:
        """The workspaces' counts, computed now (kept for the replies the loop is too busy for);
        call with the lock held."""
        self._last_status = {
            "workspaces": {
                wid: {
                    "root": str(ws.root),
                    "files": len(ws.disk),
                    "indexed_files": sum(1 for p, h in ws.disk.items() if ws.table.get(p) == h),
                    "pending": ws.pending(),
                    # written with keyword text, vectors still to come (searched by keywords only)
                    "vectors_pending": sum(1 for p, h in ws.disk.items() if ws.table.get(p) == pending_hash(h)),
                    "skipped": len(ws.skipped),
                    "last_reconcile": ws.last_reconcile,
                    # the last walk stopped at walk_max_entries or walk_max_s ("": it went through)
                    "walk_stopped": ws.walk_stopped,
                }
                for wid, ws in self.workspaces.items()
            }
        }
        self._status_at = time.monotonic()
        return self._last_status

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        runtime.prepare_runtime_dir(self.s.runtime_dir)
        runtime.install_signal_handlers(self.stop, self.log)
        control = runtime.ControlServer(
            self.ctx, self.s.control_endpoint("watcher"), "watcher", self.log, self.stats, self.stop,
            status_fn=self.status, queue_depth_fn=lambda: len(self.hints),
            extra={"reconcile_request": self._ctl_reconcile, "workspace_add_request": self._ctl_add},
        )
        control.start()
        self.observer.start()
        self.want_reconcile("")
        self.log.info("started", runtime_dir=self.s.runtime_dir, data_dir=self.s.data_dir)
        next_periodic = time.monotonic() + self.s.reconcile_interval_s
        next_table_check = 0.0
        while not self.stop.is_set():
            # while walks run, a short pause between slices, without the lock, lets the control
            # thread take the interpreter and the workspaces
            self.stop.wait(0.002 if self.walks else 0.05)
            with self.hint_lock:
                wanted, self.reconcile_wanted = self.reconcile_wanted, {}
            if self.walks:  # the periodic walk comes reconcile_interval_s after the last walk ends
                next_periodic = time.monotonic() + self.s.reconcile_interval_s
            elif time.monotonic() >= next_periodic:
                wanted.setdefault("", False)
                next_periodic = time.monotonic() + self.s.reconcile_interval_s
            with self.lock:
                if wanted:
                    registered = self.registry.load()
                    for wid in [w for w in self.workspaces if w not in registered]:
                        self._drop(wid)
                    added = self.load_workspaces()
                    targets = list(self.workspaces) if "" in wanted else [w for w in self.workspaces if w in wanted or w in added]
                    for wid in targets:
                        self.want_walk(wid, wanted.get("", False) or wanted.get(wid, False))
                if self.walks:
                    self.run_walks()
                    if time.monotonic() - self._status_at >= STATUS_REFRESH_S:
                        self._refresh_status()
            if time.monotonic() >= next_table_check:
                next_table_check = time.monotonic() + 2.0
                with self.lock:
                    self._check_roots()
                    for ws in self.workspaces.values():
                        if ws.sent:
                            self._refresh_table(ws)
            due = self._due_hints()
            if due:
                now = time.monotonic()
                with self.lock:
                    for wid, rel in due:
                        ws = self.workspaces.get(wid)
                        if ws is not None:
                            self._check(ws, rel, now)
        if self.walks:  # shutting down: a walk of 10,000 files must not hold SIGTERM up; the next start walks again
            self.log.info("reconcile_interrupted", workspaces=sorted(self.walks))
        self.observer.stop()
        control.join(timeout=2)
        self.push.close(0)
        self.log.info("stopped")

def main() -> None:
    runtime.run_daemon(Watcher)
