import math

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
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
                    stage_comm_s=(0.1, 0.0), boundary_bytes=(100,), peak_mem_bytes=(1, 2),
                    events=(((0, 0.0, 0.1),), ((0, 0.1, 0.2),)), max_abs_diff=1e-7, tolerance=1e-4)
    again = TrialResult.from_dict(r.to_dict())
    assert again == r
    assert r.to_dict()["speedup"] == 2.0


def test_failed_result_has_reason_and_no_speedup():
    r = TrialResult.failed(PLAN, "rank 1 died")
    assert not r.ok and r.reason == "rank 1 died"
    assert math.isnan(r.speedup)
