"""pipeline.export: a best_split.json-shaped document keeps every contract key and reads back as a plan."""

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec
from pipeline.export import document, provenance


def test_document_has_the_contract_keys_and_is_a_plan_again():
    plan = SplitPlan(model=ModelSpec(name="m", batch_size=4), split_points=(SplitPoint("b.1"),), chunks=2)
    res = TrialResult(plan=plan, ok=True, serial_s=(2.0,), pipeline_s=(1.0,), serial_all_s=(1.5,))
    doc = document(plan, res, predicted={"speedup": 1.9}, command="test")
    for key in ("version", "model", "stages", "split_points", "chunks", "backend", "schedule", "device",
                "threads_per_stage", "measured", "predicted", "provenance"):
        assert key in doc
    for key in ("speedup", "speedup_spread", "serial_s", "pipeline_s", "stage_compute_s", "stage_comm_s",
                "boundary_bytes", "max_abs_diff", "speedup_all_threads", "serial_all_threads_s"):
        assert key in doc["measured"]
    assert doc["measured"]["speedup"] == 2.0 and doc["provenance"]["command"] == "test"
    assert SplitPlan.from_dict(doc) == plan
    assert {"host", "cpu", "torch", "date"} <= set(provenance())
