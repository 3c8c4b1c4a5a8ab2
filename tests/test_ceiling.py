"""One wording and one rule for a speedup above the machine's ceiling, wherever it is printed."""

from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.ceiling import above_ceiling


def test_a_speedup_past_the_ceiling_is_noise_and_one_at_or_below_it_is_not():
    assert above_ceiling(2.06, 2.0) == "above the 2.00x ceiling: noise"
    assert above_ceiling(2.0, 2.0) == "" and above_ceiling(1.9, 2.0) == ""


def test_no_ceiling_or_no_figure_flags_nothing():
    assert above_ceiling(3.0, None) == "" and above_ceiling(3.0, 0) == ""
    assert above_ceiling(None, 2.0) == "" and above_ceiling("-", 2.0) == "" and above_ceiling(True, 0.5) == ""


@given(st.floats(0.01, 100), st.floats(0.01, 100))
def test_the_flag_says_the_ceiling_and_appears_exactly_above_it(value, ceiling):
    flag = above_ceiling(value, ceiling)
    assert bool(flag) == (value > ceiling)
    assert not flag or f"{ceiling:.2f}x" in flag
