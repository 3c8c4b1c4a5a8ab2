"""The memory limit of a search (``--device-memory``, also spelt ``--max-stage-memory``), pure: one notion,
the most a rank may hold, checked before a plan runs and after.

Before a run, each rank's peak is predicted from the model on meta (``pipeline.core.budget``: weights,
gradients and optimizer state, activations in flight for the schedule) plus the runtime's own memory (the
interpreter, torch's libraries, the process group): the least that measured trials' ranks peaked above
their prediction, or, before any, the driver's resident memory. A plan with a rank over the limit is not
run: pruned with its prediction in the reason, nothing built.

A measured trial whose largest stage peaked over the limit is infeasible: it is kept (pruned, with its
figures and the reason), never declared best, and Optuna's constraint for it is that stage's peak less
the limit in MiB (positive: over), which optuna-dashboard shows as infeasible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from optuna.trial import FrozenTrial

from costmodel.footprint import rank_runtime_bytes
from pipeline.core import budget
from pipeline.core.budget import format_size

__all__ = ["OVER_MEMORY", "constraint", "format_size", "learned_runtime", "over_limit", "parse_size", "predicted_over",
           "with_runtime"]

OVER_MEMORY = "over_memory"
"""User attribute of a measured trial over the limit: the reason, with the figures."""

def parse_size(text: str) -> int:
    """``4GiB``, ``512MiB``, ``1.5GB`` or a byte count: bytes; one line naming the value otherwise."""
    return budget.parse_size(text, "--device-memory")


def over_limit(peaks: Sequence[int], limit: int) -> str | None:
    """Why a trial whose ranks peaked at ``peaks`` breaks ``limit``, or None when every stage fits."""
    if not peaks or max(peaks) <= limit:
        return None
    worst = max(range(len(peaks)), key=lambda r: peaks[r])
    return (f"stage {worst} peaked at {format_size(peaks[worst])}, over --device-memory {format_size(limit)} "
            f"(peaks per stage: {', '.join(format_size(p) for p in peaks)})")


def constraint(trial: FrozenTrial, limit: int) -> tuple[float, ...]:
    """Optuna's constraint of a trial: its largest stage's peak less the limit, in MiB (<= 0 is feasible);
    empty for a trial that measured nothing."""
    peaks = trial.user_attrs.get("peak_mem_bytes") or []
    return ((max(peaks) - limit) / 2**20,) if peaks else ()


def learned_runtime(measured: Sequence[tuple[Sequence[int], Sequence[int], int | Sequence[int]]], first: int,
                    ranks: int) -> tuple[int, ...]:
    """The runtime memory a prediction adds to each of ``ranks`` ranks: from measured trials ``(peaks, predicted
    totals, runtime those totals held: one figure for every rank, or one per rank)``, the least that rank peaked
    above its prediction without runtime (never below 0: a plan is pruned only where it would be over with the
    smallest runtime that rank has shown); ``first`` for a rank no trial has measured."""
    seen = [(p, [t - h for t, h in zip(q, rt if isinstance(rt, Sequence) else [rt] * len(q))])
            for p, q, rt in measured if p and q]
    per = rank_runtime_bytes(seen) if seen else ()
    return tuple(per[r] if r < len(per) else first for r in range(ranks))


def with_runtime(pred: budget.MemoryPrediction, runtime: Sequence[int]) -> budget.MemoryPrediction:
    """The same prediction with ``runtime[r]`` bytes of the runtime's own on rank r (the whole model: rank 0's)."""
    ranks = tuple(replace(r, runtime=runtime[min(r.rank, len(runtime) - 1)]) for r in pred.ranks)
    whole = pred.whole - pred.ranks[0].runtime + ranks[0].runtime if ranks else pred.whole
    return replace(pred, ranks=ranks, whole=whole)


def predicted_over(pred: budget.MemoryPrediction) -> str | None:
    """Why a plan predicted at ``pred`` cannot fit its budget, or None when it may."""
    if not pred.ranks or pred.worst.total <= pred.budget:
        return None
    return f"predicted: {pred.worst.describe()}, over --device-memory {format_size(pred.budget)}: not run"
