"""search.plans.recompute: the recomputation a search's plan runs with, its own or a framework's (pure)."""

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.recompute import least_counts
from pipeline.core.spec import ModelSpec
from search.plans.recompute import choose_recompute, framework_of, uniform_counts

SPEC = ModelSpec(name="m", batch_size=8, input_shape=(3, 32, 32))
PLAN = SplitPlan(model=SPEC, split_points=(SplitPoint("b.2"),), chunks=4, schedule="1F1B", mode="train")


class Cands:
    """Stage 0 holds three blocks, stage 1 one."""

    def stage_blocks(self, plan):
        return [["layers.0", "layers.1", "layers.2"], ["layers.3"]]


def _fits_with(need0, need1):
    """Stage s fits once it recomputes at least need_s of its blocks."""
    def fits(plan):
        c = (0, 0) if plan.recompute == "none" else (3, 1) if plan.recompute == "full" else plan.recompute
        return c[0] >= need0 and c[1] >= need1
    return fits


def test_a_plan_that_fits_recomputes_nothing_whoever_chose_it():
    for source in (None, "torchtitan", "megatron"):
        assert choose_recompute(PLAN, Cands(), framework_of(source), lambda p, r: (0, 0), (0, 0),
                                _fits_with(0, 0)) == PLAN
    assert choose_recompute(PLAN, Cands(), None, None, (0, 0), _fits_with(1, 0)) == PLAN  # no limit: nothing to fit


def test_the_search_takes_the_least_counts_and_the_frameworks_their_uniform_setting():
    fits = _fits_with(2, 0)
    assert choose_recompute(PLAN, Cands(), None, lambda p, r: (2, 0), (0, 0), fits).recompute == (2, 0)
    assert choose_recompute(PLAN, Cands(), None, lambda p, r: None, (0, 0), fits).recompute == "full"
    assert choose_recompute(PLAN, Cands(), "torchtitan", None, (0, 0), _fits_with(0, 0)) == PLAN
    assert choose_recompute(PLAN, Cands(), "torchtitan", lambda p, r: (2, 0), (0, 0), fits).recompute == "full"
    assert choose_recompute(PLAN, Cands(), "deepspeed-parameters", lambda p, r: (2, 0), (0, 0), fits).recompute == "full"
    # Megatron's least N for every stage: N = 2 recomputes two of stage 0's blocks and stage 1's only one
    assert choose_recompute(PLAN, Cands(), "megatron", lambda p, r: (2, 0), (0, 0), fits).recompute == (2, 1)
    assert framework_of("costmodel-optimum+megatron") == "megatron" and framework_of("sampler") is None
    assert uniform_counts([3, 1, 2], 2) == (2, 1, 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=3, max_size=6), st.integers(2, 3), st.integers(10, 60))
def test_the_joint_optimum_over_cuts_and_counts_is_the_optimum_over_cuts_with_their_least_counts(work, stages, budget):
    """A toy model of the step: stage time = its blocks' work + 1 per recomputed block; stage memory = 4 per
    block it keeps and 1 per block it recomputes, times the microbatches in flight (1F1B: stages - s)."""
    n = len(work)
    if stages > n:
        return

    def time_of(bounds, counts):
        return max(sum(work[a:b]) + c for (a, b), c in zip(bounds, counts))

    def mem(s, blocks, c):
        return ((blocks - c) * 4 + c) * (stages - s) + (4 if c else 0)

    brute, ours = [], []
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = list(zip([0, *cuts], [*cuts, n]))
        sizes = [b - a for a, b in bounds]
        for counts in itertools.product(*(range(k + 1) for k in sizes)):
            if all(mem(s, sizes[s], c) <= budget for s, c in enumerate(counts)):
                brute.append(time_of(bounds, counts))
        def fits(r, mine, sizes=sizes):
            return all(mem(s, sizes[s], c) <= budget for s, c in mine.items())

        least = least_counts(sizes, [(s,) for s in range(stages)], fits)
        if least is not None:
            ours.append(time_of(bounds, least))
    assert (min(brute) if brute else None) == (min(ours) if ours else None)


def test_a_forward_only_plan_is_never_given_recomputation():
    infer = dataclasses.replace(PLAN, mode="infer", recompute="full")
    assert infer.recompute == "none"
