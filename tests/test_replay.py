"""costmodel.replay: a schedule's own per-rank action order replayed over stage times (pure)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costmodel.replay import StageTimes, parse_action, replay

ONE_F_ONE_B = [["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"],
               ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]]
"""What torch 2.14's Schedule1F1B ran at 2 ranks x 4 microbatches (tests/test_training.py records it)."""


def test_gpipe_fills_then_drains():
    t = [StageTimes(forward=1, backward=2)] * 2
    r = replay([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]], t)
    # rank 1: F0 1-2, F1 2-3, B0 3-5, B1 5-7; rank 0's backwards wait for them: B0 5-7, B1 7-9
    assert r.makespan == 9 and r.busy == (6, 6)


def test_the_recorded_1f1b_order_takes_fill_plus_drain():
    r = replay(ONE_F_ONE_B, [StageTimes(forward=1, backward=2)] * 2)
    assert r.makespan == pytest.approx((4 + 2 - 1) * 3)  # (M + S - 1) x (F + B) at equal stages
    assert r.bubble_fraction == pytest.approx(1 - 12 / 15)


def test_a_zero_bubble_split_backward_and_links_each_way():
    t = [StageTimes(forward=1, input_grad=1, weight_grad=1, link_forward=0.5, link_backward=0.25),
         StageTimes(forward=1, input_grad=1, weight_grad=1)]
    r = replay([["0F0", "0I0", "0W0"], ["1F0", "1I0", "1W0"]], t)
    # rank 1: F 1.5-2.5, I 2.5-3.5, W 3.5-4.5; rank 0's I waits for the gradient: 3.75-4.75, then W
    assert r.makespan == pytest.approx(5.75)


def test_two_virtual_stages_per_rank_shrink_the_fill():
    halves = [StageTimes(forward=1)] * 4
    inter = replay([["0F0", "0F1", "2F0", "2F1"], ["1F0", "1F1", "3F0", "3F1"]], halves)
    whole = replay([["0F0", "0F1"], ["1F0", "1F1"]], [StageTimes(forward=2)] * 2)
    assert (inter.makespan, whole.makespan) == (5, 6)


def test_an_order_that_waits_on_itself_is_one_line():
    with pytest.raises(ValueError, match="deadlock: rank 0: 0B0"):
        replay([["0B0", "0F0"], ["1F0", "1B0"]], [StageTimes(forward=1, backward=1)] * 2)
    with pytest.raises(ValueError, match="is not <stage><F\\|B\\|I\\|W><microbatch>"):
        parse_action("forward0")


@given(st.integers(1, 8), st.floats(0.1, 3), st.floats(0.1, 3), st.floats(0, 1))
def test_gpipe_is_never_faster_than_the_busiest_rank_nor_slower_than_running_it_serially(m, f, b, link):
    order = [[f"{s}F{i}" for i in range(m)] + [f"{s}B{i}" for i in range(m)] for s in range(2)]
    t = [StageTimes(forward=f, backward=b, link_forward=link, link_backward=link)] * 2
    r = replay(order, t)
    assert r.makespan >= m * (f + b) - 1e-9
    assert r.makespan <= 2 * m * (f + b) + 2 * m * link + 1e-9
