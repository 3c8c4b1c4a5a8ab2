"""Which recomputation a training plan of the search runs with (``--recompute search``).

Recomputing a block only costs time (its forward runs again in the backward), so under a memory limit
the best counts for given cuts are the fewest that fit: each rank's own stages decide whether it fits
(``pipeline.core.recompute.least_counts``, exact), which makes the joint optimum over cuts x counts the
optimum over cuts, each with its least counts. Without a limit no plan recomputes.

A framework's reference runs as its user would run it: without recomputation where its plan fits, with
the framework's own uniform setting where only that fits (torchtitan and DeepSpeed: every block; Megatron:
the least ``--recompute-num-layers N`` for every stage), and otherwise as it is, to be pruned with its
prediction ("even N = all does not fit").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from pipeline.core.plan import SplitPlan
from pipeline.core.recompute import normal
from pipeline.peers.registry import DEFAULT_RULES

__all__ = ["choose_recompute", "framework_of", "uniform_counts"]

Least = Callable[[SplitPlan, Sequence[int]], "tuple[int, ...] | None"]


def framework_of(source: str | None) -> str | None:
    """The framework's default rule that chose a seeded plan (``torchtitan``, ``megatron``, ...), if any."""
    names = (source or "").split("+")
    return next((n for n in names if n in DEFAULT_RULES), None)


def uniform_counts(blocks: Sequence[int], n: int) -> tuple[int, ...]:
    """Megatron's ``--recompute-num-layers n`` on every stage: the first ``n`` blocks, or all a stage has."""
    return tuple(min(n, b) for b in blocks)


def choose_recompute(plan: SplitPlan, cands: object, framework: str | None, least: Least | None,
                     runtime: Sequence[int], fits: Callable[[SplitPlan], bool]) -> SplitPlan:
    """``plan`` with the recomputation it runs with in a search (``plan`` as given where nothing is to fit)."""
    if least is None or fits(plan):
        return plan
    if framework is None:
        counts = least(plan, runtime)
        blocks = [len(b) for b in cands.stage_blocks(plan)]  # type: ignore[attr-defined]
        return replace(plan, recompute="full" if counts is None else normal(counts, blocks))
    if not framework.startswith("megatron"):
        return replace(plan, recompute="full")
    blocks = [len(b) for b in cands.stage_blocks(plan)]  # type: ignore[attr-defined]
    for n in range(1, max(blocks, default=0) + 1):
        trial = replace(plan, recompute=uniform_counts(blocks, n))
        if fits(trial):
            return trial
    return replace(plan, recompute=uniform_counts(blocks, max(blocks, default=0)))
