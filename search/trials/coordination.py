"""Several workers on one study: which trials count, who is measuring what, and stale claims.

A worker claims a trial (the ``measured`` user attribute) before it measures it, so the study's budget
of measured trials is shared by every worker on it. A trial left RUNNING by a dead worker is failed as
stale: on RDB storage by Optuna's heartbeats, on a journal file by the next worker on the same host.
"""

from __future__ import annotations

import os
import socket
import warnings

import optuna
from optuna.trial import FrozenTrial, TrialState

from pipeline.core.result import Breakdown

__all__ = ["MEASURED", "SAMPLER", "value_of", "claims", "fail_stale", "is_seed", "measured_trials", "others_running",
           "repeats_spent", "skip_reason", "timed_share", "trial_counts", "worker_id", "failed_trials"]

MEASURED = "measured"
SAMPLER = "sampler"
"""The ``source`` of a trial the search's sampler proposed (the seeds carry their policies' names)."""


def is_seed(t: FrozenTrial) -> bool:
    """An enqueued reference (cost-model optimum, a policy, PiPPy), not one of the sampler's proposals."""
    return str(t.user_attrs.get("source", SAMPLER)) not in (SAMPLER, "tpe")


def worker_id() -> str:
    """This worker as ``host:pid``, as stored on the trials it measures."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def value_of(t: FrozenTrial) -> float | None:
    """A trial's measured figure (speedup or throughput, the study's metric): its first objective value (the
    second, with ``--objectives <figure>,memory``, is its largest stage's peak memory); None while it has none."""
    return float(t.values[0]) if t.values else None


def measured_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that ran a plan: complete, raced out (pruned after some repeats), over the memory limit, or failed with a reason (a
    stale trial, whose worker died, has none and is not counted)."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL,
                                                                 TrialState.PRUNED))
            if t.user_attrs.get(MEASURED) and (t.state == TrialState.COMPLETE or t.user_attrs.get("fail_reason")
                                               or t.user_attrs.get("raced_out") or t.user_attrs.get("over_memory"))]


def repeats_spent(study: optuna.Study) -> int:
    """Timed pipeline repeats over the study's measured trials (what ``--budget-repeats`` counts)."""
    return sum(int(t.user_attrs.get("repeats", 0)) for t in measured_trials(study))


def timed_share(study: optuna.Study) -> float | None:
    """The share of the measured trials' wall time spent in timed repeats (the rest is each trial's fixed
    cost: build, output check, warm-up, the driver), or None before any trial has a breakdown."""
    parts = [Breakdown(**t.user_attrs["breakdown"]) for t in measured_trials(study)
             if isinstance(t.user_attrs.get("breakdown"), dict)]
    total = Breakdown.summed(parts)
    return total.timed_share if total.total_s > 0 else None


def _running_claims(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.user_attrs.get(MEASURED)]


def claims(study: optuna.Study) -> list[FrozenTrial]:
    """Measured trials plus those being measured now, by this or another worker on the same study."""
    return measured_trials(study) + _running_claims(study)


def others_running(study: optuna.Study) -> list[int]:
    """Trials another worker is measuring now (this worker runs one trial at a time, between them none)."""
    return [t.number for t in _running_claims(study)]


def fail_stale(study: optuna.Study) -> list[int]:
    """Fail trials left RUNNING by a dead worker on this host (journal storage has no heartbeats; RDB
    storage also fails them by heartbeat, from any host). Returns their numbers."""
    from optuna.storages import fail_stale_trials
    from optuna.storages._heartbeat import is_heartbeat_enabled

    storage = study._storage
    if is_heartbeat_enabled(storage):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since 2.9 in practice
            fail_stale_trials(study)
    host = socket.gethostname()
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        name, _, pid = str(t.user_attrs.get("worker", "")).rpartition(":")
        if name != host or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            storage.set_trial_user_attr(t._trial_id, "stale", f"worker {name}:{pid} died while measuring it")
            storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            out.append(t.number)
        except (RuntimeError, ValueError):  # another worker got there first
            pass
    return out


def skip_reason(study: optuna.Study, number: int, key: str, budget: int | None) -> str | None:
    """Why trial ``number`` (already claimed) should back off, or None: with other workers on the study,
    the budget is taken or the same plan is being measured. The claim is written before the count is
    read, so of two workers racing for the last slot at least one sees the other; ties back off and
    the loop asks again."""
    if budget is None:
        return None
    mine = [t for t in claims(study) if t.number != number]
    # running, or finished since this worker looked for a duplicate (its check and its claim are not atomic)
    same = [t for t in mine if t.state in (TrialState.RUNNING, TrialState.COMPLETE) and t.user_attrs.get("plan_key") == key]
    if len(mine) >= budget:
        return f"the study's {budget} trials are measured or being measured by other workers"
    if same:
        return f"the same plan is {'being ' if same[0].state == TrialState.RUNNING else ''}measured by trial {same[0].number}"
    return None


def failed_trials(study: optuna.Study) -> list[tuple[int, str]]:
    """(number, reason) of each trial that ran a plan and failed: named apart from the measured ones."""
    return [(t.number, str(t.user_attrs["fail_reason"])) for t in measured_trials(study)
            if t.state == TrialState.FAIL and t.user_attrs.get("fail_reason")]


def trial_counts(study: optuna.Study) -> dict[str, int]:
    """How the study's trials ended: measured (by seeds and by the sampler; raced out among them), failed (ran
    and broke: a dead rank, a wrong output), pruned, infeasible, repeated; the timed repeats spent; the
    space's size."""
    out = {"stored": 0, "measured": 0, "failed": 0, "seeds": 0, "raced_out": 0, "repeats": 0, "pruned": 0,
           "infeasible": 0,
           "over_memory": 0, "predicted_over": 0, "duplicates": 0, "skipped": 0,
           "space": int(study.user_attrs.get("space_size") or 0)}
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        out["stored"] += 1
        if a.get(MEASURED) and t.state == TrialState.FAIL and a.get("fail_reason"):
            out["failed"] += 1
        elif a.get(MEASURED):
            out["measured"] += 1
            out["seeds"] += is_seed(t)
            out["raced_out"] += bool(a.get("raced_out"))
            out["over_memory"] += bool(a.get("over_memory"))
            out["repeats"] += int(a.get("repeats", 0))
        elif a.get("pruned_by"):
            out["pruned"] += 1
        elif a.get("over_memory"):
            out["predicted_over"] += 1
        elif a.get("infeasible"):
            out["infeasible"] += 1
        elif "duplicate_of" in a:
            out["duplicates"] += 1
        elif a.get("skipped"):
            out["skipped"] += 1
    return out
