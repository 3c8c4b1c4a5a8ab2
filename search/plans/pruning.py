"""The cost model's pruning rule, pure: is a proposed plan clearly behind the best one measured?

Once ``PRUNE_AFTER`` plans are measured, a new plan's predicted speedup is corrected by the most
optimistic measured/predicted ratio seen so far; if even that falls below ``PRUNE_MARGIN`` of the best
measured speedup (inside the ~5 % noise of one trial, so a plan that could tie is still run), the plan
is pruned without a run. Enqueued seeds always run (the caller does not ask), and after
``PRUNE_STREAK`` prunes in a row the next proposal runs, so that a model far off the measurements
cannot starve the search. Nor is a plan pruned when the budget left would measure every plan not yet
tried (``budget_covers_rest``): pruning saves runs, and there a run costs nothing another plan needed; a
pruned plan is never proposed again, so this is the only chance such a plan gets.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PRUNE_AFTER", "PRUNE_MARGIN", "PRUNE_STREAK", "budget_covers_rest", "prune_reason"]

PRUNE_AFTER = 3
PRUNE_STREAK = 3
PRUNE_MARGIN = 0.97


def prune_reason(predicted: float, done: Sequence[tuple[float, float]], *, after: int = PRUNE_AFTER,
                 margin: float = PRUNE_MARGIN, unit: str = "x") -> str | None:
    """Why a plan predicted at ``predicted`` need not run, given ``done`` (measured, predicted) figures (speedup,
    or throughput with ``unit`` "/s") of the plans measured so far; None when it should run."""
    usable = [(m, p) for m, p in done if p > 0]
    if len(usable) < after:
        return None
    ratio = max(m / p for m, p in usable)
    best = max(m for m, _ in usable)
    optimistic = predicted * ratio
    if optimistic < margin * best:
        spec = ".2f" if unit == "x" else ".3g"
        return f"cost model: at best {optimistic:{spec}}{unit} vs measured best {best:{spec}}{unit}"
    return None


def budget_covers_rest(budget_left: int, untried: int) -> bool:
    """Whether ``budget_left`` measured trials (this one included) would run this plan and all ``untried``
    plans the study holds no trial of: then pruning this one saves nothing."""
    return budget_left >= untried + 1
