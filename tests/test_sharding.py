"""pipeline.core.sharding: where each process of a (pp, dp_shard) mesh sits, and what a sharded plan needs."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.sharding import MESH_ORDERS, dp_rank_of, pp_rank_of
from pipeline.core.spec import ModelSpec

SPEC = ModelSpec(name="m", batch_size=8, input_shape=(3, 32, 32))


@given(st.integers(1, 8), st.integers(1, 8), st.sampled_from(MESH_ORDERS))
def test_every_process_has_one_place_on_the_mesh_and_every_place_one_process(ranks, dp_shard, order):
    places = {(pp_rank_of(p, ranks, dp_shard, order), dp_rank_of(p, ranks, dp_shard, order))
              for p in range(ranks * dp_shard)}
    assert places == {(r, d) for r in range(ranks) for d in range(dp_shard)}


def test_torchtitans_order_keeps_a_stages_replicas_together_and_the_other_a_replicas_pipeline():
    assert [pp_rank_of(p, 2, 2) for p in range(4)] == [0, 0, 1, 1]  # pp outermost: FSDP groups {0,1} and {2,3}
    assert [pp_rank_of(p, 2, 2, "dp_shard,pp") for p in range(4)] == [0, 1, 0, 1]  # pipelines {0,1} and {2,3}
    plan = SplitPlan(model=SPEC, split_points=(SplitPoint("b.2"),), chunks=2, mode="train", dp_shard=2,
                     mesh_order="dp_shard,pp")
    assert [plan.pp_rank(p) for p in range(plan.world)] == [0, 1, 0, 1] and "dp_shard,pp" in plan.describe()
    assert SplitPlan.from_dict(plan.to_dict()) == plan
    assert "mesh_order" not in SplitPlan(model=SPEC, split_points=(SplitPoint("b.2"),), chunks=2, mode="train",
                                         dp_shard=2).to_dict()


@pytest.mark.parametrize("change, message", [
    ({"mesh_order": "dp,pp"}, "--mesh-order 'dp,pp' is not a mesh this runs: use pp,dp_shard or dp_shard,pp"),
    ({"dp_shard": 0}, "--dp-shard must be a positive integer (got 0)"),
    ({"chunks": 8}, "batch size 8 does not split into 2 replicas x 8 chunks"),
    ({"mode": "infer"}, "forward-only runs are not sharded here: use --mode train, or --dp-shard 1"),
    ({"backend": "pippy", "mode": "infer"}, "runs on the torch backend"),
])
def test_a_plan_the_mesh_cannot_run_is_one_line(change, message):
    args = {"model": SPEC, "split_points": (SplitPoint("b.2"),), "chunks": 2, "mode": "train", "dp_shard": 2}
    with pytest.raises(PipesplitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SplitPlan(**{**args, **change})
