"""The output reference relayed by the ranks: which segment runs where, and that it equals the whole model's."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.stage.relay import segment_stages


def test_segments_go_to_the_stage_the_plan_cuts_open():
    cuts = ["b1", "b2", "b3", "b4"]  # five segments: b0 (and the stem), b1, b2, b3, b4 (and the head)
    assert segment_stages(cuts, ["b2"]) == [0, 0, 1, 1, 1]
    assert segment_stages(cuts, ["b1", "b4"]) == [0, 1, 1, 1, 2]
    assert segment_stages(cuts, []) == [0] * 5
    assert segment_stages(cuts, ["b2.attn"]) is None  # a finer cut than the finest split's: streamed instead
    assert segment_stages(cuts, ["b3", "b1"]) is None  # out of the model's order
    assert segment_stages(cuts, ["b2", "b2"]) is None


@given(st.integers(1, 12), st.data())
def test_every_stage_gets_its_segments_in_order(n, data):
    cuts = [f"blocks.{i}" for i in range(1, n + 1)]
    chosen = sorted(data.draw(st.sets(st.integers(1, n), max_size=n)))
    stages = segment_stages(cuts, [f"blocks.{i}" for i in chosen])
    assert stages is not None and len(stages) == n + 1 and stages[0] == 0 and stages[-1] == len(chosen)
    assert all(b - a in (0, 1) for a, b in zip(stages, stages[1:]))  # never back, never a stage skipped
    assert [j for j in range(1, n + 1) if stages[j] != stages[j - 1]] == chosen  # a stage opens at each cut


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fresh_ranks_relay_a_reference_equal_to_the_whole_models_and_later_plans_check_against_it(pool2, tiny_spec,
                                                                                                   tmp_path):
    import torch

    from pipeline.models.batch import example_input
    from pipeline.models.build import build_meta_model
    from pipeline.models.weights import whole_model
    from pipeline.ranks.pooling import references_in
    from pipeline.stage import refstore
    from pipeline.stage.rank import OUTPUT

    spec = dataclasses.replace(tiny_spec, seed=23)  # a model no rank of the session's pool holds tensors of
    plans = [SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=2) for cut in ("blocks.2", "blocks.1")]
    run = dict(repeats=1, warmup=0, serial=False, serial_all=False)  # no rank holds the whole model
    with references_in(pool2, str(tmp_path)):
        first, second = pool2.run(plans[0], **run), pool2.run(plans[1], **run)
    assert first.ok and second.ok, (first.reason, second.reason)
    assert (first.check.reference_made, first.check.made_by) == (True, "relayed")
    assert (second.check.reference_made, second.check.made_by) == (False, None)  # the same reference, not made again
    assert all(r.check.streamed_diff == r.check.diff <= r.check.tolerance for r in (first, second))
    # the relayed reference, as the study's file keeps it, is the whole eager model's output
    assert len(list(tmp_path.glob("*.pt"))) == 1
    stored = refstore.load(str(tmp_path), refstore.reference_key(spec.key, "output", "cpu", checkpoint=spec.checkpoint))
    assert stored is not None
    meta = build_meta_model(spec)
    with torch.no_grad():
        want = whole_model(meta, torch.device("cpu")).eval()(*example_input(spec))
    torch.testing.assert_close(stored.tensors[OUTPUT], want, rtol=1e-4, atol=1e-5)
