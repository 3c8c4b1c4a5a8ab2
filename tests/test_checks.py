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


def test_a_held_whole_models_own_output_is_what_the_output_is_checked_against(tiny_spec, tmp_path):
    import torch.distributed as dist

    from pipeline.stage.checks import check_output, whole_key

    meta = build_meta_model(tiny_spec)  # two stages on one rank: that rank holds the last stage and the whole model
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2, stages_per_rank=2,
                     schedule="Interleaved1F1B")
    x = example_input(tiny_spec, torch.device("cpu"))
    with torch.no_grad():
        want = whole_model(meta, torch.device("cpu")).eval()(*x)

    def never(*a: object) -> None:
        raise AssertionError("the whole model ran again for the check")

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        state = RankState(0, WorkerConfig(world_size=1, device="cpu", init_method="unused", timeout_s=5))
        state.cached(whole_key(plan), lambda: want)  # as the serial baseline's first run leaves it
        ok = check_output(state, plan, want + 1e-7, None, meta, x, never, whole_on_rank0=True)  # type: ignore[arg-type]
        assert ok.whole_diff == ok.diff <= ok.tolerance and ok.streamed_diff is None
        assert tiny_spec.key not in state.refs  # nothing streamed
        bad = check_output(state, plan, want + 1.0, None, meta, x, never, whole_on_rank0=True)  # type: ignore[arg-type]
        assert bad.diff == bad.whole_diff and bad.diff > bad.tolerance
    finally:
        dist.destroy_process_group()
