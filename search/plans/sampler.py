"""PlanSampler: an Optuna sampler whose every proposal is a valid plan not tried before.

It asks ``search.plans.proposals.propose`` for the whole plan at once (Optuna's relative sampling), from the
study's own trials: what was measured (and at what speedup), and what was tried in any way (measured,
pruned, failed, or being measured by another worker now), so that workers sharing a study do not
propose the same plan. Enqueued trials (the seeds) keep their fixed parameters, and a seed whose plan
lies in the space (PiPPy's, when it cuts at a block) counts as tried too.

A plan is proposed once: measured, raced out, pruned by the cost model or for memory, it is never
proposed again, so a study holds at most one trial per plan besides its seeds. ``untried`` says whether
anything is left, so that the search loop stops before it asks Optuna for a trial that could only repeat.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from search.plans.proposals import EXPLORE, Measured, propose
from search.plans.space import Layout, PlanPoint, PlanSpace, best_first
from search.trials.coordination import MEASURED, value_of

__all__ = ["PlanSampler", "trial_point", "tried_points"]


def trial_point(t: FrozenTrial, space: PlanSpace) -> PlanPoint | None:
    """The plan of the space a trial holds: from its parameters, or from a seed's fixed plan where its cuts
    fall on the space's segments; None for a plan outside the space (a cut mid-block) or no plan yet."""
    try:
        return space.decode(t.params)
    except ValueError:
        pass
    fixed = t.user_attrs.get("fixed_plan")
    if not isinstance(fixed, dict):
        return None
    points = fixed.get("split_points") or []
    if any(p.get("kind", "BEGINNING") != "BEGINNING" for p in points):
        return None
    label = Layout(schedule=str(fixed.get("schedule", "GPipe")), per_rank=int(fixed.get("stages_per_rank", 1) or 1)).label
    params: dict[str, Any] = {f"cut_{i}": p.get("fqn") for i, p in enumerate(points, 1)}
    params["chunks"] = fixed.get("chunks")
    if space.multi:
        params["layout"] = label
    elif space.layouts[0].label != label:
        return None
    try:
        return space.decode(params)
    except (ValueError, TypeError):
        return None


def tried_points(study: optuna.Study, space: PlanSpace) -> tuple[list[Measured], set[PlanPoint]]:
    """(measured plans with their speedups, every plan any trial of the study holds)."""
    measured: list[Measured] = []
    seen: set[PlanPoint] = set()
    for t in study.get_trials(deepcopy=False):
        p = trial_point(t, space)
        if p is None:
            continue  # a fixed plan outside the space (PiPPy may cut mid-block) or a trial still being set up
        seen.add(p)
        if not t.user_attrs.get(MEASURED):
            continue
        speedup = value_of(t) if t.state == TrialState.COMPLETE else t.user_attrs.get("value",
                                                                                     t.user_attrs.get("speedup"))
        if speedup is not None:
            measured.append(Measured(point=p, speedup=float(speedup), repeats=int(t.user_attrs.get("repeats", 1))))
    return measured, seen


class PlanSampler(optuna.samplers.BaseSampler):
    """Proposes the next plan by the search's rule; ``predict`` is the (calibrated) cost model's speedup."""

    def __init__(self, space: PlanSpace, predict: Callable[[PlanPoint], float], model_best: Sequence[PlanPoint], *,
                 seed: int | None = None, explore: float = EXPLORE,
                 constraints: Callable[[FrozenTrial], Sequence[float]] | None = None,
                 fits: Callable[[PlanPoint], bool] | None = None) -> None:
        self.space = space
        self.constraints = constraints
        """Optuna's constraints function (``--device-memory``): stored with each finished trial."""
        self.fits = fits or (lambda p: True)
        """Whether a plan is predicted to fit ``--device-memory``: no other is proposed."""
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
                    explore=self.explore, fits=self.fits)
        if p is None:  # another worker took the last plan between the loop's look and this ask
            self.exhausted = True
            best = max(measured, key=lambda m: m.speedup, default=None)
            return self.space.encode(best.point) if best else {}
        return self.space.encode(p)

    def untried(self, study: optuna.Study) -> int:
        """Plans of the space no trial of ``study`` holds yet (0: nothing is left to propose)."""
        return max(0, self.space.size - len(tried_points(study, self.space)[1]))

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
