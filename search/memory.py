"""The memory limit of a search (``--max-stage-memory``), pure: sizes as people write them, and the rule.

A measured trial whose largest stage peaked over the limit is infeasible: it is kept (pruned, with its
figures and the reason), never declared best, and Optuna's constraint for it is that stage's peak less
the limit in MiB (positive: over), which optuna-dashboard shows as infeasible.

Before a run, a plan whose predicted memory (``costmodel.train``: parameters, gradients, optimizer state
and activations in flight, per rank) plus the runtime's own (the interpreter and torch's libraries, which
no stage accounts for: the least that measured trials peaked above their prediction, 0 before any) is
over the limit is not run: pruned with both figures in the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial

from costmodel.footprint import rank_runtime_bytes
from pipeline.core import budget
from pipeline.core.budget import format_size

__all__ = ["OVER_MEMORY", "constraint", "format_size", "over_limit", "parse_size", "predicted_over", "runtime_bytes"]

OVER_MEMORY = "over_memory"
"""User attribute of a measured trial over the limit: the reason, with the figures."""

def parse_size(text: str) -> int:
    """``4GiB``, ``512MiB``, ``1.5GB`` or a byte count: bytes; one line naming the value otherwise."""
    return budget.parse_size(text, "--max-stage-memory")


def over_limit(peaks: Sequence[int], limit: int) -> str | None:
    """Why a trial whose ranks peaked at ``peaks`` breaks ``limit``, or None when every stage fits."""
    if not peaks or max(peaks) <= limit:
        return None
    worst = max(range(len(peaks)), key=lambda r: peaks[r])
    return (f"stage {worst} peaked at {format_size(peaks[worst])}, over --max-stage-memory {format_size(limit)} "
            f"(peaks per stage: {', '.join(format_size(p) for p in peaks)})")


def constraint(trial: FrozenTrial, limit: int) -> tuple[float, ...]:
    """Optuna's constraint of a trial: its largest stage's peak less the limit, in MiB (<= 0 is feasible);
    empty for a trial that measured nothing."""
    peaks = trial.user_attrs.get("peak_mem_bytes") or []
    return ((max(peaks) - limit) / 2**20,) if peaks else ()


def runtime_bytes(measured: Sequence[tuple[Sequence[int], Sequence[int]]]) -> int:
    """The memory a rank holds that no prediction accounts for: the least (measured peak - predicted) over
    the ranks of the measured trials ``(peaks, predicted)`` (0 before any, never below 0), so that a plan
    pruned for it would have peaked over the limit with the smallest runtime seen."""
    return min(rank_runtime_bytes(measured), default=0)


def predicted_over(predicted: Sequence[int], runtime: int, limit: int) -> str | None:
    """Why a plan predicted at ``predicted`` bytes per rank cannot fit ``limit`` with ``runtime`` bytes of
    the runtime's own beside each, or None when it may."""
    if not predicted or max(predicted) + runtime <= limit:
        return None
    worst = max(range(len(predicted)), key=lambda r: predicted[r])
    return (f"predicted: stage {worst} needs {format_size(predicted[worst])} (parameters, gradients, optimizer "
            f"state, activations in flight) + {format_size(runtime)} the runtime held in measured trials, over "
            f"--max-stage-memory {format_size(limit)}: not run")
