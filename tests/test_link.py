import pytest

from costmodel.link import fit_link


def test_recovers_latency_and_bandwidth():
    samples = [(b, 20e-6 + b / 2e9) for b in (1 << 10, 1 << 16, 1 << 20, 1 << 24)]
    link = fit_link(samples)
    assert link.latency_s == pytest.approx(20e-6, rel=1e-6)
    assert link.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)
    assert link.time(0) == 0.0
    assert link.time(1 << 20) == pytest.approx(20e-6 + (1 << 20) / 2e9)


def test_noisy_fit_stays_physical():
    link = fit_link([(100, 5e-5), (200, 4e-5)])
    assert link.latency_s >= 0 and link.bandwidth_Bps > 0


def test_needs_two_samples():
    with pytest.raises(ValueError, match="at least 2"):
        fit_link([(1, 1.0)])
