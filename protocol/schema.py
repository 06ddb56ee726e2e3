"""Every message body that crosses a socket, as msgspec Structs, and the registry of their types.

A body is a Struct; its ``msg_type`` string lives in the envelope header, not in the body.
Unknown fields are ignored (newer peers may add fields); a missing required field or a field of
the wrong type is a ``bad_message``. Large float vectors travel as raw frames, never as JSON.
"""
from __future__ import annotations

from typing import Literal

import msgspec

# --------------------------------------------------------------------------- common


class Body(msgspec.Struct, kw_only=True):
    """Base of all bodies (keyword-only fields, unknown fields ignored)."""


class ErrorReply(Body, kw_only=True):
    """Any request may be answered with this: a stable ``code`` and a human message."""

    status: Literal["error"] = "error"
    code: str
    message: str


class StatusRequest(Body, kw_only=True):
    """Ask a daemon for its health, queue depth, counters and versions (control socket)."""


class StatusReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    daemon: str
    pid: int
    version: str
    protocol: str
    uptime_s: float
    queue_depth: int = 0
    counters: dict[str, int] = {}
    details: dict[str, object] = {}


class ShutdownRequest(Body, kw_only=True):
    """Ask a daemon to finish what it holds and exit (control socket)."""


class ShutdownReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"


class PingRequest(Body, kw_only=True):
    """Readiness probe: answered as soon as a daemon's sockets are bound."""


class PingReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    daemon: str


# --------------------------------------------------------------------------- index path


class ReconcileRequest(Body, kw_only=True):
    """Ask the watcher to compare disk and table now (all workspaces when ``workspace`` is empty)."""

    workspace: str = ""
    #: Forget what was sent and not yet confirmed (a downstream daemon restarted and lost its queue).
    force: bool = False


class ReconcileReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    queued: int = 0


class WorkspaceAddRequest(Body, kw_only=True):
    """Register a workspace root with the watcher (it must be an existing directory)."""

    path: str


class WorkspaceAddReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    workspace: str
    root: str


class RebuildRequest(Body, kw_only=True):
    """Ask the embedder to drop a workspace's table and rebuild it with the current settings."""

    workspace: str


class RebuildReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    workspace: str


class WorkspaceRemoveRequest(Body, kw_only=True):
    """Ask the embedder, the single writer of index folders, to let go of a workspace that is no
    longer registered and delete its index folder."""

    workspace: str


class WorkspaceRemoveReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    workspace: str
    freed_bytes: int


class FileChanged(Body, kw_only=True):
    """Event ``file.changed``: the file at ``path`` (relative to the workspace root) may differ from the table."""

    workspace: str
    root: str
    path: str
    content_hash: str = ""
    reason: str = "changed"


class FileDeleted(Body, kw_only=True):
    """Event ``file.deleted``: the file's rows must go (deleted, renamed away, now ignored, binary)."""

    workspace: str
    root: str
    path: str
    reason: str = "deleted"


class ChunkRecord(Body, kw_only=True):
    index: int
    text: str
    context: str = ""
    start_line: int
    end_line: int
    language: str | None = None


class ChunkBatch(Body, kw_only=True):
    """Event ``chunks.batch``: the whole new chunk list of one file version."""

    workspace: str
    root: str
    path: str
    content_hash: str
    chunker_version: str
    language: str | None = None
    size_bytes: int = 0
    chunks: list[ChunkRecord]
    #: The chunker's index-shaping settings (chunk_max_chars, chunk_min_chars, chunk_context_chars);
    #: the embedder refuses a batch whose shape differs from its own (rows are never mixed). Empty: unchecked.
    chunk_shape: dict[str, int] = {}


# --------------------------------------------------------------------------- query path


class EmbedQueryRequest(Body, kw_only=True):
    """Embed one question with the query prefix; the vector comes back as one raw float32 frame."""

    text: str


class EmbedQueryReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    model_id: str
    dim: int


class VectorsFirstRequest(Body, kw_only=True):
    """Embed these files before the other files that wait for their vectors: the searcher asks it
    for a question's focus files whose rows were written keywords first."""

    workspace: str
    paths: list[str]


class VectorsFirstReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    # how many of the paths were waiting for their vectors (those go first)
    waiting: int


class SearchRequest(Body, kw_only=True):
    """Run the four searches for one question and return the fused top candidates. Every ranking
    parameter (list sizes, fusion, weights) is the searcher's setting, or this question's override."""

    workspace: str
    question: str
    focus_paths: list[str] = []
    embed_timeout_ms: int = 1500
    # the question's own ranking settings (AskSettings.overrides), over the searcher's own
    overrides: dict[str, str | int | float | bool] = {}


class Candidate(Body, kw_only=True):
    chunk_id: str
    path: str
    start_line: int
    end_line: int
    text: str
    language: str | None = None
    fused_score: float
    # 1-based rank in each fused list: vector, keyword, file_keyword, file_bm25, mentioned, focus_vector, focus_keyword
    ranks: dict[str, int] = {}
    # the fusion multiplier: role_weight, times the copy weight when quotes_question
    weight: float = 1.0
    # the file role's multiplier (roles.py): 1.0 for source, or a question that asks for the role
    role_weight: float = 1.0
    # the chunk holds the question as a one-line string literal (echoes.py)
    quotes_question: bool = False


class SearchReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    keyword_query: str
    candidates: list[Candidate]
    degraded: list[str] = []
    timings_ms: dict[str, float] = {}
    index: dict[str, object] = {}


class RerankRequest(Body, kw_only=True):
    """Score (query, passage) pairs with the cross-encoder; passages carry their path on line one."""

    query: str
    passages: list[str]
    # the most the asker will wait, in ms from the broker's receipt; None: reranker_timeout_ms.
    # Work the broker's queue could not finish by then is refused at once with `timeout`.
    deadline_ms: int | None = None


class RerankReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    scores: list[float]
    model_id: str = ""
    workers: int = 0
    timings_ms: dict[str, float] = {}
    # how many of the scores came from the broker's pair cache (not scored again)
    cached: int = 0


class AskSettings(Body, kw_only=True):
    threshold: float | None = None
    snippet_count: int | None = None
    budget_chars: int | None = None
    rerank: bool = True
    # this question's time budget in ms (0: none); None: the front's question_deadline_ms
    deadline_ms: int | None = None
    # this question's own ranking settings (config.QUESTION_SETTINGS), over the daemons' own
    overrides: dict[str, str | int | float | bool] = {}


class AskRequest(Body, kw_only=True):
    """An editor's question with its workspace, conversation and focus information."""

    question: str
    workspace: str = ""
    conversation_id: str = ""
    active_file: str | None = None
    visible_files: list[str] = []
    open_documents: list[str] = []
    buffers: dict[str, str] = {}
    settings: AskSettings = msgspec.field(default_factory=AskSettings)
    include_team: bool = True


class Block(Body, kw_only=True):
    label: str
    path: str
    start_line: int
    end_line: int
    text: str
    probability: float | None = None
    retrievers: list[str] = []
    team: str | None = None
    kind: str = "code"
    # how the file differs from what the index holds: "" (it does not), "changed on disk since
    # indexed", "unsaved changes in the editor" or "deleted since indexed"
    changed: str = ""


class NearMiss(Body, kw_only=True):
    label: str
    path: str
    start_line: int
    end_line: int
    probability: float


class Stage(Body, kw_only=True):
    name: str
    ms: float
    detail: dict[str, object] = {}


class AskReply(Body, kw_only=True):
    status: Literal["ok"] = "ok"
    searched_query: str
    keyword_query: str
    blocks: list[Block]
    near_misses: list[NearMiss] = []
    prompt: str
    context_line: str
    degraded: list[str] = []
    stages: list[Stage] = []
    index: dict[str, object] = {}


# --------------------------------------------------------------------------- registry

MESSAGE_TYPES: dict[str, type[Body]] = {
    "error_reply": ErrorReply,
    "status_request": StatusRequest,
    "status_reply": StatusReply,
    "shutdown_request": ShutdownRequest,
    "shutdown_reply": ShutdownReply,
    "ping_request": PingRequest,
    "ping_reply": PingReply,
    "reconcile_request": ReconcileRequest,
    "reconcile_reply": ReconcileReply,
    "workspace_add_request": WorkspaceAddRequest,
    "workspace_add_reply": WorkspaceAddReply,
    "rebuild_request": RebuildRequest,
    "rebuild_reply": RebuildReply,
    "workspace_remove_request": WorkspaceRemoveRequest,
    "workspace_remove_reply": WorkspaceRemoveReply,
    "file.changed": FileChanged,
    "file.deleted": FileDeleted,
    "chunks.batch": ChunkBatch,
    "embed_query_request": EmbedQueryRequest,
    "embed_query_reply": EmbedQueryReply,
    "vectors_first_request": VectorsFirstRequest,
    "vectors_first_reply": VectorsFirstReply,
    "search_request": SearchRequest,
    "search_reply": SearchReply,
    "rerank_request": RerankRequest,
    "rerank_reply": RerankReply,
    "ask_request": AskRequest,
    "ask_reply": AskReply,
}

TYPE_NAMES: dict[type[Body], str] = {cls: name for name, cls in MESSAGE_TYPES.items()}


def reply_type(request_type: str) -> str:
    """``search_request`` -> ``search_reply``."""
    return request_type.removesuffix("_request") + "_reply"
