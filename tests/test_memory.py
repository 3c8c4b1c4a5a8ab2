"""search.memory: --max-stage-memory's sizes and rule (pure)."""

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import PipesplitError
from search.memory import constraint, over_limit, parse_size


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
