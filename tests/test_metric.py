"""search.trials.metric: the figure a search ranks by, read from results and predictions alike (pure)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.result import TrialResult
from pipeline.core.spec import ModelSpec
from search.trials.metric import Metric, choose_metric

PLAN = SplitPlan(model=ModelSpec(name="m", batch_size=8), split_points=(SplitPoint("b.1"),), chunks=2)


@pytest.mark.parametrize("asked, fits, got", [(None, True, "speedup"), (None, False, "throughput"),
                                              ("throughput", True, "throughput"), ("speedup", True, "speedup")])
def test_speedup_where_a_serial_baseline_fits_throughput_otherwise_unless_asked(asked, fits, got):
    assert choose_metric(asked, serial_fits=fits) == got


def test_speedup_without_a_serial_baseline_or_an_unknown_figure_is_one_line():
    with pytest.raises(PipesplitError, match="--objective speedup needs a serial baseline.*--objective throughput"):
        choose_metric("speedup", serial_fits=False)
    with pytest.raises(PipesplitError, match="--objective 'latency' is not one this search knows"):
        choose_metric("latency", serial_fits=True)
    with pytest.raises(PipesplitError, match="unknown objective"):
        Metric(name="latency", batch=1)


def test_a_result_reads_as_either_figure():
    r = TrialResult(plan=PLAN, ok=True, serial_s=(4.0, 4.0, 4.0), pipeline_s=(2.0, 1.0, 4.0))
    speed, thru = Metric(name="speedup", batch=8), Metric(name="throughput", batch=8)
    assert speed.repeats(r) == [2.0, 4.0, 1.0] and speed.of(r) == 2.0 and speed.spread(r) == (1.0, 4.0)
    assert thru.repeats(r) == [4.0, 8.0, 2.0] and thru.of(r) == 4.0 and thru.spread(r) == (2.0, 8.0)
    alone = TrialResult(plan=PLAN, ok=True, pipeline_s=(2.0,))  # no serial model timed: no speedup, a throughput
    assert thru.of(alone) == 4.0 and speed.repeats(alone) == []
    assert speed.label == "speedup" and thru.label == "throughput_samples_per_s"
    assert speed.fmt(1.234) == "1.23x" and thru.fmt(12.34) == "12.3/s" and thru.fmt(None) == "-"
    assert thru.fmt(float("nan")) == "-"


@given(st.floats(0.01, 100), st.floats(1e-4, 1e3), st.integers(1, 512))
def test_a_prediction_is_the_batch_over_its_step_time_or_its_speedup(speedup, step_s, batch):
    assert Metric(name="speedup", batch=batch).predicted(speedup, step_s) == speedup
    assert math.isclose(Metric(name="throughput", batch=batch).predicted(speedup, step_s), batch / step_s)
    assert Metric(name="throughput", batch=batch).predicted(speedup, 0.0) == 0.0


def test_a_speedup_over_the_pooled_serial_seconds_ranks_plans_by_their_pipeline_seconds():
    from search.trials.metric import pooled_serial

    # one slow serial repeat (6 s) would crown this plan by its own paired ratios; pooled, it cannot
    r = TrialResult(plan=PLAN, ok=True, serial_s=(6.0, 4.0), pipeline_s=(2.0, 2.0))
    pool = pooled_serial(r.serial_s, [[4.0, 4.1], [3.9, 4.0], [4.0, 4.0], [9.0, 9.0]], window=3)
    assert pool == 4.0 and pooled_serial((), []) is None
    speed = Metric(name="speedup", batch=8)
    assert speed.of(r) == 2.5 and speed.of(r, pool) == 2.0 and speed.repeats(r, pool) == [2.0, 2.0]
    assert Metric(name="throughput", batch=8).of(r, pool) == 4.0  # a throughput has no serial to pool


@given(st.lists(st.floats(0.1, 10), min_size=1, max_size=6), st.lists(st.lists(st.floats(0.1, 10), max_size=4), max_size=6),
       st.integers(0, 5))
def test_the_pooled_serial_lies_within_its_samples(own, earlier, window):
    from search.trials.metric import pooled_serial

    got = pooled_serial(own, earlier, window)
    samples = [*own, *(x for r in (earlier[-window:] if window else []) for x in r)]
    assert min(samples) <= got <= max(samples)
