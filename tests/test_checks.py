"""pipeline.stage.checks: the reference a trial checks against, streamed one block at a time (no process group)."""

import torch
from torch._subclasses.fake_tensor import is_fake

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.batch import example_input
from pipeline.models.build import build_meta_model
from pipeline.models.weights import whole_model
from pipeline.stage.checks import finest_split, reference_first
from pipeline.stage.rank import RankState, WorkerConfig


def test_the_last_rank_makes_the_reference_block_by_block_before_its_own_stage(tiny_spec):
    meta = build_meta_model(tiny_spec)
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2)
    x = example_input(tiny_spec, torch.device("cpu"))
    fine = finest_split(plan, meta, x, torch.device("cpu"))
    assert fine is not None and len(list(fine.children())) > plan.stages  # one piece per candidate block
    assert all(is_fake(p) or p.is_meta for p in fine.parameters())  # the split itself holds no storage
    state = RankState(1, WorkerConfig(world_size=2, device="cpu", init_method="tcp://127.0.0.1:1", timeout_s=1))
    reference_first(state, plan, meta, x)
    with torch.no_grad():
        want = whole_model(meta, torch.device("cpu")).eval()(*x)
    assert torch.allclose(state.refs[tiny_spec.key], want, atol=1e-5)
