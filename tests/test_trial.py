"""One trial's protocol on real ranks: what is timed, on which rank, and what a failed check reports."""

import math

import pytest

from pipeline.core.plan import SplitPlan, SplitPoint

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_only_rank_0_times_the_serial_model_and_repeats_are_counted(pool2, tiny_spec):
    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.1"),), chunks=4)
    r = pool2.run(plan, repeats=3, warmup=0, serial=True, serial_all=False)
    assert r.ok, r.reason
    assert len(r.serial_s) == len(r.pipeline_s) == 3 and r.serial_all_s == ()
    assert all(not math.isnan(s) for s in r.serial_s) and r.busy_s <= r.wall_s
    r = pool2.run(plan, repeats=1, warmup=0, serial=False, serial_all=False)
    assert r.ok and r.serial_s == () and math.isnan(r.speedup)
