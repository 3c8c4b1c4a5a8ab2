import random

from hypothesis import given, settings
from hypothesis import strategies as st

from search.plans.proposals import Measured, propose
from search.plans.space import PlanPoint, PlanSpace


def balanced(sp):
    """A toy model: the more balanced the stages, the faster."""
    return lambda p: 1.0 / max(sp.stage_blocks(p)) * (1.0 + 0.01 * p.chunks)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 60), st.data())
def test_every_proposal_is_a_valid_untried_plan(n, data):
    stages = data.draw(st.integers(2, min(n, 9)))
    sp = PlanSpace(names=tuple(f"m{i}" for i in range(n)), stages=stages, chunks=(1, 2, 4))
    rng = random.Random(data.draw(st.integers(0, 10**6)))
    seen: set[PlanPoint] = set()
    measured = []
    predict = balanced(sp)
    for _ in range(min(12, sp.size)):
        p = propose(sp, measured, seen, predict, [], rng)
        assert p is not None and sp.valid(p) and p not in seen
        seen.add(p)
        measured.append(Measured(point=p, speedup=predict(p) * rng.uniform(0.9, 1.1)))


def test_an_exhausted_space_proposes_nothing():
    sp = PlanSpace(names=("a", "b", "c"), stages=2, chunks=(1,))
    seen = {PlanPoint(cuts=(1,), chunks=1), PlanPoint(cuts=(2,), chunks=1)}
    assert propose(sp, [], seen, lambda p: 1.0, [], random.Random(0)) is None
    assert propose(sp, [], {PlanPoint(cuts=(1,), chunks=1)}, lambda p: 1.0, [], random.Random(0)) == \
        PlanPoint(cuts=(2,), chunks=1)


def test_the_local_search_when_asked_corrects_a_biased_model():
    sp = PlanSpace(names=tuple(f"m{i}" for i in range(30)), stages=3, chunks=(4,))
    weight = [2.0] * 10 + [1.0] * 20  # the model thinks every segment costs the same; the first ten cost twice

    def truth(p):
        b = [0, *p.cuts, sp.n]
        return 1.0 / max(sum(weight[x:y]) for x, y in zip(b, b[1:]))

    model = balanced(sp)
    best_true = max(truth(PlanPoint(cuts=(a, b), chunks=4)) for a in range(1, 30) for b in range(a + 1, 30))
    start = PlanPoint(cuts=(10, 20), chunks=4)  # the model's optimum
    assert truth(start) < 0.9 * best_true
    rng = random.Random(1)
    seen, measured = {start}, [Measured(point=start, speedup=truth(start))]
    for _ in range(40):
        p = propose(sp, measured, seen, model, [start], rng, anchors=3)
        seen.add(p)
        measured.append(Measured(point=p, speedup=truth(p)))
    assert max(m.speedup for m in measured) >= 0.97 * best_true


def test_the_model_optimum_comes_first_when_nothing_is_measured():
    sp = PlanSpace(names=tuple(f"m{i}" for i in range(10)), stages=2, chunks=(1, 2))
    best = PlanPoint(cuts=(5,), chunks=2)
    assert propose(sp, [], set(), balanced(sp), [best], random.Random(3), explore=0.0) == best
