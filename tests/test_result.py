import math

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import Breakdown, TrialResult
from pipeline.core.spec import ModelSpec

PLAN = SplitPlan(model=ModelSpec(name="m", batch_size=4), split_points=(SplitPoint("blocks.1"),), chunks=2)


def test_speedup_is_median_of_paired_ratios():
    r = TrialResult(plan=PLAN, ok=True, serial_s=(4.0, 4.4, 4.0), pipeline_s=(2.0, 2.0, 1.0),
                    serial_all_s=(2.0, 2.0, 2.0), wall_s=10.0, busy_s=9.5)
    assert r.speedups == [2.0, 2.2, 4.0]
    assert r.speedup == 2.2
    assert r.speedup_spread == (2.0, 4.0)
    assert r.speedup_all == 1.0
    assert r.overhead_s == 0.5


def test_json_round_trip():
    r = TrialResult(plan=PLAN, ok=True, serial_s=(1.0,), pipeline_s=(0.5,), stage_compute_s=(0.2, 0.3),
                    breakdown=Breakdown(build_s=1.0, check_s=0.5, timed_s=2.0, driver_s=0.1),
                    stage_comm_s=(0.1, 0.0), boundary_bytes=(100,), peak_mem_bytes=(1, 2),
                    events=(((0, 0.0, 0.1),), ((0, 0.1, 0.2),)), max_abs_diff=1e-7, tolerance=1e-4)
    again = TrialResult.from_dict(r.to_dict())
    assert again == r
    assert r.to_dict()["speedup"] == 2.0


def test_failed_result_has_reason_and_no_speedup():
    r = TrialResult.failed(PLAN, "rank 1 died")
    assert not r.ok and r.reason == "rank 1 died"
    assert math.isnan(r.speedup)


def test_merged_joins_repeats_and_keeps_the_first_build():
    from pipeline.core.plan import SplitPlan, SplitPoint
    from pipeline.core.result import TrialResult, merged
    from pipeline.core.spec import ModelSpec

    plan = SplitPlan(model=ModelSpec(name="m", batch_size=4), split_points=(SplitPoint("b.1"),), chunks=2)
    a = TrialResult(plan=plan, ok=True, serial_s=(2.0,), pipeline_s=(1.0,), stage_compute_s=(0.4, 0.6),
                    stage_comm_s=(0.1, 0.1), peak_mem_bytes=(5, 6), build_s=2.0, wall_s=3.0, busy_s=2.5)
    b = TrialResult(plan=plan, ok=True, serial_s=(2.0, 2.0), pipeline_s=(0.8, 0.9), stage_compute_s=(0.5, 0.5),
                    stage_comm_s=(0.2, 0.2), peak_mem_bytes=(7, 4), build_s=0.01, wall_s=1.0, busy_s=0.9)
    m = merged([a, b])
    assert m.pipeline_s == (1.0, 0.8, 0.9) and m.serial_s == (2.0, 2.0, 2.0) and m.build_s == 2.0
    assert m.wall_s == 4.0 and m.peak_mem_bytes == (7, 6) and m.stage_compute_s == (0.5, 0.5)
    assert merged([a, TrialResult.failed(plan, "boom")]).reason == "boom"


def test_breakdown_adds_up_and_sums_over_a_race():
    a = Breakdown(build_s=2.0, check_s=1.0, warmup_s=0.5, timed_s=6.0, other_s=0.1, driver_s=0.4)
    assert a.total_s == 10.0 and a.fixed_s == 4.0 and a.timed_share == 0.6
    b = Breakdown(timed_s=3.0, driver_s=0.1)
    both = a.plus(b)
    assert both.timed_s == 9.0 and both.build_s == 2.0 and abs(both.total_s - 13.1) < 1e-12
    assert "timed 6.00s (60%)" in a.describe()
    r1 = TrialResult(plan=PLAN, ok=True, serial_s=(2.0,), pipeline_s=(1.0,), breakdown=a, wall_s=10.0, busy_s=9.6)
    r2 = TrialResult(plan=PLAN, ok=True, serial_s=(2.0,), pipeline_s=(1.0,), breakdown=b, wall_s=3.1, busy_s=3.0)
    from pipeline.core.result import merged

    assert merged([r1, r2]).breakdown == both
