"""Real trials: 2 gloo stage processes, tiny models, the pool reused across the whole module."""

import os
import signal
import threading
import time

import pytest

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def plan(spec, backend="torch", chunks=4, at="blocks.2", **kw):
    return SplitPlan(model=spec, split_points=(SplitPoint(at),), chunks=chunks, backend=backend, **kw)


@pytest.mark.parametrize("backend", ["torch", "pippy"])
def test_two_stage_trial_matches_unsplit_model(pool2, tiny_spec, backend):
    r = pool2.run(plan(tiny_spec, backend), repeats=2, warmup=1)
    assert r.ok, r.reason
    assert r.max_abs_diff <= r.tolerance
    assert r.check is not None and (r.check.compared, r.check.worst, r.check.diff) == ("output", "output", r.max_abs_diff)
    assert len(r.serial_s) == len(r.pipeline_s) == len(r.serial_all_s) == 2
    assert all(t > 0 for t in r.pipeline_s + r.serial_s)
    assert len(r.stage_compute_s) == 2 and all(c > 0 for c in r.stage_compute_s)
    # one cut between ViT blocks sends the token tensor: batch x tokens x dim float32
    tokens = (32 // 8) ** 2 + 1
    assert r.boundary_bytes == (8 * tokens * 48 * 4,)
    assert all(m > 0 for m in r.peak_mem_bytes)
    # 4 microbatches -> 4 compute spans per rank, in order, not overlapping
    for spans in r.events:
        assert [mb for mb, _, _ in spans] == [0, 1, 2, 3]
        assert all(a < b <= c for (_, a, b), (_, c, _) in zip(spans, spans[1:]))
    assert 0 <= r.busy_s <= r.wall_s  # the ranks' own work is inside the driver's wall time (no bound a machine sets)
    # the breakdown explains the trial: its named parts are the wall time, to within 5 %
    b = r.breakdown
    assert b is not None and min(b.build_s, b.check_s, b.warmup_s, b.timed_s) > 0
    assert abs(b.total_s - r.wall_s) <= 0.05 * r.wall_s and b.other_s + b.driver_s <= 0.05 * r.wall_s


def test_cut_inside_a_residual_block_sends_two_tensors(pool2, tiny_spec):
    r = pool2.run(plan(tiny_spec, at="blocks.1.mlp", chunks=2), repeats=1, serial_all=False)
    assert r.ok, r.reason
    tokens = (32 // 8) ** 2 + 1
    assert r.boundary_bytes == (2 * 8 * tokens * 48 * 4,)
    assert r.serial_all_s == ()


@pytest.mark.parametrize("backend", ["torch", "pippy"])
def test_cut_before_the_head_sends_a_strided_view(pool2, tiny_spec, backend):
    """A ViT head cut sends ``x[:, 0]``, a strided view: gloo refuses it as a send (torchpippy) and torch's
    pipelining allocates its receive buffer with the traced strides. pipesplit makes the value contiguous
    before the cut, so both runtimes run it."""
    r = pool2.run(plan(tiny_spec, backend, at="head", chunks=2), repeats=1, serial_all=False, timeout_s=120)
    assert r.ok, r.reason
    assert r.boundary_bytes == (8 * 48 * 4,)


@pytest.mark.parametrize("backend", ["torch", "pippy"])
def test_timeline_is_consistent_across_ranks(pool2, tiny_spec, backend):
    """Measured spans on one clock: compute in microbatch order without overlap on a rank, a stage never
    computes a microbatch before the previous stage finished it, a receive and a send per microbatch."""
    from pipeline.stage.timeline import Timeline

    r = pool2.run(plan(tiny_spec, backend, chunks=4), repeats=2, serial_all=False)
    assert r.ok, r.reason
    tl = Timeline.from_result(r)
    assert tl.problems() == []
    assert len(tl.rank(0, "compute")) == len(tl.rank(1, "compute")) == 4
    assert len(tl.rank(1, "recv")) == 4 and len(tl.rank(0, "send")) == 4
    assert tl.rank(0, "recv") == [] and tl.rank(1, "send") == []
    for a, b in zip(tl.rank(1, "recv"), tl.rank(1, "compute")):
        assert a.end <= b.start + 1e-4  # each microbatch is received before it is computed
    assert tl.totals(1)["idle"] >= 0


def test_profile_writes_a_chrome_trace_per_rank(pool2, tiny_spec, tmp_path):
    import json

    r = pool2.run(plan(tiny_spec, chunks=2), repeats=1, serial_all=False, trace_dir=str(tmp_path / "traces"))
    assert r.ok, r.reason
    assert [p.rsplit("/", 1)[-1] for p in r.traces] == ["rank0.json", "rank1.json"]
    for p in r.traces:
        trace = json.loads(open(p).read())
        assert trace["traceEvents"], p


def test_a_plan_that_cannot_build_fails_with_its_reason_and_the_pool_lives(pool2, tiny_spec):
    pids = pool2.pids
    r = pool2.run(plan(tiny_spec, at="blocks.99"), repeats=1)
    assert not r.ok and "could not build its stage" in r.reason and "blocks.99" in r.reason
    assert pool2.pids == pids
    assert pool2.run(plan(tiny_spec), repeats=1).ok


def test_mismatched_plan_is_refused(pool2, tiny_spec):
    three = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.1"), SplitPoint("blocks.2")), chunks=1)
    with pytest.raises(PipesplitError, match="plan runs on 3 ranks but the pool has 2"):
        pool2.run(three)


def test_killed_worker_fails_the_trial_and_the_pool_restarts(pool2, tiny_spec):
    victim = pool2.pids[1]
    restarts = pool2.restarts

    def kill_soon():
        time.sleep(2.0)
        os.kill(victim, signal.SIGKILL)

    threading.Thread(target=kill_soon, daemon=True).start()
    r = pool2.run(plan(tiny_spec, chunks=8), repeats=500, warmup=0, timeout_s=120)
    assert not r.ok
    assert f"rank 1 (pid {victim}) died (signal 9)" in r.reason
    assert pool2.restarts == restarts + 1 and victim not in pool2.pids
    again = pool2.run(plan(tiny_spec), repeats=1)
    assert again.ok, again.reason


def test_hung_trial_times_out_and_the_pool_restarts(pool2, tiny_spec):
    victim = pool2.pids[0]
    os.kill(victim, signal.SIGSTOP)  # a rank that stops answering, as a deadlock would
    try:
        r = pool2.run(plan(tiny_spec), repeats=1, timeout_s=5)
    finally:
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert not r.ok and "did not answer within 5s" in r.reason
    assert pool2.run(plan(tiny_spec), repeats=1).ok


CONVNEXT = {"depths": [1, 1, 1, 1], "dims": [8, 16, 24, 32]}
SWIN = {"img_size": 64, "window_size": 2, "depths": [1, 1, 2, 1], "embed_dim": 24, "num_heads": [1, 1, 2, 2]}


@pytest.mark.parametrize("backend", ["torch", "pippy"])
@pytest.mark.parametrize("name, kwargs, image, cut", [
    ("convnext_tiny", CONVNEXT, 128, "stages.3.blocks.0.mlp.fc1"),  # PiPPy's equal-size cut: after the NHWC permute
    ("convnext_tiny", CONVNEXT, 128, "stages.3.blocks.0.norm:END"),  # an END cut on the permuted activation
    ("swin_tiny_patch4_window7_224", SWIN, None, "layers.2.blocks.1.attn"),  # inside a Swin block
    ("swin_tiny_patch4_window7_224", SWIN, None, "patch_embed.norm"),  # a strided value after the patch flatten
])
def test_any_cut_of_any_layout_arrives_contiguous_on_both_backends(pool2, backend, name, kwargs, image, cut):
    """Every value that crosses a cut arrives in a contiguous buffer (gloo refuses others), wherever the cut
    falls and whatever the layout of the value there."""
    from pipeline.models.build import resolve_spec

    spec = resolve_spec(name, kwargs=kwargs, batch_size=4, image_size=image)
    plan = SplitPlan(model=spec, split_points=(SplitPoint.parse(cut),), chunks=2, backend=backend)
    r = pool2.run(plan, repeats=1, warmup=0, serial_all=False, timeout_s=120)
    assert r.ok, r.reason
    assert r.max_abs_diff <= r.tolerance
