"""From a file's chunks to table rows: windows, keyword text, embeddings, identity.

Shared by the embedder daemon and the benchmarks, so a benchmark measures the real path.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from daemons.lib.chunking import CHUNKER_VERSION
from daemons.lib.config import CHUNK_SHAPE, Settings
from daemons.lib.keywords import keyword_text
from daemons.lib.windows import embed_text, window_texts

if TYPE_CHECKING:  # the chunker imports this module and needs neither LanceDB nor the vector cache
    from daemons.lib.vectorcache import VectorCache

#: A file's rows written before their vectors carry this in front of its content hash
#: (``keyword_rows``): keyword search finds them, vector search skips them (their vectors are
#: stand-ins), and the watcher counts the file as not yet fully indexed, so it is sent again after
#: a restart.
PENDING_PREFIX = "pending:"


class ChunkLike(Protocol):
    index: int
    text: str
    context: str
    start_line: int
    end_line: int
    language: str | None


class DocumentEmbedder(Protocol):
    model_id: str
    dim: int

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...


def chunk_shape(settings: Settings) -> dict[str, int]:
    """The settings that shaped a batch's chunks (checked by the embedder against its own)."""
    return {k: int(getattr(settings, k)) for k in CHUNK_SHAPE}


def index_meta(settings: Settings, embedder: DocumentEmbedder, root: str) -> dict[str, Any]:
    """What the table records about how its rows were made (compared on every open)."""
    return {
        "model_id": embedder.model_id,
        "dim": int(embedder.dim),
        "chunker_version": CHUNKER_VERSION,
        "root": root,
        **settings.index_shape(),
    }


def chunk_id(path: str, content_hash: str, index: int) -> str:
    return f"{path}|{content_hash}|{index}"


def pending_hash(content_hash: str) -> str:
    return PENDING_PREFIX + content_hash


def is_pending(content_hash: str | None) -> bool:
    return bool(content_hash) and content_hash.startswith(PENDING_PREFIX)


def keyword_rows(path: str, content_hash: str, chunks: Sequence[ChunkLike], settings: Settings, dim: int) -> list[dict[str, Any]]:
    """A file's rows with their keyword text and a stand-in vector, marked pending
    (:data:`PENDING_PREFIX`), for keyword search while the real vectors wait; the chunk ids are the
    final rows' ids. The stand-in is a unit vector, not zeros: a cosine index built or folded over
    such rows never meets a zero norm (vector search skips them by their mark anyway)."""
    rows, _ = plan_rows(path, content_hash, chunks, settings)
    stand_in = np.zeros(dim, dtype=np.float32)
    stand_in[0] = 1.0
    for row in rows:
        row["content_hash"] = pending_hash(content_hash)
        row["vector"] = stand_in
    return rows


def chunk_content_hash(cid: str) -> str:
    """The file content hash a :func:`chunk_id` was made with (a path may itself hold ``|``)."""
    parts = cid.rsplit("|", 2)
    return parts[1] if len(parts) == 3 else ""


def plan_rows(path: str, content_hash: str, chunks: Sequence[ChunkLike], settings: Settings) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows without vectors, and the texts to embed for them (one per row, same order)."""
    rows: list[dict[str, Any]] = []
    texts: list[str] = []
    for c in chunks:
        full = (c.context or "") + c.text
        cid = chunk_id(path, content_hash, c.index)
        for w, window in enumerate(window_texts(full, settings.window_chars, settings.window_overlap)):
            rows.append(
                {
                    "id": f"{cid}|{w}",
                    "chunk_id": cid,
                    "path": path,
                    "content_hash": content_hash,
                    "chunk_index": c.index,
                    "window": w,
                    "start_line": c.start_line,
                    "end_line": c.end_line,
                    "language": c.language,
                    "text": c.text,
                    # Only window 0 carries keywords, so a chunk is at most one keyword hit.
                    "keywords": keyword_text(full, path) if w == 0 else "",
                }
            )
            texts.append(embed_text(window, path))
    return rows, texts


def embed_rows(rows: list[dict[str, Any]], texts: list[str], embedder: DocumentEmbedder, cache: VectorCache | None = None) -> int:
    """Give each row the vector of its text; with *cache*, windows embedded before are not
    embedded again. Returns how many vectors came from the cache."""
    if not rows:
        return 0
    if cache is None:
        vectors, cached = embedder.embed_documents(texts), 0
    else:
        vectors, cached = cache.embed(texts, embedder.embed_documents)
    for row, vec in zip(rows, vectors):
        row["vector"] = vec.astype(np.float32)
    return cached
