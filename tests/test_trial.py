"""One trial's protocol on real ranks: what is timed, on which rank, and what a failed check reports."""

import math

import pytest

from pipeline.core.plan import SplitPlan, SplitPoint

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_only_rank_0_times_the_serial_model_and_repeats_are_counted(pool2, tiny_spec):
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.1"),), chunks=4)
    r = pool2.run(plan, repeats=3, warmup=0, serial=True, serial_all=False)
    assert r.ok, r.reason
    # rank 0 holds the whole model to time it: its own output (its first serial run's) is what the check compares
    assert r.check is not None and r.check.streamed_diff is None and r.check.whole_diff is not None
    assert r.check.whole_diff == r.check.diff <= r.check.tolerance
    assert len(r.serial_s) == len(r.pipeline_s) == 3 and r.serial_all_s == ()
    assert all(not math.isnan(s) for s in r.serial_s) and r.busy_s <= r.wall_s
    r = pool2.run(plan, repeats=1, warmup=0, serial=False, serial_all=False)
    assert r.ok and r.serial_s == () and math.isnan(r.speedup)
    # no rank holds the whole model: the streamed reference is made and compared with
    assert r.check is not None and r.check.whole_diff is None and r.check.streamed_diff == r.check.diff <= r.check.tolerance


@pytest.mark.parametrize("backend", ["torch", "pippy"])
def test_a_kept_stage_takes_more_repeats_without_building_again(pool2, tiny_spec, backend):
    from pipeline.core.result import merged

    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2, backend=backend)
    first = pool2.run(plan, repeats=1, warmup=0, serial_all=False, keep=True)
    more = pool2.run(plan, repeats=2, warmup=0, serial_all=False, resume=True, keep=True)
    assert first.ok and more.ok, (first.reason, more.reason)
    assert more.build_s < first.build_s / 5 and more.max_abs_diff == first.max_abs_diff
    assert len(more.comm_events[1]) == len(first.comm_events[1])  # a re-hooked stage is timed once, not twice
    both = merged([first, more])
    assert len(both.pipeline_s) == 3 and both.build_s == first.build_s
    other = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.1"),), chunks=2, backend=backend)
    fresh = pool2.run(other, repeats=1, warmup=0, serial_all=False, resume=True)  # nothing kept for it: built
    assert fresh.ok and fresh.build_s > more.build_s


@pytest.mark.parametrize("backend", ["torch", "pippy"])
def test_the_first_timed_repeat_can_be_the_checked_run(pool2, tiny_spec, backend):
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.1"),), chunks=2, backend=backend)
    apart = pool2.run(plan, repeats=2, warmup=0, serial_all=False)
    first = pool2.run(plan, repeats=2, warmup=0, serial_all=False, check_first_repeat=True)
    assert apart.ok and first.ok, (apart.reason, first.reason)
    assert first.max_abs_diff <= first.tolerance and len(first.pipeline_s) == 2
    assert first.boundary_bytes == apart.boundary_bytes and first.breakdown is not None
    # (that the check then costs no run of its own is a timing: benchmarks/trial_overhead.py shows it)


def test_a_stage_from_the_cached_export_or_a_fresh_trace_gives_the_same_output(pool2, tiny_spec):
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2.attn"),), chunks=2)
    cached = pool2.run(plan, repeats=1, warmup=0, serial_all=False)
    fresh = pool2.run(plan, repeats=1, warmup=0, serial_all=False, cached_trace=False)
    assert cached.ok and fresh.ok, (cached.reason, fresh.reason)
    assert cached.max_abs_diff == fresh.max_abs_diff <= cached.tolerance


def test_a_rank_reuses_what_its_last_stage_left_and_a_reused_stage_equals_a_fresh_one(pool2, tiny_spec):
    a = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.1"),), chunks=2)
    b = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.3"),), chunks=4)
    train = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.3"),), chunks=4, mode="train")
    run = dict(repeats=1, warmup=0, serial_all=False)
    assert pool2.run(a, **run).ok
    moved = pool2.run(b, **run)
    assert moved.ok, moved.reason  # checked, as every trial is
    # rank 0 had patch_embed..blocks.0 and now holds patch_embed..blocks.2: it made blocks 1 and 2 only;
    # rank 1 had blocks.1..head and holds blocks.3..head: all of it was kept
    assert 0 < moved.reused_bytes[0] < moved.stage_bytes[0] and moved.reused_bytes[1] == moved.stage_bytes[1]
    trained = pool2.run(train, **run)  # a training step changes its parameters: it keeps and reuses nothing
    assert trained.ok and trained.reused_bytes == (0, 0)
    fresh = pool2.run(b, **run)
    assert fresh.ok and fresh.reused_bytes == (0, 0)
    assert fresh.check is not None and moved.check is not None
    assert fresh.max_abs_diff == moved.max_abs_diff and fresh.check.whole_diff == moved.check.whole_diff is not None
    again = pool2.run(b, **run)
    assert again.reused_bytes == again.stage_bytes and again.max_abs_diff == fresh.max_abs_diff


def test_a_training_reference_is_made_once_and_every_later_plan_is_still_checked_against_it(pool2, tiny_spec):
    import dataclasses

    spec = dataclasses.replace(tiny_spec, seed=11)  # a model no other test's trial made a reference for
    run = dict(repeats=1, warmup=0, serial_all=False)
    plans = [SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=chunks, mode="train", schedule=schedule)
             for cut, chunks, schedule in (("blocks.1", 2, "GPipe"), ("blocks.3", 4, "1F1B"), ("blocks.2", 2, "GPipe"))]
    results = [pool2.run(p, **run) for p in plans]
    assert all(r.ok for r in results), [r.reason for r in results]
    checks = [r.check for r in results]
    assert [c.reference_made for c in checks] == [True, False, False]  # the step does not depend on the split
    assert all(c.compared == "loss and gradients" and c.gradients > 0 and c.diff <= c.tolerance for c in checks)


def test_a_studys_reference_file_outlives_its_pool_and_a_damaged_one_is_made_again(pool2, tiny_spec, tmp_path):
    import dataclasses

    import torch

    from pipeline.ranks.pooling import references_in

    spec = dataclasses.replace(tiny_spec, seed=12)  # a model no other test made a reference for
    run = dict(repeats=1, warmup=0, serial_all=False)
    train = [SplitPlan(model=spec, split_points=(SplitPoint(cut),), chunks=2, mode="train")
             for cut in ("blocks.1", "blocks.3")]
    infer = SplitPlan(model=spec, split_points=(SplitPoint("blocks.2"),), chunks=2)
    with references_in(pool2, str(tmp_path)):
        made = [pool2.run(train[0], **run), pool2.run(infer, serial=False, **run)]  # serial=False: streamed
        pool2.restart()  # the new ranks hold nothing: they read the study's files
        read = [pool2.run(train[1], **run), pool2.run(infer, serial=False, **run)]
        for f in tmp_path.glob("*.pt"):  # every file still loads, one value in it changed
            held = torch.load(f, weights_only=True)
            next(iter(held.values())).view(-1)[0] += 1.0
            torch.save(held, f)
        pool2.restart()
        remade = [pool2.run(train[1], **run), pool2.run(infer, serial=False, **run)]
    assert pool2.reference_dir is None  # the lent pool goes back as it came
    results = made + read + remade
    assert all(r.ok for r in results), [r.reason for r in results]
    assert all(r.check.diff <= r.check.tolerance for r in results)  # every trial checked
    assert [r.check.reference_made for r in results] == [True, True, False, False, True, True]
    assert len(list(tmp_path.glob("*.pt"))) == len(list(tmp_path.glob("*.json"))) == 2
