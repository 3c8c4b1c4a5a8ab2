import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.partition import best_cuts, optimal, ranked
from costmodel.simulate import simulate
from tests.conftest import toy_profile as profile


def brute(seg, link, stages, chunks, overhead=0.0):
    from costmodel.simulate import closed_form_makespan

    n = len(seg)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        b = [0, *cuts, n]
        st_ = [sum(seg[x:y]) + overhead for x, y in zip(b, b[1:])]
        best = min(best, closed_form_makespan(st_, [link[c - 1] for c in cuts], chunks))
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), min_size=2, max_size=8), st.data(), st.integers(2, 4), st.integers(1, 16),
       st.floats(0.0, 0.5))
def test_dp_is_optimal_against_brute_force(seg, data, stages, chunks, overhead):
    stages = min(stages, len(seg))
    link = data.draw(st.lists(st.floats(0.0, 2.0), min_size=len(seg) - 1, max_size=len(seg) - 1))
    cuts, cost = best_cuts(seg, link, stages, chunks, overhead)
    assert len(cuts) == stages - 1 and cuts == sorted(cuts) and all(0 < c < len(seg) for c in cuts)
    assert cost == pytest.approx(brute(seg, link, stages, chunks, overhead), rel=1e-9, abs=1e-12)


def test_optimal_plan_and_chunks_on_a_toy_profile():
    prof = profile([1.0, 3.0, 1.0, 1.0, 2.0], batch=8)
    best = optimal(prof, 2, [1, 2, 4, 8])
    assert best.cuts == (2,)  # 4 | 4 seconds per sample
    assert best.chunks == 8  # no link cost: more chunks, smaller bubble
    again = simulate(prof, best.cuts, best.chunks)
    assert again.makespan_s == pytest.approx(best.makespan_s)


def test_a_slow_link_makes_fewer_chunks_win():
    prof = profile([1.0, 1.0], batch=8, out_bytes=1, latency=50.0)
    ranks = ranked(prof, 2, [1, 2, 4, 8])
    assert ranks[0].chunks == 1
    assert [p.makespan_s for p in ranks] == sorted(p.makespan_s for p in ranks)


def test_no_feasible_chunks():
    with pytest.raises(ValueError, match="no chunk count in \\[3\\] divides batch size 8"):
        optimal(profile([1.0, 1.0]), 2, [3])
