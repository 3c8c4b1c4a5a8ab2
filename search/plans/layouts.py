"""The layouts a search covers: each asked schedule at each asked V, with the chunk counts its rules allow.

A layout that cannot run here at all (too few segments for ranks x V stages, no chunk count its rules
allow, a training-only schedule in an inference search) is left out with its rule, for the study's
first line; none left is one line naming every rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import MULTI_SCHEDULES, SCHEDULES, SINGLE_SCHEDULES, V_SCHEDULES, schedule_rule
from search.plans.space import Layout

__all__ = ["LayoutChoice", "choose_layouts", "parse_per_rank", "parse_schedules"]


def parse_schedules(text: str | None) -> tuple[str, ...]:
    """``--schedule``: comma-separated names, or ``all``; None is GPipe."""
    if not text:
        return ("GPipe",)
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return SCHEDULES
    bad = [n for n in names if n not in SCHEDULES]
    if bad or not names:
        raise PipesplitError(f"--schedule {text!r} names {', '.join(bad) or 'nothing'}: use 'all' or some of "
                             f"{', '.join(SCHEDULES)}, comma-separated")
    return tuple(dict.fromkeys(names))


def parse_per_rank(text: str | None) -> tuple[int, ...]:
    """``--stages-per-rank``: comma-separated positive integers; None (or empty) is each schedule's default."""
    if not text:
        return ()
    try:
        values = tuple(dict.fromkeys(int(t) for t in text.split(",") if t.strip()))
    except ValueError:
        raise PipesplitError(f"--stages-per-rank {text!r} is not a list of integers: write it like 2 or 2,3") from None
    if not values or min(values) < 1:
        raise PipesplitError(f"--stages-per-rank {text!r} must list positive integers: write it like 2 or 2,3")
    return values


@dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """The layouts a search covers and why each other asked combination is not among them."""

    layouts: tuple[Layout, ...]
    skipped: tuple[str, ...]

    @property
    def chunks(self) -> tuple[int, ...]:
        """Every chunk count some layout runs (the profile measures their microbatch sizes)."""
        return tuple(sorted({c for lay in self.layouts for c in lay.chunks}))


def _values(schedule: str, per_rank: Sequence[int]) -> list[int]:
    if schedule in SINGLE_SCHEDULES:
        return [1]
    if schedule in V_SCHEDULES:
        return [2]
    return list(per_rank) or [2]


def choose_layouts(schedules: Sequence[str], per_rank: Sequence[int], *, ranks: int, chunks: Sequence[int],
                   segments: int, mode: str) -> LayoutChoice:
    """Every feasible (schedule, V) of the asked ones over ``ranks`` ranks and ``segments`` segments."""
    out: list[Layout] = []
    skipped: list[str] = []
    for schedule in schedules:
        for v in _values(schedule, per_rank):
            label = Layout(schedule=schedule, per_rank=v).label
            stages = ranks * v
            if stages > segments:
                skipped.append(f"{label}: {stages} stages need {stages} segments, the model has {segments}")
                continue
            kept = tuple(c for c in chunks if schedule_rule(schedule, stages, v, c, mode) is None)
            if not kept:
                skipped.append(f"{label}: {schedule_rule(schedule, stages, v, max(chunks, default=1), mode)}")
                continue
            out.append(Layout(schedule=schedule, per_rank=v, chunks=kept))
    if not out:
        raise PipesplitError("no asked schedule fits this search: " + "; ".join(skipped))
    if per_rank and not any(s in MULTI_SCHEDULES for s in schedules):
        skipped.append(f"--stages-per-rank {','.join(map(str, per_rank))}: GPipe and 1F1B run one stage per rank")
    return LayoutChoice(layouts=tuple(out), skipped=tuple(skipped))
