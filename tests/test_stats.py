import pytest

from costmodel.stats import kendall_tau, mape


def test_mape_in_percent():
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(10.0)


def test_kendall_tau_extremes_and_a_swap():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)


def test_bad_inputs():
    with pytest.raises(ValueError):
        kendall_tau([1], [1])
    with pytest.raises(ValueError):
        mape([1.0], [0.0])
