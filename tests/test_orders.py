"""pipeline.stage.orders: each schedule's per-rank action order, from torch's own schedule classes."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.plan import SCHEDULES, schedule_rule
from pipeline.stage.orders import normalised, schedule_order
from tests.test_replay import ONE_F_ONE_B


def test_1f1b_is_the_textbook_order_at_2_ranks_x_4_microbatches():
    got = schedule_order("1F1B", 2, 1, 4, train=True)
    assert got is not None and [list(r) for r in got.actions] == ONE_F_ONE_B


def test_forward_only_keeps_the_forwards_in_the_schedules_order():
    got = schedule_order("Interleaved1F1B", 2, 2, 4, train=False)
    assert got is not None
    assert got.actions[0] == ("0F0", "0F1", "2F0", "2F1", "0F2", "0F3", "2F2", "2F3")


def test_a_zero_bubble_order_splits_backwards_and_dualpipev_mixes_both():
    zb = schedule_order("ZBVZeroBubble", 2, 2, 4, train=True)
    dual = schedule_order("DualPipeV", 2, 2, 4, train=True)
    assert zb is not None and dual is not None
    assert {a[1] for r in zb.actions for a in r} == {"F", "I", "W"}
    assert {a[1] for r in dual.actions for a in r} == {"F", "B", "I", "W"}  # overlapped pairs unpacked


def test_ids_listed_from_one_are_renumbered_and_gaps_refused():
    assert normalised([["0F1", "0F2"]], stages=1, chunks=2, train=False) == (("0F0", "0F1"),)
    assert normalised([["0F0"]], stages=1, chunks=2, train=False) is None  # microbatch 1 never runs
    assert normalised([["0F0", "0F1", "0B0"]], stages=1, chunks=2, train=True) is None  # no backward of 1
    assert normalised([["0F0", "0I0"]], stages=1, chunks=1, train=True) is None  # input grad without weight grad


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SCHEDULES), st.integers(2, 4), st.integers(1, 3), st.integers(1, 12), st.booleans())
def test_every_order_torch_gives_runs_each_microbatch_once_per_stage(schedule, ranks, per_rank, chunks, train):
    mode = "train" if train else "infer"
    got = schedule_order(schedule, ranks, per_rank, chunks, train=train)
    if schedule_rule(schedule, ranks * per_rank, per_rank, chunks, mode) is not None:
        return  # the runtime refuses it before it runs; what torch says of it does not matter
    if got is None:
        return  # this shape is priced from a measured run's order instead (normalised refused torch's)
    assert len(got.actions) == ranks
    assert sum("F" in a for r in got.actions for a in r) == ranks * per_rank * chunks
