"""search.plans.memory: --device-memory's sizes and rules, before a run and after (pure)."""

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.budget import MemoryPrediction, RankMemory
from pipeline.core.errors import PipesplitError
from search.plans.memory import constraint, learned_runtime, over_limit, parse_size, predicted_over, with_runtime


@pytest.mark.parametrize("text, size", [("4GiB", 4 * 2**30), ("512 MiB", 512 * 2**20), ("1.5GB", 1_500_000_000),
                                        ("1000", 1000), ("2g", 2 * 10**9)])
def test_sizes_read_as_people_write_them(text, size):
    assert parse_size(text) == size


@given(st.text(max_size=12).filter(lambda t: not t.strip().replace(".", "", 1).isdigit()))
def test_anything_else_is_one_line_naming_it(text):
    try:
        n = parse_size(text)
    except PipesplitError as e:
        assert "--device-memory" in str(e) and "4GiB" in str(e)
    else:
        assert n > 0  # a real size with a unit ("3 kib")


def test_the_rule_names_the_worst_stage_and_its_figure():
    assert over_limit([100 * 2**20, 200 * 2**20], 256 * 2**20) is None
    why = over_limit([100 * 2**20, 300 * 2**20], 256 * 2**20)
    assert why is not None and why.startswith("stage 1 peaked at 300 MiB, over --device-memory 256 MiB")


def test_optuna_sees_the_excess_in_mib_as_the_constraint():
    t = optuna.trial.create_trial(value=1.0, user_attrs={"peak_mem_bytes": [300 * 2**20, 100 * 2**20]})
    assert constraint(t, 256 * 2**20) == (44.0,)
    assert constraint(optuna.trial.create_trial(value=1.0), 2**20) == ()


def _pred(stage: list[int], runtime: int, budget: int) -> MemoryPrediction:
    return MemoryPrediction(ranks=tuple(RankMemory(rank=r, weights=w, train_state=0, activations=0, runtime=runtime)
                                        for r, w in enumerate(stage)), whole=sum(stage) + runtime, budget=budget)


@given(st.lists(st.integers(0, 2**34), min_size=1, max_size=8), st.integers(0, 2**32), st.integers(1, 2**35))
def test_a_plan_is_ruled_out_before_a_run_only_when_its_prediction_is_over(stage, runtime, limit):
    why = predicted_over(_pred(stage, runtime, limit))
    assert (why is not None) == (max(stage) + runtime > limit)
    if why:
        assert why.startswith(f"predicted: rank {stage.index(max(stage))} needs") and "not run" in why


def test_each_rank_learns_its_own_runtime_from_measured_trials_and_starts_from_the_probe():
    assert learned_runtime([], 900, 2) == (900, 900)
    seen = [([1000, 1200], [950, 1000], 900), ([1100, 1150], [960, 990], 900)]  # predicted held 900 of runtime
    assert learned_runtime(seen, 900, 3) == (950, 1060, 900)  # min(1000-50, 1100-60), min(1200-100, 1150-90)
    per_rank = [([1000, 1200], [950, 1000], [900, 900]), ([1100, 1150], [960, 990], [900, 900])]
    assert learned_runtime(per_rank, 900, 3) == (950, 1060, 900)  # the runtime held, per rank, taken off once
    assert learned_runtime([([500], [700], 300)], 900, 1) == (100,)  # without its 300 of runtime: 400 predicted


@given(st.lists(st.integers(0, 2**34), min_size=1, max_size=8), st.lists(st.integers(0, 2**32), min_size=1, max_size=8))
def test_a_prediction_takes_each_ranks_runtime_and_keeps_its_own_part(stage, runtime):
    got = with_runtime(_pred(stage, 7, 2**40), runtime)
    assert [r.weights for r in got.ranks] == stage
    assert [r.runtime for r in got.ranks] == [runtime[min(r, len(runtime) - 1)] for r in range(len(stage))]
    assert got.whole == sum(stage) + got.ranks[0].runtime
