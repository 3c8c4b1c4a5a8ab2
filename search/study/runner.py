"""The search loop: seed the study, then ask, run the objective and tell until the budget is measured.

The budget is measured trials (``--trials``) and, optionally, timed repeats (``--budget-repeats``),
whichever runs out first. A worker with nothing left to claim (other workers measure the last trials)
waits for them; the loop also stops, before it asks for a trial that could only repeat a plan, when no
seed waits and the study holds a trial of every plan of the space, and (a safety net) after
``IDLE_LIMIT`` proposals in a row that needed no run.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import optuna

from search.plans.recompute import framework_of
from search.plans.seeds import Seed, frameworks_line, layout_seeds, seeds, unseeded_frameworks
from search.plans.space import PlanPoint
from search.study.context import SearchContext
from search.study.objective import Objective, TrialFailed
from search.trials.coordination import (
    claims,
    fail_stale,
    is_seed,
    measured_trials,
    repeats_spent,
    timed_share,
    trial_counts,
    value_of,
)

__all__ = ["IDLE_LIMIT", "exhausted_summary", "run_loop", "seed_count", "seed_study", "trial_repeats"]

CLAIM_POLL_S = 2.0  # how often a worker with nothing left to claim looks at the others' trials
IDLE_LIMIT = 60  # proposals in a row that need no run before the search counts the space as exhausted


def trial_repeats(asked: int, serial_s: float, min_seconds: float, cap: int = 5) -> int:
    """Repeats per trial: at least ``asked``, and enough to time ``min_seconds`` of the serial model.

    A ResNet-50 batch of 8 takes 0.5 s on one core here: two repeats of it left the same plan at 1.13x
    and 1.32x in one interleaved round, so short models are repeated more (at most ``cap`` x asked).
    """
    if min_seconds <= 0 or serial_s <= 0:
        return asked
    return max(asked, min(cap * asked, math.ceil(min_seconds / serial_s)))


CHECK_FIRST_MIN_S = 1.0
"""Serial seconds per batch from which a search trial checks its first timed repeat's output."""


def check_on_first_repeat(serial_s: float) -> bool:
    """Whether a trial may skip the output check's own run and check the first timed repeat instead.

    A fresh stage's first run costs a few milliseconds more than its next ones (first-use set-up in the
    runtime): on DeiT-S (2 s runs) the first repeat / the rest was 0.99 (n=10), on a tiny ViT (10 ms runs)
    1.5 (n=6; ``benchmarks/first_repeat.py``, ``benchmarks/trial_overhead.py``). So a slow model saves a
    whole run per trial, and a fast one, whose check run is cheap, keeps it as its warm-up.
    """
    return serial_s >= CHECK_FIRST_MIN_S


def seed_study(ctx: SearchContext, *, policies: bool = False) -> None:
    """Enqueue PiPPy's plan and the cost model's best two once per study (a resumed study keeps the ones it
    has), and the model's optimum on each layout it prices by its schedule (on each further layout the
    forward model's); ``policies`` adds every reference policy (``search.sweep`` reports them all)."""
    if ctx.study.user_attrs.get("seeded"):
        return
    first = seeds(ctx.profile, ctx.cands, ctx.stages, list(ctx.space.layout_chunks(0)), policies=policies,
                  rules=ctx.peer_rules)
    missing = unseeded_frameworks(ctx.cands, ctx.stages, ctx.peer_rules)
    if missing:
        ctx.study.set_user_attr("frameworks_unseeded", missing)
        if ctx.progress:
            print(frameworks_line(missing))
    lean = tuple(PlanPoint(cuts=ctx.lean_cuts, chunks=m, layout=0) for m in ctx.space.layout_chunks(0)) \
        if ctx.lean_cuts else ()
    for s in apart(ctx, first + layout_seeds(ctx.profile, ctx.space,
                                             lambda k: ctx.schedule_optimum(k, lean if k == 0 else ()))):
        if s.cuts is not None:
            point = ctx.space.from_cuts(s.cuts, s.chunks, s.layout)
            plan = ctx.plan_for_cuts(point.cuts, point.chunks, point.layout, s.source)
        else:
            plan = ctx.plan(s.points or (), s.chunks, source=s.source)
        # a reference predicted over --device-memory is kept as a trial pruned with its prediction (never built),
        # so that the summary and the dashboard say why PiPPy's plan, say, was not measured
        if s.cuts is not None:
            # the same cuts as a framework's plan but with the search's own recomputation: a plan of its own
            ctx.study.enqueue_trial(ctx.space.encode(point), user_attrs={"source": s.source},
                                    skip_if_exists=not framework_of(s.source))
        else:
            ctx.study.enqueue_trial({}, user_attrs={"source": s.source, "fixed_plan": plan.to_dict()},
                                    skip_if_exists=True)
    ctx.study.set_user_attr("seeded", True)


def apart(ctx: SearchContext, seeds: list[Seed]) -> list[Seed]:
    """Seeds as they run: where the search gives a training plan its own recomputation, a plan that both the
    cost model and a framework's rule chose runs twice, as the search would run it and as that framework's
    users would (``search.plans.recompute``), so the settings are compared on the same cuts (and each framework's
    apart from another's that chose the same cuts: Megatron's least N is not DeepSpeed's every layer)."""
    if ctx.mode != "train" or ctx.recompute != "search" or ctx.least_recompute is None:
        return seeds
    out: list[Seed] = []
    for s in seeds:
        names = s.source.split("+")
        theirs = [n for n in names if framework_of(n)]
        ours = [n for n in names if not framework_of(n)]
        if theirs and (ours or len(theirs) > 1):
            out += ([replace(s, source="+".join(ours))] if ours else []) + [replace(s, source=n) for n in theirs]
        else:
            out.append(s)
    return out


def seed_count(study: optuna.Study) -> int:
    """Trials enqueued from the references (run or waiting): a sweep measures all of them."""
    return sum(1 for t in study.get_trials(deepcopy=False) if is_seed(t))


def exhausted_summary(study: optuna.Study) -> str:
    """How the trials of an exhausted space ended, in a few words (``search.trials.coordination.trial_counts``)."""
    c = trial_counts(study)
    parts = [(c["measured"], "measured"), (c["failed"], "failed"), (c["pruned"], "pruned by the cost model"),
             (c["predicted_over"], "predicted over the memory limit")]
    return ", ".join(f"{n} {what}" for n, what in parts if n) or "none measured"


def run_loop(ctx: SearchContext, trials: int, *, timeout: float | None = None, started: float | None = None) -> None:
    """Run until the study holds ``trials`` measured trials (a resumed study counts what it has)."""
    from tqdm import tqdm

    started = started or time.monotonic()
    study = ctx.study
    objective = Objective(ctx)
    fail_stale(study)
    if study.user_attrs.get("unrun_over_memory"):
        study.set_user_attr("unrun_over_memory", 0)  # a resumed study says it again if it still holds
    done = len(measured_trials(study))
    bar = tqdm(total=trials, initial=min(done, trials), desc="trials", unit="trial", disable=not ctx.progress,
               dynamic_ncols=True)

    def advance(now: int) -> None:
        bar.update(max(0, min(now, trials) - min(done, trials)))

    idle = 0
    sampler = study.sampler
    try:
        while done < trials:
            if timeout is not None and time.monotonic() - started > timeout:
                break
            if ctx.budget_repeats is not None and repeats_spent(study) >= ctx.budget_repeats:
                print(f"\nstopping: the study's budget of {ctx.budget_repeats} timed repeats is spent")
                break
            waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
            if getattr(sampler, "exhausted", False) or (
                    not waiting and hasattr(sampler, "untried") and sampler.untried(study) == 0):
                left = sampler.untried(study) if hasattr(sampler, "untried") else 0
                if left and ctx.device_memory is not None:
                    bar.write(f"stopping: nothing left to run, the {left} plans without a trial are predicted over "
                              f"--device-memory ({exhausted_summary(study)})")
                    study.set_user_attr("unrun_over_memory", left)  # the summary's budget line says so
                else:
                    bar.write(f"stopping: nothing left to run, every one of the space's {ctx.space.size} plans has "
                              f"a trial ({exhausted_summary(study)})")
                break
            if len(claims(study)) >= trials:
                # other workers are measuring the last trials: wait for them (or for their staleness)
                time.sleep(CLAIM_POLL_S)
                fail_stale(study)
                now = len(measured_trials(study))
                advance(now)
                done = now
                continue
            study.optimize(objective, n_trials=1, catch=(TrialFailed,))
            now = len(measured_trials(study))
            if now > done:
                advance(now)
                idle = 0
            else:
                idle += 1
                if idle >= IDLE_LIMIT:
                    print(f"\nstopping early: the last {IDLE_LIMIT} plans the sampler proposed needed no run "
                          "(measured before, pruned by the cost model, or skipped)")
                    break
            done = now
            best = ctx.best_measured()
            last = next(t for t in reversed(study.trials) if t.state.is_finished())
            if last.state == optuna.trial.TrialState.FAIL and last.user_attrs.get("fail_reason"):
                bar.write(f"trial {last.number} failed: {last.user_attrs['fail_reason']}")
            share = timed_share(study)
            peaks = last.user_attrs.get("peak_mem_bytes") or []
            mem = (f", last peak {'/'.join(f'{p / 2**30:.2f}' for p in peaks)} GiB"
                   + (f" of {ctx.device_memory / 2**30:.2f}" if ctx.device_memory else "")) if peaks else ""
            bar.set_postfix_str((f"best {ctx.metric.fmt(value_of(best))}" if best else "best -")
                                + f", {repeats_spent(study)} repeats" + mem
                                + (f", {share:.0%} of trial time timing" if share is not None else ""), refresh=False)
            bar.set_description(f"trials (last: {last.user_attrs.get('source', '?')} {last.state.name.lower()})")
    finally:
        bar.close()
