"""One search trial: decode the proposal into a plan, predict it, prune it or race it, record it.

``Objective`` is the callable Optuna runs, one trial at a time, over the ``SearchContext``
(``search.study.context``) that every trial of one study shares.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import optuna

from costmodel.calibrate import trial_rows
from costmodel.types import Machine
from pipeline.core.plan import SplitPlan
from pipeline.core.result import TrialResult, merged
from search.judging.racing import band, best_value, study_cv
from search.plans.memory import OVER_MEMORY, over_limit, predicted_over
from search.plans.pruning import PRUNE_STREAK, budget_covers_rest, prune_reason
from search.plans.space import PlanPoint
from search.study.context import SearchContext, plan_key
from search.study.notes import save_trial_note
from search.trials.coordination import MEASURED, SAMPLER, measured_trials, skip_reason, value_of, worker_id
from search.trials.metric import Metric, pooled_serial

__all__ = ["Objective", "TrialFailed", "result_attrs"]


class TrialFailed(Exception):
    """A real trial that did not produce a figure (its reason is in the trial's user attributes)."""


class Objective:
    """The function Optuna calls for each trial of the study."""

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx = ctx

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        ctx = self.ctx
        fixed = trial.user_attrs.get("fixed_plan")
        source = trial.user_attrs.get("source")
        if source is None:
            trial.set_user_attr("source", SAMPLER)
        prediction = None
        machine: Machine | None = None
        point: PlanPoint | None = None
        if fixed:
            plan = SplitPlan.from_dict(fixed)
        else:
            params = ctx.space.ask(lambda name, choices: trial.suggest_categorical(name, list(choices)))
            try:
                point = ctx.space.decode(params)
            except ValueError as e:  # only a foreign sampler or a hand-enqueued trial can get here
                trial.set_user_attr("infeasible", str(e))
                raise optuna.TrialPruned(f"infeasible: {e}") from None
            plan = ctx.plan_for_cuts(point.cuts, point.chunks, point.layout, source)
            why = ctx.unpriced(point)
            if why is None:
                prediction = ctx.price(point, plan=plan)
                trial.set_user_attr("predicted_speedup", prediction.speedup)
                trial.set_user_attr("predicted_value", ctx.metric.predicted(prediction.speedup, prediction.makespan_s))
                trial.set_user_attr("predicted_s", prediction.makespan_s)
                trial.set_user_attr("predicted_bubble", prediction.bubble_fraction)
                trial.set_user_attr("predicted_by", prediction.model)
                trial.set_user_attr("predicted_mem_bytes", list(prediction.rank_mem_bytes))
                if prediction.ceiling is not None:
                    trial.set_user_attr("predicted_ceiling", prediction.ceiling)
                machine = ctx.calibrated()
                if machine is not None:
                    trial.set_user_attr("calibrated_value", ctx.calibrated_value(point))
            else:
                trial.set_user_attr("prediction", why)
            trial.set_user_attr("stage_blocks", ctx.space.stage_blocks(point))
        trial.set_user_attr("split_points", [p.fqn if p.kind == "BEGINNING" else f"{p.fqn}:END"
                                             for p in plan.split_points])
        trial.set_user_attr("chunks", plan.chunks)
        trial.set_user_attr("schedule", plan.schedule)
        trial.set_user_attr("stages_per_rank", plan.stages_per_rank)
        trial.set_user_attr("plan", plan.to_dict())
        key = plan_key(plan)
        for t in measured_trials(ctx.study):
            if t.user_attrs.get("plan_key") == key and t.state == optuna.trial.TrialState.COMPLETE:
                trial.set_user_attr("duplicate_of", t.number)
                return (float(t.values[0]), float(t.values[1])) if ctx.memory_objective else float(t.values[0])
        if ctx.memory_of is not None:
            self._maybe_over_device(trial, plan)
        if ctx.prune and source is None and point is not None and prediction is not None:
            self._maybe_prune(trial, point, machine)
        trial.set_user_attr("plan_key", key)
        trial.set_user_attr(MEASURED, True)
        trial.set_user_attr("worker", worker_id())
        why = skip_reason(ctx.study, trial.number, key, ctx.budget)
        if why:
            trial.set_user_attr(MEASURED, False)
            trial.set_user_attr("skipped", why)
            raise optuna.TrialPruned(why)
        try:
            result, raced = self._race(trial, plan, seed=source is not None)
        except KeyboardInterrupt:
            trial.set_user_attr(MEASURED, False)  # an interrupted run measured nothing; resume runs it again
            trial.set_user_attr("fail_reason", "interrupted")
            raise
        ctx.results[trial.number] = result
        serial = self._serial(trial, result)
        for k, v in result_attrs(result, ctx.metric, serial).items():
            trial.set_user_attr(k, v)
        if result.ok and result.events and prediction is not None and prediction.stage_s and ctx.profile.machine:
            spans = [[(a, b) for _, a, b in ev] for ev in result.events]
            trial.set_user_attr("calibration_rows",
                                trial_rows(prediction.stage_s, spans, ctx.profile.machine).to_dict())
        artifact = self._upload_timeline(trial, result, plan) if result.ok and ctx.artifacts is not None else None
        over = over_limit(result.peak_mem_bytes, ctx.device_memory) if result.ok and ctx.device_memory else None
        if over:
            trial.set_user_attr(OVER_MEMORY, over)
        state = "over the memory limit" if over else ("raced out" if raced else ("measured" if result.ok else "failed"))
        save_trial_note(trial, ctx.space.names, state, artifact, ctx.metric.name, ctx.device_memory)
        if not result.ok:
            raise TrialFailed(result.reason)
        if over:
            raise optuna.TrialPruned(over)
        if raced:
            raise optuna.TrialPruned(str(trial.user_attrs.get("raced_out")))
        if ctx.memory_objective:
            return ctx.metric.of(result, serial), max(result.peak_mem_bytes) / 2**20
        return ctx.metric.of(result, serial)

    def _serial(self, trial: optuna.Trial, result: TrialResult) -> float | None:
        """The serial seconds a speedup divides: this trial's and the last few measured trials', pooled."""
        if not self.ctx.metric.speedup or not result.serial_s:
            return None
        earlier = [t.user_attrs["serial_s"] for t in measured_trials(self.ctx.study)
                   if t.number < trial.number and isinstance(t.user_attrs.get("serial_s"), list)]
        return pooled_serial(result.serial_s, earlier)

    def _race(self, trial: optuna.Trial, plan: SplitPlan, *, seed: bool) -> tuple[TrialResult, bool]:
        """Measure ``plan`` on one built stage in steps of ceil(base / 2) repeats (one repeat at a time at
        DeiT-S's 2 base repeats; fewer round trips for a short model repeated more), reporting the median
        figure (speedup or throughput) after every repeat and asking the pruner after every step: (the result, whether the racing
        pruner stopped it). Seeds are references: never raced out."""
        ctx = self.ctx
        base = ctx.repeats
        cap = ctx.repeat_cap or base
        left = ctx.repeats_left()
        if left is not None:
            cap, base = max(1, min(cap, left)), max(1, min(base, left))
        race = ctx.repeat_cap is not None
        step = max(1, math.ceil(base / 2)) if race else base
        kw: dict[str, Any] = {"warmup": 0, "timeout_s": ctx.trial_timeout_s, "serial_all": False, "keep": race,
                              "serial": ctx.metric.speedup,
                              "check_first_repeat": ctx.check_first_repeat}
        # warmup=0: the output check's own run warms the fresh pipeline up, or, where a run takes seconds,
        # the check is on the first timed repeat (no slower than the next: search.study.runner.check_on_first_repeat)
        parts = [ctx.pool.run(plan, repeats=min(step, base), **kw)]
        reported = 0
        while True:
            result = merged(parts)
            k = len(result.pipeline_s)
            trial.set_user_attr("repeats", k)
            if not result.ok:
                return result, False
            serial = self._serial(trial, result)
            figures = ctx.metric.repeats(result, serial)
            for j in range(reported + 1, k + 1):
                if not ctx.memory_objective:  # Optuna reports (and prunes) single-objective trials only
                    trial.report(statistics.median(figures[:j]) if figures[:j] else float("nan"), step=j)
            reported = k
            if k >= cap:
                return result, False
            best = best_value(ctx.study, trial.number)
            if not seed and trial.should_prune():
                cv = study_cv(ctx.study)
                fmt = ctx.metric.fmt
                trial.set_user_attr("raced_out", f"after {k} repeat{'s' if k > 1 else ''} at "
                                    f"{fmt(ctx.metric.of(result, serial))}, more than {band(cv, k):.1%} behind the best "
                                    f"{fmt(best or 0.0)}")
                return result, True
            if k >= base and (best is None or ctx.metric.of(result, serial) < best):
                return result, False  # not a new best (or the first plan): the base repeats rank it well enough
            limit = base if k < base else cap
            parts.append(ctx.pool.run(plan, repeats=min(step, limit - k), resume=True, **kw))

    def _maybe_over_device(self, trial: optuna.Trial, plan: SplitPlan) -> None:
        """Do not run a plan (a seed's too) with a rank predicted over ``--device-memory``, from the model on
        meta and the runtime measured so far, before anything is built; its per-rank prediction is kept."""
        pred = self.ctx.memory(plan)
        assert pred is not None
        every = [pred.ranks[plan.pp_rank(p)] for p in range(plan.world)]  # per process, as peaks are measured
        trial.set_user_attr("predicted_rank_bytes", [r.total for r in every])
        trial.set_user_attr("predicted_runtime", [r.runtime for r in every])
        why = predicted_over(pred)
        if why:
            trial.set_user_attr(OVER_MEMORY, why)
            save_trial_note(trial, self.ctx.space.names, "predicted over the memory limit", None, self.ctx.metric.name,
                            self.ctx.device_memory)
            raise optuna.TrialPruned(why)

    def _maybe_prune(self, trial: optuna.Trial, point: PlanPoint, machine: Machine | None) -> None:
        """Prune by the calibrated model once it can be fitted (the raw one before): the new plan and every
        measured plan are predicted by the same model, so the rule's correction compares like with like.
        Nothing is reported to Optuna: a prediction is not a measurement (it stays in the user attributes).
        After ``PRUNE_STREAK`` prunes in a row the next proposal runs: pruning may not starve the search."""
        ctx = self.ctx
        sampler = ctx.study.sampler
        if ctx.budget is not None and hasattr(sampler, "untried") and budget_covers_rest(
                ctx.budget - len(measured_trials(ctx.study)), sampler.untried(ctx.study)):
            trial.set_user_attr("pruning_rested", "the budget left measures every plan not yet tried")
            return
        recent = [t for t in ctx.study.get_trials(deepcopy=False) if t.number < trial.number
                  and t.user_attrs.get("source") == SAMPLER and t.state.is_finished()][-PRUNE_STREAK:]
        if len(recent) == PRUNE_STREAK and all(t.user_attrs.get("pruned_by") for t in recent):
            trial.set_user_attr("pruning_rested", f"the last {PRUNE_STREAK} proposals were pruned")
            return
        done = []
        for t in measured_trials(ctx.study):
            if t.state != optuna.trial.TrialState.COMPLETE or not t.user_attrs.get("predicted_value"):
                continue
            if machine is None:
                done.append((float(value_of(t) or 0.0), float(t.user_attrs["predicted_value"])))
            else:
                try:
                    past = ctx.space.decode(t.params)
                except ValueError:
                    continue
                if not ctx.priced(past):
                    continue
                done.append((float(value_of(t) or 0.0), ctx.calibrated_value(past)))
        predicted = ctx.calibrated_value(point)  # the raw model's while no calibration is fitted
        why = prune_reason(predicted, done, unit="x" if ctx.metric.speedup else " samples/s")
        if why:
            trial.set_user_attr("pruned_by", why + (" (calibrated)" if machine is not None else ""))
            raise optuna.TrialPruned()

    def _upload_timeline(self, trial: optuna.Trial, result: TrialResult, plan: SplitPlan) -> str:
        """The trial's measured timeline as a PNG artifact beside the trial in optuna-dashboard."""
        import tempfile
        from pathlib import Path

        from optuna.artifacts import upload_artifact

        from pipeline.stage.timeline import Timeline, render

        with tempfile.TemporaryDirectory() as tmp:
            path = render(Timeline.from_result(result), Path(tmp) / f"timeline-trial{trial.number}.png",
                          title=f"trial {trial.number}: {plan.describe()} - {self.ctx.metric.fmt(self.ctx.metric.of(result))}")
            artifact_id = upload_artifact(artifact_store=self.ctx.artifacts, file_path=str(path),
                                          study_or_trial=trial, mimetype="image/png")
        trial.set_user_attr("timeline_artifact", artifact_id)
        return str(artifact_id)


def result_attrs(result: TrialResult, metric: Metric, serial_s: float | None = None) -> dict[str, Any]:
    """A trial's user attributes: a subset of the result's one JSON shape (``TrialResult.measured``), and its
    figure (``value``, per repeat ``repeat_values``) in the study's metric (a speedup over ``serial_s``, the
    pooled serial seconds, where given; ``speedup`` stays the median of the repeats' own ratios)."""
    if not result.ok:
        return {"fail_reason": result.reason}
    m = result.measured()
    keep = ("speedup_spread", "serial_s", "pipeline_s", "stage_compute_s", "stage_comm_s", "boundary_bytes",
            "peak_mem_bytes", "base_mem_bytes", "stage_bytes", "reused_bytes", "max_abs_diff", "check", "throughput",
            "throughput_spread", "tokens_per_s")
    speedup = {"speedup": result.speedup, "speedups": list(result.speedups)} if result.serial_s else {}
    return {**{k: m[k] for k in keep}, "measured_s": statistics.median(result.pipeline_s), "output_check": "ok",
            "trial_wall_s": result.wall_s, **speedup, "value": metric.of(result, serial_s),
            "repeat_values": metric.repeats(result, serial_s), **({"serial_pool_s": serial_s} if serial_s else {}),
            **({"breakdown": m["breakdown"]} if m.get("breakdown") else {}),
            **({"actions": result.extra["actions"]} if result.extra.get("actions") else {})}
