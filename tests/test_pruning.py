"""The pruning rule on its own: numbers in, a reason or None out."""

from hypothesis import given
from hypothesis import strategies as st

from search.plans.pruning import PRUNE_AFTER, budget_covers_rest, prune_reason


def test_no_pruning_before_enough_plans_are_measured():
    assert prune_reason(0.1, [(2.0, 2.0)] * (PRUNE_AFTER - 1)) is None


def test_a_plan_clearly_behind_even_when_corrected_optimistically_is_pruned():
    done = [(1.5, 3.0), (1.6, 3.0), (1.0, 1.5)]  # the most optimistic measured/predicted ratio is 1/1.5
    assert prune_reason(1.5, done) is not None  # 1.5 * 0.667 = 1.0 < 0.97 * 1.6
    assert "at best 1.00x vs measured best 1.60x" in prune_reason(1.5, done)
    assert prune_reason(2.4, done) is None  # 2.4 * 0.667 = 1.6: could tie the best, so it runs


@given(st.lists(st.tuples(st.floats(0.1, 5), st.floats(0.1, 5)), min_size=3, max_size=8))
def test_a_plan_predicted_at_least_as_well_as_the_best_is_never_pruned(done):
    best_pred = max(p for m, p in done if m == max(m for m, _ in done))
    assert prune_reason(best_pred, done) is None


@given(st.integers(0, 50), st.integers(0, 50))
def test_pruning_rests_exactly_when_the_budget_left_runs_this_plan_and_every_untried_one(left, untried):
    assert budget_covers_rest(left, untried) == (left >= untried + 1)


def test_a_throughput_study_prunes_by_the_same_rule_in_its_own_unit():
    done = [(10.0, 12.0), (16.0, 16.0), (12.0, 15.0)]  # (measured, predicted) samples/s
    assert prune_reason(15.0, done, unit=" samples/s") == "cost model: at best 15 samples/s vs measured best 16 samples/s"
    assert prune_reason(16.0, done, unit=" samples/s") is None
