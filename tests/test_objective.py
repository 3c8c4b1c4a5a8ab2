"""Pieces of a search trial that need no study: a result's trial attributes."""

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec
from search.study.objective import result_attrs
from search.trials.metric import Metric

SPEC = ModelSpec(name="m", batch_size=4)


def test_trial_attributes_are_a_subset_of_the_result_shape():
    plan = SplitPlan(model=SPEC, split_points=(SplitPoint("b.1"),), chunks=2)
    ok = TrialResult(plan=plan, ok=True, serial_s=(2.0,), pipeline_s=(1.0,), stage_compute_s=(0.5, 0.5),
                     stage_comm_s=(0.1, 0.1), boundary_bytes=(8,), peak_mem_bytes=(1, 2), wall_s=3.0)
    attrs = result_attrs(ok, Metric(name="speedup", batch=4))
    assert attrs["pipeline_s"] == [1.0] and attrs["measured_s"] == 1.0 and attrs["output_check"] == "ok"
    assert set(attrs) - {"measured_s", "output_check", "trial_wall_s", "speedups", "value", "repeat_values"} \
        <= set(ok.measured())
    assert attrs["value"] == 2.0 and attrs["repeat_values"] == [2.0]
    assert result_attrs(TrialResult.failed(plan, "boom"), Metric(name="speedup", batch=4)) == {"fail_reason": "boom"}


def test_a_throughput_trial_keeps_no_speedup_where_no_serial_model_was_timed():
    plan = SplitPlan(model=SPEC, split_points=(SplitPoint("b.1"),), chunks=2)
    alone = TrialResult(plan=plan, ok=True, pipeline_s=(2.0, 1.0, 4.0), stage_compute_s=(0.5, 0.5),
                        stage_comm_s=(0.1, 0.1), boundary_bytes=(8,), peak_mem_bytes=(1, 2), wall_s=3.0)
    attrs = result_attrs(alone, Metric(name="throughput", batch=4))
    assert "speedup" not in attrs and attrs["value"] == 2.0 and attrs["repeat_values"] == [2.0, 4.0, 1.0]
    assert attrs["throughput"] == 2.0 and attrs["throughput_spread"] == [1.0, 4.0]
