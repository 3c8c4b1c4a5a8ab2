"""Racing repeats: a plan is measured a few repeats at a time and stops as soon as it is clearly behind.

The rule, pure (``verdict``): after k repeats a plan's speedup (the median of its repeats) is compared
with the best complete trial's. The noise band is ``Z * cv / sqrt(k)``, with ``cv`` the per-repeat
relative spread measured in this study (the median over its trials of stdev / mean of their repeats;
``DEFAULT_CV`` until three trials have two repeats). Below ``best * (1 - band)`` the plan is *behind*:
it is pruned (``RacingPruner``, an Optuna pruner fed by ``trial.report``). A plan that is not behind
runs its base repeats; one whose median then beats the best earns repeats up to the cap (the search
and the pruner measure every later plan against it, so a lucky first few repeats must not set the bar).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = ["DEFAULT_CV", "RacingPruner", "Z", "band", "noise_cv", "verdict"]

Z = 2.0
DEFAULT_CV = 0.05  # per-repeat spread of one plan's speedup on this 2-core machine: ~3-6 %
MIN_BAND = 0.01


def band(cv: float, k: int, z: float = Z) -> float:
    """Relative half-width of the noise band of a median over ``k`` repeats."""
    return max(MIN_BAND, z * cv / math.sqrt(max(1, k)))


def verdict(value: float, best: float | None, cv: float, k: int, z: float = Z) -> str:
    """'behind', 'contender' or 'ahead' of the best (no best yet, or no value: 'contender')."""
    if best is None or not best > 0 or not value == value:
        return "contender"
    b = band(cv, k, z)
    if value < best * (1 - b):
        return "behind"
    if value > best * (1 + b):
        return "ahead"
    return "contender"


def noise_cv(repeat_speedups: Sequence[Sequence[float]], default: float = DEFAULT_CV, need: int = 3) -> float:
    """The median relative spread of one plan's repeats over the trials given (``default`` until ``need``)."""
    cvs = [statistics.stdev(r) / statistics.mean(r) for r in repeat_speedups if len(r) >= 2 and statistics.mean(r) > 0]
    return statistics.median(cvs) if len(cvs) >= need else default


def study_cv(study: optuna.Study) -> float:
    """``noise_cv`` over the study's measured trials (each one's figure per repeat, ``repeat_values``; a study
    from before that attribute has ``speedups``)."""
    got = (t.user_attrs.get("repeat_values", t.user_attrs.get("speedups")) for t in study.get_trials(deepcopy=False))
    return noise_cv([v for v in got if isinstance(v, list)])


def best_value(study: optuna.Study, exclude: int | None = None) -> float | None:
    done = [float(t.values[0]) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.values and t.number != exclude]
    return max(done) if done else None


class RacingPruner(optuna.pruners.BasePruner):
    """Prune a trial whose reported figure (speedup or throughput) so far is behind the best complete trial (``verdict``)."""

    def __init__(self, z: float = Z) -> None:
        self.z = z

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        return verdict(value, best_value(study, trial.number), study_cv(study), step, self.z) == "behind"
