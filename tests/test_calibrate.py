"""Calibration: known factors recovered from synthetic timelines; too few trials refused."""

import pytest

from costmodel.calibrate import TrialRows, fit, trial_rows
from costmodel.sharing import simulate_shared
from costmodel.types import Machine

BASE = Machine(device="cpu", cores=2, threads=1)


def synthetic(work, chunks, truth):
    """A timeline as a machine whose busy stages are slower than the model says would measure it."""
    run = simulate_shared(work, [0.0] * (len(work) - 1), chunks, truth)
    return trial_rows(work, run.spans, BASE)


def test_known_factors_are_recovered_from_synthetic_timelines():
    truth = Machine(device="cpu", cores=2, threads=1, contention={2: 1.25, 3: 1.6})
    rows = [synthetic([1.0, 1.5, 0.5], 4, truth), synthetic([0.5, 0.5, 2.0], 8, truth),
            synthetic([2.0, 1.0, 1.0], 2, truth)]
    cal = fit(rows)
    assert cal.trials == 3
    assert cal.factors[1] == pytest.approx(1.0, rel=1e-6)
    assert cal.factors[2] == pytest.approx(1 / 1.25, rel=1e-6)
    assert cal.factors[3] == pytest.approx(1 / 1.6, rel=1e-6)
    calibrated = cal.apply(BASE)
    for work, chunks in (([1.0, 1.0, 1.0], 4), ([0.3, 2.0, 0.7], 6)):
        assert simulate_shared(work, [0.0, 0.0], chunks, calibrated).makespan == pytest.approx(
            simulate_shared(work, [0.0, 0.0], chunks, truth).makespan, rel=1e-6)


def test_fewer_trials_than_factors_are_refused():
    truth = Machine(device="cpu", cores=2, threads=1, contention={2: 1.25, 3: 1.6})
    one = synthetic([1.0, 1.5, 0.5], 4, truth)
    with pytest.raises(ValueError, match="1 trial\\(s\\) cannot fit 3 factors"):
        fit([one])
    with pytest.raises(ValueError, match="no measured trials"):
        fit([])
    assert TrialRows.from_dict(one.to_dict()) == one
