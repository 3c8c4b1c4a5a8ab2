"""What every trial of one study shares: the study, the pool, the profile, the settings, and the cost
model's prices of its plans (each layout by its own action order, calibrated by the measured trials).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from costmodel.calibrate import TrialRows, fit
from costmodel.simulate import simulate
from costmodel.types import Machine, Profile
from pipeline.core.budget import MemoryPrediction
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.recompute import describe
from pipeline.core.result import TrialResult
from pipeline.core.sharding import pp_rank_of
from pipeline.core.spec import ModelSpec
from pipeline.models.candidates import Candidates
from pipeline.peers.remembered import RememberedRules
from pipeline.ranks.pooling import Pool
from pipeline.stage.orders import schedule_order
from search.plans.memory import learned_runtime, predicted_over, with_runtime
from search.plans.optimum import layout_optimum
from search.plans.pricing import Price, price, simulated, unpriced_reason
from search.plans.recompute import choose_recompute, framework_of
from search.plans.seeds import forward_starts
from search.plans.space import PlanPoint, PlanSpace
from search.trials.coordination import measured_trials, repeats_spent, value_of
from search.trials.metric import Metric

__all__ = ["SearchContext", "plan_key"]


def plan_key(plan: SplitPlan) -> str:
    """One string per distinct plan (cuts, chunks, and the schedule and V where not GPipe's one stage per
    rank), to find a plan measured before."""
    key = f"{[(p.fqn, p.kind) for p in plan.split_points]}|{plan.chunks}"
    if (plan.schedule, plan.stages_per_rank) != ("GPipe", 1):
        key += f"|{plan.schedule}/V{plan.stages_per_rank}"
    if plan.recompute != "none":
        key += f"|recompute {describe(plan.recompute)}"
    return key


@dataclass(frozen=True, kw_only=True)
class SearchContext:
    """What every trial of one study shares."""

    study: optuna.Study
    pool: Pool
    profile: Profile
    cands: Candidates
    spec: ModelSpec
    space: PlanSpace
    threads: int
    backend: str
    schedule: str
    device: str
    mode: str = "infer"
    optimizer: str = "adamw"
    recompute: str = "none"
    """Training: ``search`` (each plan the least recomputation that fits), ``none`` or ``full``."""
    dp_shard: int = 1
    """Training: data-parallel replicas, each stage sharded over them (``SplitPlan.dp_shard``)."""
    mesh_order: str = "pp,dp_shard"
    """Their mesh's dimensions, outermost first (``SplitPlan.mesh_order``)."""
    least_recompute: Callable[[SplitPlan, Sequence[int]], tuple[int, ...] | None] | None = None
    """``search.plans.fitting.DeviceFit.least_recompute`` (None without a memory limit: nothing to fit)."""
    repeats: int
    """Base repeats per trial: a plan that is neither behind nor a contender stops here."""
    trial_timeout_s: float
    repeat_cap: int | None = None
    """Most repeats a contender earns (None: racing off, every plan gets ``repeats``)."""
    budget_repeats: int | None = None
    """The study's total of timed pipeline repeats over its measured trials (None: no limit)."""
    prune: bool = True
    check_first_repeat: bool = False
    """Check the output on the first timed repeat rather than in a run of its own (``check_on_first_repeat``)."""
    progress: bool = True
    metric: Metric
    """The figure plans are ranked by (speedup or throughput): every trial's value, prediction and race."""
    memory_objective: bool = False
    """``--objectives <figure>,memory``: each trial's values are (the figure, its largest stage's peak MiB)."""
    device_memory: int | None = None
    """Bytes a rank may hold (``--device-memory``): a plan predicted over it is not run, a measured one over
    it is infeasible (None: no limit)."""
    memory_of: Callable[[SplitPlan], MemoryPrediction] | None = None
    """Each plan's per-rank peak from the model on meta, without the runtime's own (None without a limit)."""
    first_runtime: int = 0
    """The runtime memory a rank is predicted to hold before any trial has measured one."""
    lean_cuts: tuple[int, ...] = ()
    """The block cuts whose largest rank needs least memory (``--device-memory``): where the memory-feasible
    optimum is searched from when the fastest plans do not fit."""
    peer_rules: RememberedRules = RememberedRules(folder=None)
    """Where the frameworks' rules' answers are remembered (the profile cache): their seeds without their imports."""
    artifacts: Any = None
    """An Optuna artifact store: every measured trial's timeline PNG is uploaded to it (dashboard shows it)."""
    budget: int | None = None
    """The study's total of measured trials, shared by every worker on it."""
    results: dict[int, TrialResult] = field(default_factory=dict)
    """This worker's measured results by trial number (the study keeps their figures as user attributes)."""
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The calibration fitted at a count of measured trials and its predictions (shared by ``replace``)."""

    @property
    def stages(self) -> int:
        return self.space.stages

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.space.chunks

    def plan(self, points: tuple[SplitPoint, ...], chunks: int, layout: int = 0, source: str | None = None) -> SplitPlan:
        """The plan to run, its recomputation chosen as ``recompute`` says (a framework's reference: as that
        framework's user would set it, ``search.plans.recompute``)."""
        lay = self.space.layouts[layout]
        plan = SplitPlan(model=self.spec, split_points=points, chunks=chunks, backend=self.backend,
                         schedule=lay.schedule, stages_per_rank=lay.per_rank, device=self.device,
                         threads_per_stage=self.threads, mode=self.mode, optimizer=self.optimizer,
                         dp_shard=self.dp_shard, mesh_order=self.mesh_order)
        if self.mode != "train" or self.recompute == "none":
            return plan
        if self.recompute == "full":
            return replace(plan, recompute="full")
        cache: dict[tuple[str, str | None, tuple[int, ...]], SplitPlan] = self._memo.setdefault("recompute", {})
        key = (plan_key(plan), framework_of(source), self.runtime())
        if key not in cache:
            cache[key] = choose_recompute(plan, self.cands, framework_of(source), self.least_recompute, self.runtime(),
                                          self._fits_plan)
        return cache[key]

    def _fits_plan(self, plan: SplitPlan) -> bool:
        pred = self.memory(plan)
        return pred is None or predicted_over(pred) is None

    def plan_for_cuts(self, cuts: list[int] | tuple[int, ...], chunks: int, layout: int = 0,
                      source: str | None = None) -> SplitPlan:
        return self.plan(tuple(SplitPoint(self.profile.segments[c].fqn) for c in cuts), chunks, layout, source)

    def order(self, p: PlanPoint) -> tuple[tuple[str, ...], ...] | None:
        """The action order of the plan's layout at its chunk count: torch's, else one a measured trial of
        that layout and chunk count recorded (None while neither exists)."""
        lay = self.space.layouts[p.layout]
        got = schedule_order(lay.schedule, self.stages, lay.per_rank, p.chunks, train=self.mode == "train")
        if got is not None:
            return got.actions
        for t in measured_trials(self.study):
            a = t.user_attrs
            if (a.get("schedule"), a.get("stages_per_rank"), a.get("chunks")) == (lay.schedule, lay.per_rank, p.chunks) \
                    and a.get("actions"):
                return tuple(tuple(r) for r in a["actions"])
        return None

    def unpriced(self, p: PlanPoint) -> str | None:
        """Why the cost model cannot price the plan (None when it can)."""
        lay = self.space.layouts[p.layout]
        if simulated(lay, self.mode):
            return None
        return unpriced_reason(lay, self.mode, self.profile, self.order(p))

    def priced(self, p: PlanPoint) -> bool:
        return self.unpriced(p) is None

    def price(self, p: PlanPoint, machine: Machine | None = None, plan: SplitPlan | None = None) -> Price:
        """The plan's prediction (``priced`` must hold), by the raw model or a calibrated ``machine``; ``plan``:
        the plan of ``p`` to be run, where its recomputation is not the search's own (a framework's reference)."""
        lay = self.space.layouts[p.layout]
        order = None if simulated(lay, self.mode) else self.order(p)
        counts = self.cands.recompute_counts(plan or self.plan_for_cuts(p.cuts, p.chunks, p.layout)) \
            if self.mode == "train" and self.recompute != "none" else None
        return price(self.profile, p.cuts, p.chunks, lay, mode=self.mode, optimizer=self.optimizer, order=order,
                     machine=machine, recompute=counts, dp_shard=self.dp_shard)

    def schedule_optimum(self, layout: int, starts: tuple[PlanPoint, ...] = ()) -> PlanPoint | None:
        """The raw model's best plan of a layout under the memory limit: one it prices by the schedule's action
        order, or (with a limit) any layout, searched from the forward optimum and ``starts`` (plans that fit);
        None for a simulated layout without a limit (``search.plans.seeds`` covers it) or where nothing fits."""
        if simulated(self.space.layouts[layout], self.mode) and self.device_memory is None:
            return None

        def score(p: PlanPoint) -> float | None:
            if not self.priced(p) or not self.fits(p):
                return None
            got = self.price(p)
            return self.metric.predicted(got.speedup, got.makespan_s)

        return layout_optimum(score, self.space, layout,
                              [*forward_starts(self.profile, self.space, layout), *starts])

    def runtime(self) -> tuple[int, ...]:
        """The runtime memory each rank is predicted to hold besides its stages: what measured trials held
        (read again only when the study holds another trial: the sampler asks for every plan it weighs)."""
        count = len(self.study.get_trials(deepcopy=False))
        if self._memo.get("runtime_at") == count:
            got: tuple[int, ...] = self._memo["runtime"]
            return got
        seen = []
        for t in measured_trials(self.study):
            a = t.user_attrs
            if a.get("peak_mem_bytes") and a.get("predicted_rank_bytes"):
                seen.append((a["peak_mem_bytes"], a["predicted_rank_bytes"], a.get("predicted_runtime", 0)))
        every = learned_runtime(seen, self.first_runtime, self.stages * self.dp_shard)  # per process of the mesh
        got = tuple(min(every[p] for p in range(len(every)) if pp_rank_of(p, self.stages, self.dp_shard, self.mesh_order)
                        == r) for r in range(self.stages))
        self._memo.update(runtime_at=count, runtime=got)
        return got

    def memory(self, plan: SplitPlan) -> MemoryPrediction | None:
        """The plan's per-rank prediction against ``--device-memory`` with the runtime learned so far (None
        without a limit); the part from the model on meta is computed once per plan."""
        if self.memory_of is None:
            return None
        cache: dict[str, MemoryPrediction] = self._memo.setdefault("memory", {})
        key = plan_key(plan)
        if key not in cache:
            cache[key] = self.memory_of(plan)
        return with_runtime(cache[key], self.runtime())

    def fits(self, p: PlanPoint) -> bool:
        """Whether a plan of the space may run under ``--device-memory`` (always, without one)."""
        pred = self.memory(self.plan_for_cuts(p.cuts, p.chunks, p.layout)) if self.memory_of else None
        return pred is None or predicted_over(pred) is None

    def calibrated(self) -> Machine | None:
        """The machine model refitted to every measured trial's timeline in the study (a resumed study's
        too), or None while there are fewer trials than factors or no machine model; fitted once per
        count of measured trials (the calibration changes only when a trial is measured)."""
        if self.profile.machine is None:
            return None
        done = measured_trials(self.study)
        if self._memo.get("fit_at") != len(done):
            rows = [TrialRows.from_dict(t.user_attrs["calibration_rows"]) for t in done
                    if t.user_attrs.get("calibration_rows")]
            try:
                machine = fit(rows).apply(self.profile.machine) if rows else None
            except ValueError:
                machine = None
            self._memo.update(fit_at=len(done), machine=machine, predictions={})
        out: Machine | None = self._memo["machine"]
        return out

    def calibrated_value(self, p: PlanPoint) -> float:
        """The calibrated model's figure of a plan (the raw model's while none can be fitted), cached
        with the calibration: what the sampler scores and the pruning rule compares."""
        machine = self.calibrated()
        cache: dict[PlanPoint, float] = self._memo.setdefault("predictions", {})
        if p not in cache:
            # a plan the model cannot price is scored as forward-only GPipe over its R x V stages: a ranking
            # within its layout only (``search.plans.proposals`` scales each layout by its own measured / predicted)
            got = self.price(p, machine) if self.priced(p) else \
                simulate(self.profile, p.cuts, p.chunks, "GPipe", machine=machine)
            cache[p] = self.metric.predicted(got.speedup, got.makespan_s)
        return cache[p]

    def predictor(self) -> Callable[[PlanPoint], float]:
        return self.calibrated_value

    def best_measured(self) -> optuna.trial.FrozenTrial | None:
        ok = [t for t in measured_trials(self.study) if t.state == optuna.trial.TrialState.COMPLETE]
        return max(ok, key=lambda t: float(value_of(t) or 0.0)) if ok else None

    def repeats_left(self) -> int | None:
        if self.budget_repeats is None:
            return None
        return self.budget_repeats - repeats_spent(self.study)
