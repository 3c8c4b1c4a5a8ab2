"""Replies to one TrialResult (pure): lost ranks, errors, and the clocks of ranks on one host."""

import math

import pytest

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.spec import ModelSpec
from pipeline.ranks.pooling import RunsTrials, check_trial_args, link_samples, result_from_replies
from pipeline.stage.messages import ErrorReply, LinkReply, Lost, TrialOptions, TrialReply

PLAN = SplitPlan(model=ModelSpec(name="m", batch_size=4), split_points=(SplitPoint("b.1"),), chunks=2)


def reply(rank, t0, **kw):
    base = dict(rank=rank, build_s=1.0 + rank, out_bytes=100 if rank == 0 else 0, max_abs_diff=1e-7, tolerance=1e-4,
                serial_s=(2.0, 2.2) if rank == 0 else (math.nan, math.nan), serial_all_s=(), pipeline_s=(1.0, 1.1),
                compute_s=(0.8, 0.9), comm_s=(0.1, 0.3), events=((0, 0.0, 0.4), (1, 0.4, 0.8)),
                comm_events=(("send", 0.4, 0.41),), t0=t0, host="h", peak_mem_bytes=10 + rank, busy_s=3.0)
    base.update(kw)
    return TrialReply(**base)


def test_replies_make_one_result_on_one_clock():
    r, broken = result_from_replies(PLAN, [reply(0, 100.0), reply(1, 100.5)], wall=4.0)
    assert not broken and r.ok and r.plan == PLAN
    assert r.speedups == [2.0, 2.0] and r.boundary_bytes == (100,) and r.peak_mem_bytes == (10, 11)
    assert r.stage_compute_s == pytest.approx((0.85, 0.85)) and r.stage_comm_s == pytest.approx((0.2, 0.2))
    assert r.build_s == 2.0
    assert r.events[1][0] == (0, 0.5, 0.9)  # rank 1 started 0.5 s later on the same host's clock


def test_a_lost_rank_breaks_the_group_and_a_failing_rank_explains_it():
    r, broken = result_from_replies(PLAN, [ErrorReply(rank=0, error="rank 0 failed mid-trial: boom", fatal=True),
                                           Lost(rank=1, why="rank 1 did not answer", dead=False)], wall=1.0)
    assert broken and not r.ok and r.reason == "rank 0 failed mid-trial: boom; rank 1 did not answer"
    r, broken = result_from_replies(PLAN, [ErrorReply(rank=0, error="output check failed"),
                                           ErrorReply(rank=1, error="output check failed", max_abs_diff=3.0)], 1.0)
    assert not broken and r.reason == "output check failed" and r.max_abs_diff == 3.0
    r, broken = result_from_replies(PLAN, [ErrorReply(rank=0, error="rank 0 failed mid-trial: connection reset", fatal=True),
                                           Lost(rank=1, why="stage worker rank 1 (pid 7) died (signal 9)", dead=True)], 1.0)
    assert broken and r.reason == "stage worker rank 1 (pid 7) died (signal 9) (the other 1 rank(s) failed with it)"


def test_checks_and_link_samples():
    with pytest.raises(PipesplitError, match="plan runs on 2 ranks but the pool has 3"):
        check_trial_args(PLAN, 3, "cpu", TrialOptions())
    with pytest.raises(PipesplitError, match="repeats must be >= 1"):
        check_trial_args(PLAN, 2, "cpu", TrialOptions(repeats=0))
    assert link_samples([LinkReply(rank=0, samples=((4, 1e-5),)), LinkReply(rank=1)]) == [(4, 1e-5)]


class _Recorder(RunsTrials):
    stages, device = 2, "cpu"

    def _run_trial(self, plan, opts, timeout_s):
        self.sent = (plan, opts, timeout_s)
        return "ran"


def test_both_pools_run_takes_the_options_once_and_refuses_bad_ones_before_sending():
    pool = _Recorder()
    assert pool.run(PLAN, repeats=5, keep=True, timeout_s=30.0) == "ran"
    assert pool.sent == (PLAN, TrialOptions(repeats=5, keep=True), 30.0)
    with pytest.raises(PipesplitError, match="repeats must be >= 1"):
        _Recorder().run(PLAN, repeats=0)
    assert not hasattr(_Recorder(), "sent")
