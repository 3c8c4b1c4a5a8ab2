"""The shared-device simulation against hand-computed makespans, the flow shop, and the ceiling."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.sharing import simulate_shared
from costmodel.simulate import simulate, simulate_times
from costmodel.types import Link, Machine, Profile, Segment

CPU1 = Machine(device="cpu", cores=1, threads=1)
CPU2 = Machine(device="cpu", cores=2, threads=1)


def test_two_stages_on_one_core_share_it_while_both_compute():
    # F0 on stage 0 alone (1 s); then F1 on stage 0 and F0 on stage 1 share the core (2 s); then F1 alone
    run = simulate_shared([1.0, 1.0], [0.0], 2, CPU1)
    assert run.makespan == pytest.approx(4.0)
    assert [pytest.approx(s) for s in run.spans[0]] == [(0.0, 1.0), (1.0, 3.0)]
    assert [pytest.approx(s) for s in run.spans[1]] == [(1.0, 3.0), (3.0, 4.0)]


def test_four_stages_on_two_cores():
    # by hand: 1 busy [0,1]; 2 busy [1,2]; 3 busy at 2/3 speed [2,3.5]; 4 busy at 1/2 [3.5,5.5];
    # 3 busy [5.5,7]; 2 busy [7,8]; 1 busy [8,9]
    assert simulate_shared([1.0] * 4, [0.0] * 3, 4, CPU2).makespan == pytest.approx(9.0)
    # never more than two busy with 2 microbatches: the flow shop's M + S - 1
    assert simulate_shared([1.0] * 4, [0.0] * 3, 2, CPU2).makespan == pytest.approx(5.0)


def test_a_stage_idle_during_fill_lends_its_cores():
    # one microbatch: only one stage computes at a time, so each runs at full speed on 2 threads' worth
    two_threads = Machine(device="cpu", cores=2, threads=2)
    assert simulate_shared([1.0, 2.0, 1.0], [0.5, 0.5], 1, two_threads).makespan == pytest.approx(5.0)
    # measured contention slows busy neighbours beyond their share of cores
    slow = Machine(device="cpu", cores=2, threads=1, contention={2: 1.25})
    assert simulate_shared([1.0, 1.0], [0.0], 2, slow).makespan == pytest.approx(1 + 1.25 + 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), min_size=2, max_size=6), st.integers(1, 8), st.floats(0.0, 1.0))
def test_a_gpu_per_stage_is_the_flow_shop(work, chunks, link):
    links = [link] * (len(work) - 1)
    gpu = Machine(device="cuda", cores=len(work), threads=1)
    # the event loop resolves times to ~1e-12 s (a stage with less work finishes at once): compare to 1 ns
    expected = simulate_times(work, links, chunks)[0]
    assert simulate_shared(work, links, chunks, gpu).makespan == pytest.approx(expected, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(1e-4, 1.0), min_size=4, max_size=4), min_size=2, max_size=8),
       st.integers(1, 4), st.integers(1, 3), st.data())
def test_no_prediction_exceeds_the_ceiling(lat, cores, threads, data):
    """Random profiles (any latencies at any microbatch size, any contention): speedup <= cores / threads."""
    segs = tuple(Segment(fqn=f"s{i}", flops=1, param_bytes=1, out_bytes=8, latency_s=dict(zip((1, 2, 4, 8), ls)))
                 for i, ls in enumerate(lat))
    machine = Machine(device="cpu", cores=cores, threads=threads,
                      contention={2: data.draw(st.floats(0.5, 2.0)), 4: data.draw(st.floats(0.5, 3.0))})
    prof = Profile(model={"name": "r"}, device="cpu", threads=threads, granularity="block", batch_size=8,
                   segments=segs, link=Link(latency_s=0.0, bandwidth_Bps=1e12), machine=machine)
    stages = data.draw(st.integers(2, len(segs)))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(segs) - 1), min_size=stages - 1, max_size=stages - 1,
                                     unique=True)))
    pred = simulate(prof, cuts, data.draw(st.sampled_from([1, 2, 4, 8])))
    assert pred.ceiling == min(stages, cores / threads)
    assert pred.speedup <= pred.ceiling + 1e-9
