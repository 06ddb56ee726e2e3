"""The broker's bookkeeping: the workers it knows, a request and the parts it is split into, and
how a request is cut across idle workers (``split_by_chars``). No sockets."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from protocol.envelope import Header

__all__ = ["PART_MAX_PASSAGES", "Part", "Request", "WorkerState", "part_count", "split_by_chars"]

#: Passages in one part at most. A request longer than this (a question's overrides, a direct
#: rerank_request) is cut into more parts than there are workers, and parts are handed out one
#: request at a time in turn (``Request.turns``), so a question behind it waits for one part,
#: not for all of it. The shipped rerank_top and rerank_top_long (12, 16) fit one part per worker.
PART_MAX_PASSAGES = 16


def part_count(passages: int, idle_workers: int) -> int:
    """How many parts a request of *passages* to score is cut into with *idle_workers* free:
    one per idle worker, and more when a part would hold over ``PART_MAX_PASSAGES``."""
    return max(1, min(passages, max(idle_workers, -(-passages // PART_MAX_PASSAGES))))


def split_by_chars(passages: list[str], k: int) -> list[tuple[int, int]]:
    """Cut ``passages`` into ``k`` contiguous non-empty slices of roughly equal total characters."""
    n = len(passages)
    k = max(1, min(k, n))
    if k == 1:
        return [(0, n)]
    sizes = [max(1, len(p)) for p in passages]
    total = sum(sizes)
    cuts = [0]
    acc = 0
    j = 0
    for i in range(1, k):
        target = total * i / k
        # advance j while adding the next passage brings the prefix closer to the target
        lo = cuts[-1] + 1
        hi = n - (k - i)
        j = max(j, lo)
        acc = sum(sizes[:j])
        while j < hi and abs(acc + sizes[j] - target) <= abs(acc - target):
            acc += sizes[j]
            j += 1
        cuts.append(j)
    cuts.append(n)
    return [(cuts[i], cuts[i + 1]) for i in range(k)]


@dataclass
class WorkerState:
    ident: bytes
    seq: int
    proc: subprocess.Popen
    started: float
    ready: bool = False
    pid: int = 0
    model_id: str = ""
    expiry: float = 0.0
    job: "Part | None" = None
    parts_done: int = 0


@dataclass
class Part:
    req: "Request"
    index: int
    start: int
    end: int
    attempt: int = 0
    worker: bytes | None = None
    done: bool = False

    @property
    def job_id(self) -> bytes:
        return f"{self.req.msg_id}:{self.index}:{self.attempt}".encode()


@dataclass
class Request:
    routing: list[bytes]
    header: Header
    query: str
    passages: list[str]
    arrived: float
    deadline: float
    parts: list[Part] = field(default_factory=list)
    scores: list[float | None] = field(default_factory=list)
    workers_used: set[bytes] = field(default_factory=set)
    first_dispatch: float | None = None
    score_ms: float = 0.0
    model_id: str = ""
    cold: bool = False
    #: positions in ``passages`` still to be scored (the rest came from the cache); parts slice this
    todo: list[int] = field(default_factory=list)
    cached: int = 0
    #: parts handed to a worker so far: the next part goes to the request with the fewest
    turns: int = 0

    @property
    def msg_id(self) -> str:
        return self.header.msg_id

    def part_passages(self, part: "Part") -> list[str]:
        return [self.passages[i] for i in self.todo[part.start : part.end]]

    def part_chars(self, part: "Part") -> int:
        return sum(map(len, self.part_passages(part)))

    def todo_chars(self) -> int:
        return sum(len(self.passages[i]) for i in self.todo)
