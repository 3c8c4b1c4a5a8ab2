"""search.plans.layouts: the schedules a search covers, parsed and filtered by their rules (pure)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SCHEDULES, schedule_rule
from search.plans.layouts import choose_layouts, parse_per_rank, parse_schedules


def test_all_is_every_schedule_and_a_list_keeps_its_order():
    assert parse_schedules("all") == SCHEDULES
    assert parse_schedules(None) == ("GPipe",)
    assert parse_schedules("1F1B, GPipe,1F1B") == ("1F1B", "GPipe")
    assert parse_per_rank("2,3,2") == (2, 3) and parse_per_rank(None) == ()


@pytest.mark.parametrize("text, message", [("GPipe,Zigzag", "names Zigzag"), (",", "names nothing")])
def test_an_unknown_schedule_is_one_line(text, message):
    with pytest.raises(PipesplitError, match=message):
        parse_schedules(text)


@pytest.mark.parametrize("text", ["two", "0", "2,-1"])
def test_bad_stages_per_rank_is_one_line(text):
    with pytest.raises(PipesplitError, match="--stages-per-rank"):
        parse_per_rank(text)


def test_an_inference_search_leaves_out_the_training_only_schedules_with_their_rule():
    c = choose_layouts(SCHEDULES, (), ranks=2, chunks=(1, 2, 4, 8), segments=14, mode="infer")
    labels = [lay.label for lay in c.layouts]
    assert labels == ["GPipe", "1F1B", "Interleaved1F1B/V2", "LoopedBFS/V2", "InterleavedZeroBubble/V2"]
    assert any("ZBVZeroBubble/V2: schedule ZBVZeroBubble trains only" in why for why in c.skipped)
    assert dict((lay.label, lay.chunks) for lay in c.layouts)["1F1B"] == (2, 4, 8)  # at least one per stage
    train = choose_layouts(SCHEDULES, (), ranks=2, chunks=(1, 2, 4, 8), segments=14, mode="train")
    assert "DualPipeV/V2" in [lay.label for lay in train.layouts]


def test_too_few_segments_or_chunks_is_left_out_and_none_left_is_one_line():
    c = choose_layouts(("GPipe", "Interleaved1F1B"), (2, 4), ranks=2, chunks=(4,), segments=5, mode="infer")
    assert [lay.label for lay in c.layouts] == ["GPipe", "Interleaved1F1B/V2"]
    assert c.skipped == ("Interleaved1F1B/V4: 8 stages need 8 segments, the model has 5",)
    with pytest.raises(PipesplitError, match="no asked schedule fits this search: 1F1B: schedule 1F1B needs"):
        choose_layouts(("1F1B",), (), ranks=4, chunks=(1, 2), segments=10, mode="infer")


@given(st.lists(st.sampled_from(SCHEDULES), min_size=1, unique=True), st.lists(st.integers(1, 4), unique=True),
       st.integers(2, 4), st.lists(st.integers(1, 32), min_size=1, unique=True), st.sampled_from(["infer", "train"]))
def test_every_chosen_layout_runs_every_chunk_count_it_keeps(schedules, per_rank, ranks, chunks, mode):
    try:
        c = choose_layouts(schedules, per_rank, ranks=ranks, chunks=chunks, segments=12, mode=mode)
    except PipesplitError as e:
        assert str(e).startswith("no asked schedule fits")
        return
    for lay in c.layouts:
        assert lay.chunks and all(schedule_rule(lay.schedule, ranks * lay.per_rank, lay.per_rank, m, mode) is None
                                  for m in lay.chunks)
    assert set(c.chunks) <= set(chunks)
