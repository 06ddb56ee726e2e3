"""The chunker: reads each changed file, chunks it along syntax, and pushes the chunks to the embedder.

Input (PULL ``chunker.in``): ``file.changed`` / ``file.deleted`` from the watcher. Output (PUSH to
``embedder.in``): one ``chunks.batch`` per file version, carrying the hash of the bytes it read
(not the hash the watcher saw: the file may have moved on since), or the ``file.deleted``.
A file that turned unreadable, binary or non-UTF-8 since the watcher looked is forwarded as
deleted with the reason. On start it asks the watcher to reconcile, so nothing queued in a
killed chunker is lost.
"""
from __future__ import annotations

import time
from pathlib import Path

import zmq

from daemons.lib import runtime
from daemons.lib.chunking import CHUNKER_VERSION, file_chunks, language_for_path
from daemons.lib.config import Settings
from daemons.lib.filtering import content_hash, read_file
from daemons.lib.indexing import chunk_shape
from daemons.lib.workspaces import Registry, check_event, safe_relpath
from protocol import envelope
from protocol.errors import ProtocolError
from protocol.schema import ChunkBatch, ChunkRecord, FileChanged, FileDeleted


class Chunker(runtime.Service):
    name = "chunker"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.registry = Registry(settings.data_dir)
        self.chunk_settings = settings.chunk_settings()
        self.pull = runtime.make_socket(self.ctx, zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, 100_000)
        self.push = runtime.make_socket(self.ctx, zmq.PUSH)
        self.push.setsockopt(zmq.SNDHWM, 10_000)

    def handle(self, frames: list[bytes]) -> None:
        started = time.perf_counter()
        try:
            msg = envelope.decode(frames)
        except ProtocolError as exc:
            self.stats.incr("messages.bad")
            self.log.warning("bad_message", error=exc.message)
            return
        body = msg.body
        if not isinstance(body, (FileChanged, FileDeleted)):
            self.stats.incr("messages.unexpected")
            self.stats.incr("messages.bad")
            self.log.warning("unexpected_message", msg_type=msg.msg_type)
            return
        try:
            check_event(self.registry, body.workspace, body.root, body.path)
            if isinstance(body, FileDeleted):
                self._forward(body, msg)
                return
            rel = safe_relpath(body.root, body.path)
        except ProtocolError as exc:
            self.stats.incr("messages.bad")
            self.log.warning("bad_path", path=body.path, error=exc.message)
            return
        full = Path(body.root) / rel
        # One read: the bytes that were judged are the bytes chunked and hashed. The data-file
        # policy is the watcher's (it knows the include globs); it sent this file, so it passed.
        verdict, data = read_file(full, self.s.max_file_bytes, data_policy=False, root=Path(body.root))
        if data is None:
            self._forward(FileDeleted(workspace=body.workspace, root=body.root, path=rel, reason=verdict.reason or "unreadable"), msg)
            return
        text = data.decode("utf-8")
        t0 = time.perf_counter()

        def failed() -> None:
            self.log.exception("chunking_failed", path=rel)
            self.stats.incr("chunking.failed")

        def plain(reason: str) -> None:
            self.log.warning("chunked_as_plain_text", workspace=body.workspace, path=rel, reason=reason)
            self.stats.incr("chunking.plain_text")

        chunks = file_chunks(text, rel, self.chunk_settings, failed, plain)
        chunk_ms = (time.perf_counter() - t0) * 1000
        batch = ChunkBatch(
            workspace=body.workspace, root=body.root, path=rel, content_hash=content_hash(data),
            chunker_version=CHUNKER_VERSION, language=language_for_path(rel), size_bytes=len(data),
            chunk_shape=chunk_shape(self.s),
            chunks=[ChunkRecord(index=c.index, text=c.text, context=c.context, start_line=c.start_line, end_line=c.end_line, language=c.language) for c in chunks],
        )
        self._send(batch, msg)
        self.stats.incr("files.chunked")
        self.stats.incr("chunks", len(chunks))
        self.log.info("chunked", workspace=body.workspace, path=rel, chunks=len(chunks), bytes=len(data), chunk_ms=round(chunk_ms, 2), ms=round((time.perf_counter() - started) * 1000, 2))

    def _forward(self, body: FileDeleted, msg: envelope.Message) -> None:
        self._send(body, msg)
        self.stats.incr("files.deleted")
        self.log.info("deleted", workspace=body.workspace, path=body.path, reason=body.reason)

    def _send(self, body, msg: envelope.Message) -> None:
        frames = envelope.encode(body, parent=msg.header, sender="chunker")
        while not self.stop.is_set():
            try:
                self.push.send_multipart(frames, flags=zmq.NOBLOCK)
                return
            except zmq.Again:  # the embedder is behind or down: wait, do not drop
                self.stop.wait(0.1)

    def run(self) -> None:
        runtime.prepare_runtime_dir(self.s.runtime_dir)
        runtime.install_signal_handlers(self.stop, self.log)
        runtime.bind(self.pull, self.s.endpoint("chunker.in"))
        self.push.connect(self.s.endpoint("embedder.in"))
        control = runtime.ControlServer(self.ctx, self.s.control_endpoint("chunker"), "chunker", self.log, self.stats, self.stop)
        control.start()
        runtime.lower_priority(self.s.index_nice, self.log)  # after the control thread: status stays quick
        runtime.ask_watcher_to_reconcile(self.s, self.log, self.stop, "chunker")
        self.log.info("started")
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        while not self.stop.is_set():
            if poller.poll(200):
                self.handle(self.pull.recv_multipart())
        control.join(timeout=2)
        self.pull.close(0)
        self.push.close(0)
        self.log.info("stopped")


def main() -> None:
    runtime.run_daemon(Chunker)
