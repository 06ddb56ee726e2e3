"""The broker's bookkeeping: the workers it knows, a request and the parts it is split into, and
how a request is cut across idle workers (``split_by_chars``). No sockets."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from protocol.envelope import Header

__all__ = ["Part", "Request", "WorkerState", "split_by_chars"]


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

    @property
    def msg_id(self) -> str:
        return self.header.msg_id

    def part_passages(self, part: "Part") -> list[str]:
        return [self.passages[i] for i in self.todo[part.start : part.end]]

    def part_chars(self, part: "Part") -> int:
        return sum(map(len, self.part_passages(part)))

    def todo_chars(self) -> int:
        return sum(len(self.passages[i]) for i in self.todo)
