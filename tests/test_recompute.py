"""pipeline.core.recompute: what --recompute says, and the least recomputation that fits (pure)."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.errors import PipesplitError
from pipeline.core.recompute import counts_for, describe, least_counts, normal, parse_recompute, to_json


@pytest.mark.parametrize("text, want", [("none", "none"), ("FULL", "full"), (" 2,1,0,0 ", (2, 1, 0, 0)),
                                        ([1, 0], (1, 0)), ((0,), (0,))])
def test_the_three_forms_parse(text, want):
    assert parse_recompute(text) == want


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=4), st.floats(), st.none()))
def test_anything_else_is_one_line_naming_the_value(value):
    try:
        got = parse_recompute(value)
    except PipesplitError as e:
        assert "is not a recomputation" in str(e) and "\n" not in str(e)
        return
    assert got in ("none", "full") or (isinstance(got, tuple) and all(c >= 0 for c in got) and got)


def test_counts_for_each_setting_and_their_errors():
    assert counts_for("none", [3, 2]) == (0, 0) and counts_for("full", [3, 2]) == (3, 2)
    assert counts_for((1, 2), [3, 2]) == (1, 2)
    with pytest.raises(PipesplitError, match="stage 1 to recompute 3 blocks, but it holds 2"):
        counts_for((0, 3), [3, 2])
    with pytest.raises(PipesplitError, match="gives 3 counts for 2 stages"):
        counts_for((0, 1, 1), [3, 2])


def test_the_shortest_way_to_write_counts():
    assert normal((0, 0), (2, 2)) == "none" and normal((2, 1), (2, 1)) == "full" and normal((1, 0), (2, 1)) == (1, 0)
    assert describe((1, 0)) == "1,0" and to_json((1, 0)) == [1, 0] and to_json("full") == "full"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=4), st.lists(st.integers(0, 40), min_size=4, max_size=4),
       st.integers(0, 60), st.booleans())
def test_the_least_counts_are_what_brute_force_over_every_combination_finds(blocks, need, budget, paired):
    """Each stage holds ``need[s]`` bytes less 10 per recomputed block; ranks hold one stage, or two round-robin."""
    n = len(blocks)
    ranks = [(r, r + n // 2) for r in range(n // 2)] if paired and n % 2 == 0 else [(s,) for s in range(n)]

    def held(stage, c):
        return max(0, need[stage] - 10 * c) + (5 if c else 0)  # one block's activations again while recomputing

    def fits(r, mine):
        return sum(held(s, c) for s, c in mine.items()) <= budget

    got = least_counts(blocks, ranks, fits)
    every = [c for c in itertools.product(*(range(b + 1) for b in blocks))
             if all(fits(r, {s: c[s] for s in stages}) for r, stages in enumerate(ranks))]
    if not every:
        assert got is None
        return
    assert got is not None and all(fits(r, {s: got[s] for s in stages}) for r, stages in enumerate(ranks))
    assert sum(got) == min(sum(c) for c in every)  # never more recomputation than fitting needs
