"""A question's time budget, and how long queued cross-encoder work will take.

An editor or agent asks several questions at once and wants each answered in interactive time.
Every question gets a budget (``question_deadline_ms``, or the request's own ``deadline_ms``),
counted from when the front received it. A stage that cannot finish in what is left is skipped
and named: the cross-encoder is asked only with the time that remains, and the reranker broker,
which knows its queue, refuses at once work it would finish too late, so the front answers in
the fused order instead of waiting. No sockets here.
"""
from __future__ import annotations

import time

#: Milliseconds kept back for widening, assembly and the reply after the last remote stage.
RESERVE_MS = 150
#: A rerank is not asked for with less time than this left (it could not come back in time).
MIN_RERANK_MS = 100
#: The share of what is left that the question's embedding may use: the rest is the rerank's.
EMBED_SHARE = 0.5
#: The smallest embedding deadline worth asking for.
MIN_EMBED_MS = 50
#: Before the first worker has loaded, its start is assumed to take this long.
DEFAULT_STARTUP_MS = 1500.0

#: How the broker's refusal of work it could not finish in time begins (the front names it so).
BUSY_PREFIX = "reranker busy"

SKIPPED_RERANK = "fused order (question deadline: no time left to rerank)"
REFUSED_RERANK = "fused order (question deadline: reranker busy)"
LATE_RERANK = "fused order (question deadline: rerank not back in time)"
SKIPPED_WIDEN = "blocks not widened (question deadline)"


class Budget:
    """The time one question may take: ``total_ms`` from ``started`` (``time.monotonic()``); a
    ``total_ms`` of 0 means no deadline, and every ``left_ms`` is then None."""

    def __init__(self, total_ms: int, started: float | None = None) -> None:
        if total_ms < 0:
            raise ValueError(f"a deadline is at least 0 ms, not {total_ms}")
        self.total_ms = int(total_ms)
        self.started = time.monotonic() if started is None else started

    @property
    def limited(self) -> bool:
        return self.total_ms > 0

    def left_ms(self, reserve_ms: float = 0.0) -> float | None:
        """Milliseconds left after keeping *reserve_ms* back (may be negative); None without a deadline."""
        if not self.limited:
            return None
        return self.total_ms - (time.monotonic() - self.started) * 1000 - reserve_ms

    def spent(self) -> bool:
        left = self.left_ms()
        return left is not None and left <= 0

    def embed_timeout_ms(self, configured_ms: int) -> int:
        """The question embedding's deadline: the configured one, cut to its share of what is left."""
        left = self.left_ms(RESERVE_MS)
        if left is None:
            return configured_ms
        return int(max(MIN_EMBED_MS, min(configured_ms, left * EMBED_SHARE)))

    def rerank_ms(self) -> int | None:
        """What the cross-encoder may take, after the reserve; None without a deadline, 0 when
        too little is left to ask at all."""
        left = self.left_ms(RESERVE_MS)
        if left is None:
            return None
        return int(left) if left >= MIN_RERANK_MS else 0


class ScoringRate:
    """Milliseconds of scoring per passage character, an exponentially weighted mean of what the
    workers report, and the wait it predicts for queued work."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.ms_per_char: float | None = None
        self.startup_ms = DEFAULT_STARTUP_MS

    def observe(self, ms: float, chars: int) -> None:
        if chars <= 0 or ms <= 0:
            return
        rate = ms / chars
        self.ms_per_char = rate if self.ms_per_char is None else (1 - self.alpha) * self.ms_per_char + self.alpha * rate

    def observe_startup(self, ms: float) -> None:
        if ms > 0:
            self.startup_ms = float(ms)

    def finish_ms(self, backlog_chars: int, chars: int, workers: int, ready: bool) -> float | None:
        """When work of *chars* characters queued behind *backlog_chars* would be done, spread over
        *workers*; a pool with no ready worker first waits for one to start. None until a
        rate has been observed (nothing is refused on a guess)."""
        if self.ms_per_char is None:
            return None
        ms = (backlog_chars + chars) * self.ms_per_char / max(1, workers)
        return ms if ready else ms + self.startup_ms
