"""PlanSampler: an Optuna sampler whose every proposal is a valid plan not tried before.

It asks ``search.proposals.propose`` for the whole plan at once (Optuna's relative sampling), from the
study's own trials: what was measured (and at what speedup), and what was tried in any way (measured,
pruned, failed, or being measured by another worker now), so that workers sharing a study do not
propose the same plan. Enqueued trials (the seeds) keep their fixed parameters.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from search.coordination import MEASURED, speedup_of
from search.proposals import EXPLORE, Measured, propose
from search.space import PlanPoint, PlanSpace, best_first

__all__ = ["REVISIT", "PlanSampler", "running_points", "tried_points"]

REVISIT = "revisit"
"""User attribute of a proposal the cost model pruned before, proposed again once every plan was tried:
the objective runs it rather than pruning it twice."""


def running_points(study: optuna.Study, space: PlanSpace) -> set[PlanPoint]:
    """Plans being measured now (by any worker)."""
    out = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        try:
            out.add(space.decode(t.params))
        except ValueError:
            continue
    return out


def tried_points(study: optuna.Study, space: PlanSpace) -> tuple[list[Measured], set[PlanPoint]]:
    """(measured plans with their speedups, every plan any trial of the study holds)."""
    measured: list[Measured] = []
    seen: set[PlanPoint] = set()
    for t in study.get_trials(deepcopy=False):
        try:
            p = space.decode(t.params)
        except ValueError:
            continue  # a fixed plan (PiPPy may cut mid-block) or a trial still being set up
        seen.add(p)
        if not t.user_attrs.get(MEASURED):
            continue
        speedup = speedup_of(t) if t.state == TrialState.COMPLETE else t.user_attrs.get("speedup")
        if speedup is not None:
            measured.append(Measured(point=p, speedup=float(speedup), repeats=int(t.user_attrs.get("repeats", 1))))
    return measured, seen


class PlanSampler(optuna.samplers.BaseSampler):
    """Proposes the next plan by the search's rule; ``predict`` is the (calibrated) cost model's speedup."""

    def __init__(self, space: PlanSpace, predict: Callable[[PlanPoint], float], model_best: Sequence[PlanPoint], *,
                 seed: int | None = None, explore: float = EXPLORE,
                 constraints: Callable[[FrozenTrial], Sequence[float]] | None = None) -> None:
        self.space = space
        self.constraints = constraints
        """Optuna's constraints function (``--max-stage-memory``): stored with each finished trial."""
        self.predict = predict
        self.model_best = list(model_best)
        self.explore = explore
        self._walks = [best_first(space, [p for p in self.model_best if p.layout == k], predict)
                       for k in range(len(space.layouts))]
        self._ranked: list[list[PlanPoint]] = [[] for _ in space.layouts]
        """Each layout's cost-model ranking walked so far (best first); ``_next_ranked`` extends them lazily."""
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self.exhausted = False
        """Set when every plan of the space has been tried (the search loop stops)."""

    def reseed_rng(self) -> None:
        self._rng.seed()
        self._random.reseed_rng()

    def distributions(self) -> dict[str, BaseDistribution]:
        return {k: CategoricalDistribution(list(v)) for k, v in self.space.choices().items()}

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.distributions()

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs or trial.user_attrs.get("fixed_plan"):
            return {}
        measured, seen = tried_points(study, self.space)
        p = propose(self.space, measured, seen, self.predict, self._next_ranked(seen), self._rng,
                    explore=self.explore)
        if p is None:  # every plan tried: those the cost model pruned without a run get their run now
            ran = {m.point for m in measured} | running_points(study, self.space)
            p = propose(self.space, measured, ran, self.predict, [], self._rng, explore=self.explore)
            if p is not None:
                study._storage.set_trial_user_attr(trial._trial_id, REVISIT, True)
        if p is None:
            self.exhausted = True
            best = max(measured, key=lambda m: m.speedup, default=None)
            return self.space.encode(best.point) if best else {}
        return self.space.encode(p)

    def _next_ranked(self, seen: set[PlanPoint]) -> list[PlanPoint]:
        """Each layout's best plans by the cost model not tried yet, best first (a few more than the stages)."""
        want = 2 * self.space.stages
        out: list[PlanPoint] = []
        for k, walk in enumerate(self._walks):
            ranked = [p for p in self._ranked[k] if p not in seen]
            for p in walk:
                if len(ranked) >= want:
                    ranked.append(p)
                    break
                if p not in seen:
                    ranked.append(p)
            self._ranked[k] = ranked
            out += ranked[:want]
        return out

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        """Store the trial's constraint values as Optuna's own samplers do (optuna-dashboard reads them)."""
        if self.constraints is not None:
            from optuna.samplers._base import _process_constraints_after_trial

            _process_constraints_after_trial(self.constraints, study, trial, state)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)
