"""One search trial: decode the proposal into a plan, predict it, prune it or measure it, record it.

``SearchContext`` is what every trial of one study shares (the study, the pool, the profile, the
settings); ``Objective`` is the callable Optuna runs, one trial at a time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna

from costmodel.calibrate import TrialRows, fit, trial_rows
from costmodel.simulate import simulate
from costmodel.types import Machine, Profile
from pipeline.candidates import Candidates
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec
from pipeline.pooling import Pool
from search.coordination import MEASURED, measured_trials, skip_reason, worker_id
from search.pruning import prune_reason
from search.space import cut_ranges, decode, violation

__all__ = ["Objective", "SearchContext", "TrialFailed", "plan_key", "result_attrs"]


class TrialFailed(Exception):
    """A real trial that did not produce a speedup (its reason is in the trial's user attributes)."""


def plan_key(plan: SplitPlan) -> str:
    """One string per distinct plan (cuts and chunks), to find a plan measured before."""
    return f"{[(p.fqn, p.kind) for p in plan.split_points]}|{plan.chunks}"


@dataclass(frozen=True, kw_only=True)
class SearchContext:
    """What every trial of one study shares."""

    study: optuna.Study
    pool: Pool
    profile: Profile
    cands: Candidates
    spec: ModelSpec
    stages: int
    chunks: tuple[int, ...]
    threads: int
    backend: str
    schedule: str
    device: str
    repeats: int
    trial_timeout_s: float
    prune: bool = True
    progress: bool = True
    artifacts: Any = None
    """An Optuna artifact store: every measured trial's timeline PNG is uploaded to it (dashboard shows it)."""
    budget: int | None = None
    """The study's total of measured trials, shared by every worker on it."""
    results: dict[int, TrialResult] = field(default_factory=dict)
    """This worker's measured results by trial number (the study keeps their figures as user attributes)."""

    def plan(self, points: tuple[SplitPoint, ...], chunks: int) -> SplitPlan:
        return SplitPlan(model=self.spec, split_points=points, chunks=chunks, backend=self.backend,
                         schedule=self.schedule, device=self.device, threads_per_stage=self.threads)

    def plan_for_cuts(self, cuts: list[int] | tuple[int, ...], chunks: int) -> SplitPlan:
        return self.plan(tuple(SplitPoint(self.profile.segments[c].fqn) for c in cuts), chunks)

    def calibrated(self) -> Machine | None:
        """The machine model refitted to every measured trial's timeline in the study (a resumed study's
        too), or None while there are fewer trials than factors or no machine model."""
        if self.profile.machine is None:
            return None
        rows = [TrialRows.from_dict(t.user_attrs["calibration_rows"]) for t in measured_trials(self.study)
                if t.user_attrs.get("calibration_rows")]
        try:
            return fit(rows).apply(self.profile.machine) if rows else None
        except ValueError:
            return None

    def best_measured(self) -> optuna.trial.FrozenTrial | None:
        ok = [t for t in measured_trials(self.study) if t.state == optuna.trial.TrialState.COMPLETE]
        return max(ok, key=lambda t: float(t.value or 0.0)) if ok else None


class Objective:
    """The function Optuna calls for each trial of the study."""

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx = ctx

    def __call__(self, trial: optuna.Trial) -> float:
        ctx = self.ctx
        fixed = trial.user_attrs.get("fixed_plan")
        source = trial.user_attrs.get("source")
        if source is None:
            trial.set_user_attr("source", "tpe")
        prediction = None
        machine: Machine | None = None
        if fixed:
            plan = SplitPlan.from_dict(fixed)
        else:
            cuts = [trial.suggest_int(f"cut_{i}", lo, hi) for i, (lo, hi) in
                    enumerate(cut_ranges(len(ctx.profile.segments), ctx.stages))]
            chunks = trial.suggest_categorical("chunks", list(ctx.chunks))
            v = violation(cuts)
            trial.set_constraint("cut_order", v)
            if v > 0:
                trial.set_user_attr("infeasible", f"cuts {cuts} are not increasing")
                raise optuna.TrialPruned("infeasible: cuts not increasing")
            plan = ctx.plan_for_cuts(cuts, int(chunks))
            prediction = simulate(ctx.profile, cuts, int(chunks), ctx.schedule)
            trial.set_user_attr("predicted_speedup", prediction.speedup)
            trial.set_user_attr("predicted_s", prediction.makespan_s)
            trial.set_user_attr("predicted_bubble", prediction.bubble_fraction)
            if prediction.ceiling is not None:
                trial.set_user_attr("predicted_ceiling", prediction.ceiling)
            machine = ctx.calibrated()
            if machine is not None:
                trial.set_user_attr("calibrated_speedup",
                                    simulate(ctx.profile, cuts, int(chunks), ctx.schedule, machine=machine).speedup)
            bounds = [0, *cuts, len(ctx.profile.segments)]
            trial.set_user_attr("stage_blocks", [b - a for a, b in zip(bounds, bounds[1:])])
        trial.set_user_attr("split_points", [p.fqn if p.kind == "BEGINNING" else f"{p.fqn}:END"
                                             for p in plan.split_points])
        trial.set_user_attr("chunks", plan.chunks)
        trial.set_user_attr("plan", plan.to_dict())
        key = plan_key(plan)
        for t in measured_trials(ctx.study):
            if t.user_attrs.get("plan_key") == key and t.state == optuna.trial.TrialState.COMPLETE:
                trial.set_user_attr("duplicate_of", t.number)
                return float(t.value or 0.0)
        if ctx.prune and source is None and prediction is not None:
            self._maybe_prune(trial, cuts, int(chunks), machine)
        trial.set_user_attr("plan_key", key)
        trial.set_user_attr(MEASURED, True)
        trial.set_user_attr("worker", worker_id())
        why = skip_reason(ctx.study, trial.number, key, ctx.budget)
        if why:
            trial.set_user_attr(MEASURED, False)
            trial.set_user_attr("skipped", why)
            raise optuna.TrialPruned(why)
        try:
            # warmup=0: the output check just ran the freshly built pipeline once, which is its warm-up
            result = ctx.pool.run(plan, repeats=ctx.repeats, warmup=0, timeout_s=ctx.trial_timeout_s,
                                  serial_all=False)
        except KeyboardInterrupt:
            trial.set_user_attr(MEASURED, False)  # an interrupted run measured nothing; resume runs it again
            trial.set_user_attr("fail_reason", "interrupted")
            raise
        ctx.results[trial.number] = result
        for k, v in result_attrs(result).items():
            trial.set_user_attr(k, v)
        if result.ok and prediction is not None and ctx.profile.machine is not None:
            spans = [[(a, b) for _, a, b in ev] for ev in result.events]
            trial.set_user_attr("calibration_rows",
                                trial_rows(prediction.stage_s, spans, ctx.profile.machine).to_dict())
        if result.ok and ctx.artifacts is not None:
            self._upload_timeline(trial, result, plan)
        if not result.ok:
            raise TrialFailed(result.reason)
        return result.speedup

    def _maybe_prune(self, trial: optuna.Trial, cuts: list[int], chunks: int, machine: Machine | None) -> None:
        """Prune by the calibrated model once it can be fitted (the raw one before): the new plan and every
        measured plan are predicted by the same model, so the rule's correction compares like with like.
        Nothing is reported to Optuna: a prediction is not a measurement (it stays in the user attributes)."""
        ctx = self.ctx
        done = []
        for t in measured_trials(ctx.study):
            if t.state != optuna.trial.TrialState.COMPLETE or not t.user_attrs.get("predicted_speedup"):
                continue
            if machine is None:
                done.append((float(t.value or 0.0), float(t.user_attrs["predicted_speedup"])))
            elif "cut_0" in t.params:
                past = decode(t.params, ctx.stages)
                done.append((float(t.value or 0.0), simulate(ctx.profile, past[0], past[1], ctx.schedule,
                                                             machine=machine).speedup))
        predicted = simulate(ctx.profile, cuts, chunks, ctx.schedule, machine=machine).speedup
        why = prune_reason(predicted, done)
        if why:
            trial.set_user_attr("pruned_by", why + (" (calibrated)" if machine is not None else ""))
            raise optuna.TrialPruned()

    def _upload_timeline(self, trial: optuna.Trial, result: TrialResult, plan: SplitPlan) -> None:
        """The trial's measured timeline as a PNG artifact beside the trial in optuna-dashboard."""
        import tempfile
        from pathlib import Path

        from optuna.artifacts import upload_artifact

        from pipeline.timeline import Timeline, render

        with tempfile.TemporaryDirectory() as tmp:
            path = render(Timeline.from_result(result), Path(tmp) / f"timeline-trial{trial.number}.png",
                          title=f"trial {trial.number}: {plan.describe()} - {result.speedup:.2f}x")
            artifact_id = upload_artifact(artifact_store=self.ctx.artifacts, file_path=str(path),
                                          study_or_trial=trial, mimetype="image/png")
        trial.set_user_attr("timeline_artifact", artifact_id)


def result_attrs(result: TrialResult) -> dict[str, Any]:
    """A trial's user attributes: a subset of the result's one JSON shape (``TrialResult.measured``)."""
    if not result.ok:
        return {"fail_reason": result.reason}
    m = result.measured()
    keep = ("speedup_spread", "serial_s", "pipeline_s", "stage_compute_s", "stage_comm_s", "boundary_bytes",
            "peak_mem_bytes", "max_abs_diff")
    return {**{k: m[k] for k in keep}, "measured_s": statistics.median(result.pipeline_s), "output_check": "ok",
            "trial_wall_s": result.wall_s}
