"""search.study.context: what a study's trials share; the plan key needs no study."""

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.spec import ModelSpec
from search.study.context import plan_key

SPEC = ModelSpec(name="m", batch_size=4)


def test_plans_differing_only_in_chunks_have_different_keys():
    a = SplitPlan(model=SPEC, split_points=(SplitPoint("b.1"),), chunks=2)
    b = SplitPlan(model=SPEC, split_points=(SplitPoint("b.1"),), chunks=4)
    assert plan_key(a) != plan_key(b) and plan_key(a) == plan_key(SplitPlan.from_dict(a.to_dict()))
