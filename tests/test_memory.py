"""search.memory: --max-stage-memory's sizes and rule (pure)."""

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import PipesplitError
from search.memory import constraint, over_limit, parse_size, predicted_over, runtime_bytes


@pytest.mark.parametrize("text, size", [("4GiB", 4 * 2**30), ("512 MiB", 512 * 2**20), ("1.5GB", 1_500_000_000),
                                        ("1000", 1000), ("2g", 2 * 10**9)])
def test_sizes_read_as_people_write_them(text, size):
    assert parse_size(text) == size


@given(st.text(max_size=12).filter(lambda t: not t.strip().replace(".", "", 1).isdigit()))
def test_anything_else_is_one_line_naming_it(text):
    try:
        n = parse_size(text)
    except PipesplitError as e:
        assert "--max-stage-memory" in str(e) and "4GiB" in str(e)
    else:
        assert n > 0  # a real size with a unit ("3 kib")


def test_the_rule_names_the_worst_stage_and_its_figure():
    assert over_limit([100 * 2**20, 200 * 2**20], 256 * 2**20) is None
    why = over_limit([100 * 2**20, 300 * 2**20], 256 * 2**20)
    assert why is not None and why.startswith("stage 1 peaked at 300 MiB, over --max-stage-memory 256 MiB")


def test_optuna_sees_the_excess_in_mib_as_the_constraint():
    t = optuna.trial.create_trial(value=1.0, user_attrs={"peak_mem_bytes": [300 * 2**20, 100 * 2**20]})
    assert constraint(t, 256 * 2**20) == (44.0,)
    assert constraint(optuna.trial.create_trial(value=1.0), 2**20) == ()


def test_the_runtime_beside_a_prediction_is_the_least_gap_measured_and_never_negative():
    assert runtime_bytes([]) == 0
    assert runtime_bytes([([500, 600], [100, 150]), ([450, 480], [90, 60])]) == 360
    assert runtime_bytes([([100], [150])]) == 0  # a model that overpredicts adds nothing


@given(st.lists(st.integers(0, 2**34), min_size=1, max_size=8), st.integers(0, 2**32), st.integers(1, 2**35))
def test_a_plan_is_ruled_out_before_a_run_only_when_its_prediction_is_over(predicted, runtime, limit):
    why = predicted_over(predicted, runtime, limit)
    assert (why is not None) == (max(predicted) + runtime > limit)
    if why:
        assert why.startswith(f"predicted: stage {predicted.index(max(predicted))} needs") and "not run" in why
