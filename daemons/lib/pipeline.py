"""The stages of answering a question after the searches, with no sockets (issue 21).

The front runs them in order, between the searcher's and the reranker's replies (sockets, kept in
the front with their fallbacks) and the reply; the benchmarks and the tests call the same
functions, so the order a benchmark measures is the order the front gives.

Contract
--------
* ``order(candidates, probs, s, threshold)``: the threshold and the final order. Without
  probabilities (reranking off or failed) every candidate is kept at its fused score, in fused
  order. With them, the candidates at or above *threshold* are kept, and the best chunk of each
  file the question names whatever its probability; the ``s.near_misses`` best of the rest are
  near misses; each kept candidate gets its final-order key, ``fusion.rerank_order`` of the fused
  order and the probabilities times the role weights (``s.rerank_fusion_k``,
  ``s.rerank_fusion_weight``; for a long question, ``s.rerank_fusion_k_long`` and
  ``s.rerank_fusion_weight_long``: ``blend``).
* ``blend(s, long)``: the final order's rank constant and cross-encoder weight for a short or a
  long question (``question.Analysis.is_long``: an issue text, a traceback, an error line).
* ``final_files(paths, weighted, k, weight)``: the files of chunks given in fused order, in final
  order (what ``order`` gives the front, as a file ranking for the benchmarks).
* ``widen_hits(ordered, text_of, language_of, max_chars)``: each kept candidate as a ``Hit`` over
  its syntax unit (``widening.widen``) in the file's current text (``text_of(path)``, None when
  it cannot be read: the indexed chunk is used as it is).
* ``assemble(hits, team_hits, texts, languages, s, snippets, budget_chars)``: merged blocks, the
  imports of their files, the team's blocks, cut to the snippet count and the character budget.
* ``notes(...)``: the context line's notes other than the kept blocks, near misses and degraded
  modes, in the order they are printed.
"""
from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from daemons.lib import assembly
from daemons.lib import notes as notes_
from daemons.lib.assembly import Block, Hit
from daemons.lib.fusion import MENTIONED, rerank_order
from daemons.lib.metrics import files_in_order
from daemons.lib.widening import lines_text, split_lines, widen
from protocol.schema import Candidate

__all__ = ["Ordered", "assemble", "blend", "final_files", "named_positions", "notes", "order", "select_by_threshold", "widen_hits"]

T = TypeVar("T")

#: The final order's blend for a long question (rank constant, cross-encoder weight), chosen on the
#: long validation questions with cross-encoder version 4 (issue 19; README "Long questions and the
#: blend"): 0 and 1 over the short questions' 60 and 0.5, repository-mean MRR 72.2 against 69.8 on
#: the 180 traceback questions and 86.2 against 85.6 on the 115 long ones.
RERANK_FUSION_K_LONG = 0
RERANK_FUSION_WEIGHT_LONG = 1.0


@dataclass
class Ordered:
    """The threshold's outcome: kept ``(candidate, score)`` pairs (a probability, or the fused
    score without one), near misses, and each kept candidate's final-order key by ``id``."""

    kept: list[tuple[Candidate, float]]
    near: list[tuple[Candidate, float]] = field(default_factory=list)
    keys: dict[int, float] = field(default_factory=dict)
    reranked: bool = False


def blend(s: Any, long: bool) -> tuple[int, float]:
    """The final order's ``(rank constant, cross-encoder weight)`` under settings *s* for a long
    question (*long*) or a short one."""
    return (s.rerank_fusion_k_long, s.rerank_fusion_weight_long) if long else (s.rerank_fusion_k, s.rerank_fusion_weight)


def order(candidates: Sequence[Candidate], probs: Sequence[float] | None, s: Any, threshold: float, long: bool = False) -> Ordered:
    """The threshold and the final order of *candidates* (fused order) under settings *s*, with the
    blend of a long question when *long*."""
    if probs is None:
        return Ordered(kept=[(c, c.fused_score) for c in candidates])
    named = named_positions([(c.path, c.ranks, p) for c, p in zip(candidates, probs)])
    kept, near = select_by_threshold(list(zip(candidates, probs)), threshold, s.near_misses, always=named)
    # keyed by position among all candidates, so a dropped one still holds its rank
    keys = rerank_order([c.path for c in candidates], [p * c.weight for c, p in zip(candidates, probs)], *blend(s, long))
    return Ordered(kept=kept, near=near, keys={id(c): key for c, key in zip(candidates, keys)}, reranked=True)


def final_files(paths: Sequence[str], weighted: Sequence[float], k: int, weight: float) -> list[str]:
    """The final file order of chunks given in fused order (*paths*, one per chunk) with their
    probabilities times role weight, as ``order`` ranks them (no threshold cut)."""
    keys = rerank_order(paths, weighted, k, weight)
    return files_in_order([paths[i] for i in sorted(range(len(paths)), key=lambda i: (-keys[i], i))])


def widen_hits(ordered: Ordered, text_of: Callable[[str], str | None], language_of: Callable[[str], str | None],
               max_chars: int) -> list[Hit]:
    """The kept candidates as hits over their whole syntax units (see the module's contract)."""
    hits: list[Hit] = []
    for cand, score in ordered.kept:
        text = text_of(cand.path)
        language = language_of(cand.path)
        start, end, body = cand.start_line, cand.end_line, cand.text
        if text is not None:
            start, end = widen(text, language, start, end, max_chars)
            body = lines_text(split_lines(text), start, end)
        # a fused score already carries the role weight; a probability gets it for the order only
        hits.append(Hit(path=cand.path, start_line=start, end_line=end, text=body, score=score, retrievers=sorted(cand.ranks),
                        language=language, weight=cand.weight if ordered.reranked else 1.0, order=ordered.keys.get(id(cand))))
    return hits


def assemble(hits: list[Hit], team_hits: list[Hit], texts: Mapping[str, str], languages: Mapping[str, str | None], s: Any,
             snippets: int, budget_chars: int) -> list[Block]:
    """Merged blocks with their files' imports and the team's blocks, cut to *snippets* and *budget_chars*."""
    blocks = assembly.merge_hits(hits, dict(texts), s.block_max_chars)
    blocks = assembly.add_imports(blocks, dict(texts), dict(languages), s.imports_max_chars, s.block_max_chars)
    blocks += assembly.merge_hits(team_hits, {}, s.block_max_chars)
    return assembly.budget(blocks, snippets, budget_chars)


def notes(candidates: Sequence[Candidate], s: Any, *, focus: Sequence[str], changes: Iterable[str],
          roles_missing: Sequence[str], follow_up: bool, previous_files: Sequence[str], answered_files: Sequence[str]) -> list[str]:
    """The context line's notes: role weights, question copies, named files, focus files, changed
    files (*changes*: each code block's ``notes.file_change``), kinds of file missing from the
    index, and a follow-up that found nothing new; empty ones are left for the line to skip."""
    weighted = notes_.weights_note((c.path, c.role_weight) for c in candidates)
    return [
        f"weighted {weighted}" if weighted else "",
        notes_.copies_note(sum(c.quotes_question for c in candidates), s.question_copy_weight),
        notes_.named_note((c.path, c.ranks) for c in candidates),
        notes_.focus_note(focus, ((c.path, c.ranks) for c in candidates)),
        notes_.changed_note(changes),
        notes_.missing_roles_note(roles_missing),
        notes_.nothing_new_note(follow_up, previous_files, answered_files),
    ]


def select_by_threshold(
    scored: Iterable[tuple[T, float]],
    threshold: float = assembly.RERANK_THRESHOLD,
    near_miss_count: int = assembly.NEAR_MISS_COUNT,
    always: Container[int] = (),
) -> tuple[list[tuple[T, float]], list[tuple[T, float]]]:
    """Split ``(item, probability)`` pairs into ``(kept, near_misses)``.

    Kept: probability >= *threshold*, and the pairs at the positions in *always* whatever their
    probability (:func:`named_positions`); near misses: the *near_miss_count* best of the rest.
    Both sorted by probability descending (stable for ties).
    """
    ordered = sorted(enumerate(scored), key=lambda p: -p[1][1])
    kept = [p for i, p in ordered if p[1] >= threshold or i in always]
    dropped = [p for i, p in ordered if not (p[1] >= threshold or i in always)]
    return kept, dropped[: max(0, near_miss_count)]


def named_positions(candidates: Sequence[tuple[str, Mapping[str, int], float]]) -> set[int]:
    """Positions of the most probable candidate of each file the question names.

    ``candidates`` are ``(path, ranks, probability)``; a file is named when one of its candidates
    entered through the ``mentioned`` list. The user pointed at the file, so its best chunk is
    kept even below the threshold (the context line's ``named`` note says why it is there).
    """
    best: dict[str, int] = {}
    named = {path for path, ranks, _ in candidates if MENTIONED in ranks}
    for i, (path, _, prob) in enumerate(candidates):
        if path in named and (path not in best or prob > candidates[best[path]][2]):
            best[path] = i
    return set(best.values())
