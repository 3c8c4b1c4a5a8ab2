import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.plan import choose_chunks
from search.space import cut_ranges, decode, encode, violation


def test_each_cut_has_its_own_fixed_range():
    assert cut_ranges(7, 2) == [(1, 6)]
    assert cut_ranges(7, 4) == [(1, 4), (2, 5), (3, 6)]
    with pytest.raises(ValueError, match="8 stages need at least 8 segments, the model has 7"):
        cut_ranges(7, 8)


@given(st.integers(2, 30), st.data())
def test_every_increasing_cut_set_lies_inside_the_ranges(n, data):
    stages = data.draw(st.integers(2, n))
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=stages - 1, max_size=stages - 1)))
    assert all(lo <= c <= hi for c, (lo, hi) in zip(cuts, cut_ranges(n, stages)))
    assert violation(cuts) == 0


def test_violation_measures_how_unordered():
    assert violation([3, 3]) == 1
    assert violation([5, 2, 2]) == 4 + 1


def test_round_trip_and_chunks():
    assert decode(encode([2, 5], 8), 3) == ([2, 5], 8)
    assert choose_chunks(None, 32, [1, 3, 4, 4, 64, 32]) == [1, 4, 32]  # defaults that do not divide are dropped
