"""The output reference relayed by the ranks: which segment runs where, and that it equals the whole model's."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.stage.relay import piece_owners


def test_a_piece_stays_where_it_is_until_another_rank_holds_it():
    T, F = True, False
    # 2 ranks, 5 pieces: rank 0 holds the first two, rank 1 the last two; piece 2 has no tensors (both can)
    assert piece_owners([[T, T, T, F, F], [F, F, T, T, T]], first=0) == [0, 0, 0, 1, 1]
    # a tied weight's piece both hold stays with the rank before it; a piece nobody holds stays there too
    assert piece_owners([[T, F, T], [T, T, T]], first=0) == [0, 1, 1]
    assert piece_owners([[T, F, F], [F, F, T]], first=0) == [0, 0, 1]
    assert piece_owners([], first=0) == []


@given(st.integers(1, 4), st.integers(1, 12), st.data())
def test_every_piece_goes_to_a_rank_that_holds_it_where_one_does(ranks, pieces, data):
    can = [[data.draw(st.booleans()) for _ in range(pieces)] for _ in range(ranks)]
    first = data.draw(st.integers(0, ranks - 1))
    owners = piece_owners(can, first)
    assert len(owners) == pieces and all(0 <= r < ranks for r in owners)
    for j, r in enumerate(owners):
        if any(can[k][j] for k in range(ranks)):
            assert can[r][j]
        before = owners[j - 1] if j else first
        if can[before][j]:
            assert r == before  # no hand-over where the rank before can go on


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


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_plan_cut_inside_a_block_is_relayed_too(pool2, tiny_spec):
    spec = dataclasses.replace(tiny_spec, seed=29)
    plan = SplitPlan(model=spec, split_points=(SplitPoint("blocks.1.mlp"),), chunks=2)  # PiPPy-like: inside a block
    r = pool2.run(plan, repeats=1, warmup=0, serial=False, serial_all=False, check_first_repeat=True)
    assert r.ok, r.reason
    assert r.check.made_by == "relayed" and r.check.diff <= r.check.tolerance
