"""search.plans.optimum: the best plan of one layout under any score (pure)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from search.plans.optimum import layout_optimum
from search.plans.space import Layout, PlanPoint, PlanSpace


def space(n=8, stages=2, chunks=(1, 2, 4), per_rank=2):
    return PlanSpace(names=tuple(f"s{i}" for i in range(n)), stages=stages, chunks=chunks,
                     layouts=(Layout(), Layout(schedule="Interleaved1F1B", per_rank=per_rank)))


def balance(p: PlanPoint, n: int = 8) -> float:
    """A score that peaks at equal stages and at 4 chunks."""
    b = [0, *p.cuts, n]
    return -max(y - x for x, y in zip(b, b[1:])) - abs(p.chunks - 4) / 10


def test_every_plan_is_scored_where_the_layout_is_small():
    best = layout_optimum(balance, space(), 1)
    assert best == PlanPoint(cuts=(2, 4, 6), chunks=4, layout=1)


def test_a_plan_that_may_not_run_is_never_the_optimum():
    best = layout_optimum(lambda p: None if p.chunks == 4 else balance(p), space(), 1)
    assert best is not None and best.chunks == 2
    assert layout_optimum(lambda p: None, space(), 1) is None


@settings(max_examples=25, deadline=None)
@given(st.integers(12, 40), st.sampled_from([1, 2, 4]), st.data())
def test_the_descent_never_ends_below_its_start_nor_where_one_cut_moved_would_gain(n, m, data):
    sp = space(n=n, chunks=(m,))
    cuts = tuple(sorted(data.draw(st.lists(st.integers(1, n - 1), min_size=3, max_size=3, unique=True))))
    start = PlanPoint(cuts=cuts, chunks=m, layout=1)

    def score(p: PlanPoint) -> float:  # sum of squared stage sizes: smooth, least at equal stages
        b = [0, *p.cuts, n]
        return -sum((y - x) ** 2 for x, y in zip(b, b[1:]))

    best = layout_optimum(score, sp, 1, [start], exhaustive=0)
    assert best is not None and score(best) >= score(start)
    for i in range(3):
        for c in range(1, n):
            moved = tuple(sorted({*best.cuts[:i], c, *best.cuts[i + 1:]}))
            if len(moved) == 3:
                assert score(PlanPoint(cuts=moved, chunks=m, layout=1)) <= score(best)
