"""The search loop: seed, ask, predict, prune or measure, tell; then confirm the top plans.

Pruning rule ("clearly behind"): once 3 plans are measured, the cost model's predicted speedup of a
new plan is corrected by the most optimistic measured/predicted ratio seen so far; if even that falls
below 97 % of the best measured speedup (inside the ~5 % noise of one trial, so a plan that could tie
is still run), the plan is pruned without a run. Enqueued seeds always run.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from costmodel.simulate import simulate
from costmodel.types import Profile
from pipeline.candidates import Candidates
from pipeline.plan import SplitPlan, SplitPoint
from pipeline.pool import StagePool
from pipeline.result import TrialResult
from pipeline.spec import ModelSpec
from search.references import seeds
from search.space import cut_ranges, decode, encode, violation

MEASURED = "measured"
PRUNE_AFTER = 3
PRUNE_MARGIN = 0.97
CLAIM_POLL_S = 2.0  # how often a worker with nothing left to claim looks at the others' trials
IDLE_LIMIT = 60  # proposals in a row that need no run before the search counts the space as exhausted


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TrialFailed(Exception):
    """A real trial that did not produce a speedup (its reason is in the trial's user attributes)."""


def trial_repeats(asked: int, serial_s: float, min_seconds: float, cap: int = 5) -> int:
    """Repeats per trial: at least ``asked``, and enough to time ``min_seconds`` of the serial model.

    A ResNet-50 batch of 8 takes 0.5 s on one core here: two repeats of it left the same plan at 1.13x
    and 1.32x in one interleaved round, so short models are repeated more (at most ``cap`` x asked).
    """
    if min_seconds <= 0 or serial_s <= 0:
        return asked
    return max(asked, min(cap * asked, math.ceil(min_seconds / serial_s)))


@dataclass
class Search:
    study: optuna.Study
    pool: StagePool
    profile: Profile
    cands: Candidates
    spec: ModelSpec
    stages: int
    chunks: list[int]
    threads: int
    backend: str
    schedule: str
    device: str
    repeats: int
    trial_timeout: float
    prune: bool = True
    progress: bool = True
    artifacts: Any = None
    """An Optuna artifact store: every measured trial's timeline PNG is uploaded to it (dashboard shows it)."""
    results: dict[int, TrialResult] = field(default_factory=dict)
    budget: int | None = None
    """The study's total of measured trials, shared by every worker on it (set by ``optimize``)."""

    # ---- plans -------------------------------------------------------------------------------
    def plan(self, points: tuple[SplitPoint, ...], chunks: int) -> SplitPlan:
        return SplitPlan(model=self.spec, split_points=points, chunks=chunks, backend=self.backend,
                         schedule=self.schedule, device=self.device, threads_per_stage=self.threads)

    def plan_for_cuts(self, cuts: list[int] | tuple[int, ...], chunks: int) -> SplitPlan:
        return self.plan(tuple(SplitPoint(self.profile.segments[c].fqn) for c in cuts), chunks)

    @staticmethod
    def plan_key(plan: SplitPlan) -> str:
        return f"{[(p.fqn, p.kind) for p in plan.split_points]}|{plan.chunks}"

    def measured_trials(self) -> list[optuna.trial.FrozenTrial]:
        """Trials that ran a plan to the end: complete, or failed with a reason (a stale trial, whose worker
        died, has none and is not counted)."""
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            if t.user_attrs.get(MEASURED) and (t.state == TrialState.COMPLETE or t.user_attrs.get("fail_reason")):
                out.append(t)
        return out

    def claims(self) -> list[optuna.trial.FrozenTrial]:
        """Measured trials plus those being measured now, by this or another worker on the same study."""
        running = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.user_attrs.get(MEASURED)]
        return self.measured_trials() + running

    def fail_stale(self) -> list[int]:
        """Fail trials left RUNNING by a dead worker on this host (journal storage has no heartbeats; RDB
        storage also fails them by heartbeat, from any host). Returns their numbers."""
        from optuna.storages import fail_stale_trials
        from optuna.storages._heartbeat import is_heartbeat_enabled

        if is_heartbeat_enabled(self.study._storage):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since 2.9 in practice
                fail_stale_trials(self.study)
        host = socket.gethostname()
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            who = str(t.user_attrs.get("worker", ""))
            name, _, pid = who.rpartition(":")
            if name != host or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
                continue
            storage = self.study._storage
            try:
                storage.set_trial_user_attr(t._trial_id, "stale", f"worker {who} died while measuring it")
                storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                out.append(t.number)
            except (RuntimeError, ValueError):  # another worker got there first
                pass
        return out

    def best_measured(self) -> optuna.trial.FrozenTrial | None:
        ok = [t for t in self.measured_trials() if t.state == optuna.trial.TrialState.COMPLETE]
        return max(ok, key=lambda t: t.value) if ok else None

    # ---- seeding -----------------------------------------------------------------------------
    def seed_study(self) -> None:
        """Enqueue the references once per study (a resumed study keeps the ones it has)."""
        if self.study.user_attrs.get("seeded"):
            return
        for s in seeds(self.profile, self.cands, self.stages, self.chunks):
            if s.cuts is not None:
                self.study.enqueue_trial(encode(s.cuts, s.chunks), user_attrs={"source": s.source},
                                         skip_if_exists=True)
            else:
                plan = self.plan(s.points or (), s.chunks)
                self.study.enqueue_trial({}, user_attrs={"source": s.source, "fixed_plan": plan.to_dict()},
                                         skip_if_exists=True)
        self.study.set_user_attr("seeded", True)

    def seed_count(self) -> int:
        """Trials enqueued from the references (run or waiting): a sweep measures all of them."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if str(t.user_attrs.get("source", "tpe")) != "tpe")

    # ---- one trial ---------------------------------------------------------------------------
    def objective(self, trial: optuna.Trial) -> float:
        fixed = trial.user_attrs.get("fixed_plan")
        source = trial.user_attrs.get("source")
        if source is None:
            trial.set_user_attr("source", "tpe")
        prediction = None
        if fixed:
            plan = SplitPlan.from_dict(fixed)
        else:
            cuts = [trial.suggest_int(f"cut_{i}", lo, hi) for i, (lo, hi) in
                    enumerate(cut_ranges(len(self.profile.segments), self.stages))]
            chunks = trial.suggest_categorical("chunks", self.chunks)
            v = violation(cuts)
            trial.set_constraint("cut_order", v)
            if v > 0:
                trial.set_user_attr("infeasible", f"cuts {cuts} are not increasing")
                raise optuna.TrialPruned("infeasible: cuts not increasing")
            plan = self.plan_for_cuts(cuts, chunks)
            prediction = simulate(self.profile, cuts, chunks, self.schedule)
            trial.set_user_attr("predicted_speedup", prediction.speedup)
            trial.set_user_attr("predicted_s", prediction.makespan_s)
            trial.set_user_attr("predicted_bubble", prediction.bubble_fraction)
            trial.set_user_attr("stage_blocks", [b - a for a, b in zip([0, *cuts], [*cuts, len(self.profile.segments)])])
        trial.set_user_attr("split_points", [p.fqn if p.kind == "BEGINNING" else f"{p.fqn}:END"
                                             for p in plan.split_points])
        trial.set_user_attr("chunks", plan.chunks)
        trial.set_user_attr("plan", plan.to_dict())
        key = self.plan_key(plan)
        for t in self.measured_trials():
            if t.user_attrs.get("plan_key") == key and t.state == optuna.trial.TrialState.COMPLETE:
                trial.set_user_attr("duplicate_of", t.number)
                return float(t.value)
        if self.prune and source is None and prediction is not None:
            self._maybe_prune(trial, prediction.speedup)
        trial.set_user_attr("plan_key", key)
        trial.set_user_attr(MEASURED, True)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        self._check_claim(trial, key)
        try:
            # warmup=0: the output check just ran the freshly built pipeline once, which is its warm-up
            result = self.pool.run(plan, repeats=self.repeats, warmup=0, timeout_s=self.trial_timeout,
                                   serial_all=False)
        except KeyboardInterrupt:
            trial.set_user_attr(MEASURED, False)  # an interrupted run measured nothing; resume runs it again
            trial.set_user_attr("fail_reason", "interrupted")
            raise
        self.results[trial.number] = result
        for k, v in _result_attrs(result).items():
            trial.set_user_attr(k, v)
        if result.ok and self.artifacts is not None:
            self._upload_timeline(trial, result, plan)
        if not result.ok:
            raise TrialFailed(result.reason)
        return result.speedup

    def _check_claim(self, trial: optuna.Trial, key: str) -> None:
        """Back off when, with other workers on the study, the trial budget is taken or the same plan is
        being measured. The claim (``measured``) is written before the count is read, so of two workers
        racing for the last slot at least one sees the other; ties back off and the loop asks again."""
        if self.budget is None:
            return
        claims = self.claims()
        mine = [t for t in claims if t.number != trial.number]
        same = [t for t in mine if t.state == TrialState.RUNNING and t.user_attrs.get("plan_key") == key]
        why = None
        if len(mine) >= self.budget:
            why = f"the study's {self.budget} trials are measured or being measured by other workers"
        elif same:
            why = f"the same plan is being measured by trial {same[0].number}"
        if why:
            trial.set_user_attr(MEASURED, False)
            trial.set_user_attr("skipped", why)
            raise optuna.TrialPruned(why)

    def others_running(self) -> list[int]:
        """Trials another worker is measuring now (this worker runs one trial at a time, between them none)."""
        return [t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.user_attrs.get(MEASURED)]

    def _upload_timeline(self, trial: optuna.Trial, result: TrialResult, plan: SplitPlan) -> None:
        """The trial's measured timeline as a PNG artifact beside the trial in optuna-dashboard."""
        import tempfile
        from pathlib import Path

        from optuna.artifacts import upload_artifact

        from pipeline.timeline import Timeline, render

        with tempfile.TemporaryDirectory() as tmp:
            path = render(Timeline.from_result(result), Path(tmp) / f"timeline-trial{trial.number}.png",
                          title=f"trial {trial.number}: {plan.describe()} - {result.speedup:.2f}x")
            artifact_id = upload_artifact(artifact_store=self.artifacts, file_path=str(path), study_or_trial=trial,
                                          mimetype="image/png")
        trial.set_user_attr("timeline_artifact", artifact_id)

    def _maybe_prune(self, trial: optuna.Trial, predicted: float) -> None:
        done = [t for t in self.measured_trials() if t.state == optuna.trial.TrialState.COMPLETE
                and t.user_attrs.get("predicted_speedup")]
        if len(done) < PRUNE_AFTER:
            return
        ratio = max(t.value / t.user_attrs["predicted_speedup"] for t in done)
        best = max(t.value for t in done)
        optimistic = predicted * ratio
        if optimistic < PRUNE_MARGIN * best:
            trial.set_user_attr("pruned_by", f"cost model: at best {optimistic:.2f}x vs measured best {best:.2f}x")
            trial.report(optimistic, 0)
            raise optuna.TrialPruned()

    # ---- the loop ----------------------------------------------------------------------------
    def optimize(self, trials: int, *, timeout: float | None = None, started: float | None = None) -> None:
        """Run until the study holds ``trials`` measured trials (a resumed study counts what it has)."""
        from tqdm import tqdm

        started = started or time.monotonic()
        self.budget = trials
        self.fail_stale()
        done = len(self.measured_trials())
        bar = tqdm(total=trials, initial=min(done, trials), desc="trials", unit="trial", disable=not self.progress,
                   dynamic_ncols=True)
        idle = 0
        try:
            while done < trials:
                if timeout is not None and time.monotonic() - started > timeout:
                    break
                if len(self.claims()) >= trials:
                    # other workers are measuring the last trials: wait for them (or for their staleness)
                    time.sleep(CLAIM_POLL_S)
                    self.fail_stale()
                    now = len(self.measured_trials())
                    bar.update(max(0, min(now, trials) - min(done, trials)))
                    done = now
                    continue
                self.study.optimize(self.objective, n_trials=1, catch=(TrialFailed,))
                now = len(self.measured_trials())
                if now > done:
                    bar.update(max(0, min(now, trials) - min(done, trials)))
                    idle = 0
                else:
                    idle += 1
                    if idle >= IDLE_LIMIT:
                        print(f"\nstopping early: the last {IDLE_LIMIT} plans the sampler proposed were already "
                              "measured, out of order, or predicted clearly behind the best")
                        break
                done = now
                best = self.best_measured()
                last = next(t for t in reversed(self.study.trials) if t.state.is_finished())
                if last.state == optuna.trial.TrialState.FAIL and last.user_attrs.get("fail_reason"):
                    bar.write(f"trial {last.number} failed: {last.user_attrs['fail_reason']}")
                bar.set_postfix_str(f"best {best.value:.2f}x" if best else "best -", refresh=False)
                bar.set_description(f"trials (last: {last.user_attrs.get('source', '?')} {last.state.name.lower()})")
        finally:
            bar.close()

    # ---- confirmation ------------------------------------------------------------------------
    def confirm(self, top: int, rounds: int, *, references: bool = False) -> dict[str, Any]:
        """Re-measure the top plans and PiPPy's equal-size plan (with ``references``, every seeded
        reference policy too), interleaved round by round, so that they are compared in one run."""
        ok = sorted((t for t in self.measured_trials() if t.state == optuna.trial.TrialState.COMPLETE),
                    key=lambda t: t.value, reverse=True)
        chosen: list[optuna.trial.FrozenTrial] = []
        seen: set[str] = set()
        for t in ok:
            if len(chosen) < top and t.user_attrs["plan_key"] not in seen:
                chosen.append(t)
                seen.add(t.user_attrs["plan_key"])
        pippy = next((t for t in ok if "pippy-equal-size" in str(t.user_attrs.get("source"))), None)
        if pippy is not None and pippy.user_attrs["plan_key"] not in seen:
            chosen.append(pippy)
            seen.add(pippy.user_attrs["plan_key"])
        if references:
            for t in ok:
                if str(t.user_attrs.get("source", "tpe")) != "tpe" and t.user_attrs["plan_key"] not in seen:
                    chosen.append(t)
                    seen.add(t.user_attrs["plan_key"])
        speedups: dict[int, list[float]] = {t.number: [] for t in chosen}
        last: dict[int, TrialResult] = {}
        from tqdm import tqdm

        steps = [(r, t) for r in range(rounds) for t in chosen]
        for _, t in tqdm(steps, desc="confirming", unit="run", disable=not self.progress or not steps):
            plan = SplitPlan.from_dict(t.user_attrs["plan"])
            res = self.pool.run(plan, repeats=self.repeats, warmup=0, timeout_s=self.trial_timeout, serial_all=True)
            if res.ok:
                speedups[t.number].extend(res.speedups)
                last[t.number] = res
        table = []
        for t in chosen:
            s = speedups[t.number]
            table.append({"trial": t.number, "source": t.user_attrs.get("source"),
                          "split_points": t.user_attrs["split_points"], "chunks": t.user_attrs["chunks"],
                          "search_speedup": t.value, "speedups": s,
                          "median": statistics.median(s) if s else math.nan,
                          "spread": [min(s), max(s)] if s else [math.nan, math.nan],
                          "predicted_speedup": t.user_attrs.get("predicted_speedup"),
                          "predicted_bubble": t.user_attrs.get("predicted_bubble"),
                          "detail": _detail(last.get(t.number))})
        finite = [r for r in table if not math.isnan(r["median"])]
        best = max(finite, key=lambda r: r["median"]) if finite else None
        out = {"rounds": rounds, "repeats_per_run": self.repeats, "plans": table,
               "best_trial": best["trial"] if best else None}
        if best is not None:
            self.results[-1] = last[best["trial"]]
        self.study.set_user_attr("confirmation", out)
        return out


def _detail(result: TrialResult | None) -> dict[str, Any] | None:
    """What a report needs of a confirmation run, kept in the study so that it can be rebuilt later:
    per-stage compute, the serial time, the speedup and the measured timeline."""
    if result is None:
        return None
    from pipeline.timeline import Timeline

    return {"stage_compute_s": list(result.stage_compute_s),
            "serial_s": statistics.median(result.serial_s) if result.serial_s else math.nan,
            "speedup": result.speedup, "plan": result.plan, "timeline": Timeline.from_result(result).to_dict()}


def _result_attrs(result: TrialResult) -> dict[str, Any]:
    if not result.ok:
        return {"fail_reason": result.reason}
    lo, hi = result.speedup_spread
    return {
        "speedup_spread": [lo, hi],
        "serial_s": list(result.serial_s),
        "pipeline_s": list(result.pipeline_s),
        "measured_s": statistics.median(result.pipeline_s),
        "stage_compute_s": list(result.stage_compute_s),
        "stage_comm_s": list(result.stage_comm_s),
        "boundary_bytes": list(result.boundary_bytes),
        "max_abs_diff": result.max_abs_diff,
        "output_check": "ok",
        "trial_wall_s": result.wall_s,
    }
