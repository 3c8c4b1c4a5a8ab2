import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.simulate import closed_form_makespan, simulate, simulate_times
from costmodel.types import Segment
from tests.conftest import toy_profile as profile


@pytest.mark.parametrize("stages, chunks", [(2, 1), (2, 4), (4, 8), (3, 2)])
def test_equal_stages_under_gpipe_take_m_plus_s_minus_1_times_t(stages, chunks):
    t = 0.5
    makespan, bubble = simulate_times([t] * stages, [0.0] * (stages - 1), chunks)
    assert makespan == pytest.approx((chunks + stages - 1) * t)
    assert bubble == pytest.approx((stages - 1) / (chunks + stages - 1))


def test_prediction_of_a_balanced_plan():
    p = simulate(profile([1.0] * 4), cuts=[2], chunks=4)
    # microbatch of 2 samples: each stage 2 segments x 2 samples x 1 s = 4 s; (4 + 2 - 1) x 4
    assert p.stage_s == (4.0, 4.0)
    assert p.makespan_s == pytest.approx(20.0)
    assert p.serial_s == pytest.approx(32.0)
    assert p.speedup == pytest.approx(1.6)


def test_link_time_is_latency_plus_bytes_over_bandwidth():
    p = simulate(profile([1.0, 1.0], out_bytes=1000, latency=0.01, bandwidth=1e6), cuts=[1], chunks=8)
    assert p.transfer_s == (pytest.approx(0.01 + 1000 / 1e6),)


def test_per_sample_latency_is_interpolated_between_measured_sizes():
    seg = Segment(fqn="a", flops=1, param_bytes=1, out_bytes=0, latency_s={2: 2.0, 8: 4.0})
    assert seg.latency(2) == 2.0
    assert seg.latency(4) == pytest.approx(4 * (1.0 + (0.5 - 1.0) / 3))
    assert seg.latency(16) == pytest.approx(8.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=6), st.data(), st.integers(1, 12))
def test_event_simulation_equals_flow_shop_closed_form(stages, data, chunks):
    links = data.draw(st.lists(st.floats(0.0, 5.0), min_size=len(stages) - 1, max_size=len(stages) - 1))
    makespan, bubble = simulate_times(stages, links, chunks)
    assert makespan == pytest.approx(closed_form_makespan(stages, links, chunks), rel=1e-9, abs=1e-12)
    assert -1e-9 <= bubble <= 1.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.01, 5.0), min_size=2, max_size=5), st.integers(1, 10), st.floats(0.0, 3.0))
def test_makespan_grows_with_any_stage_or_link_time(stages, chunks, extra):
    links = [0.1] * (len(stages) - 1)
    base, _ = simulate_times(stages, links, chunks)
    slower = list(stages)
    slower[0] += extra
    assert simulate_times(slower, links, chunks)[0] >= base - 1e-12
    assert simulate_times(stages, [x + extra for x in links], chunks)[0] >= base - 1e-12


def test_more_chunks_shrink_the_bubble_without_links():
    prof = profile([1.0] * 4)
    bubbles = [simulate(prof, [1, 2, 3], m).bubble_fraction for m in (1, 2, 4, 8)]
    assert bubbles == sorted(bubbles, reverse=True)


def test_bad_inputs():
    with pytest.raises(ValueError, match="chunks 3 must divide batch size 8"):
        simulate(profile([1.0, 1.0]), [1], 3)
    with pytest.raises(ValueError, match="must be increasing"):
        simulate(profile([1.0, 1.0, 1.0]), [2, 1], 1)
