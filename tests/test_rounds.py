"""Interleaved rounds on a real pool: every plan once per round, a failing plan dropped after its failure."""

import pytest

from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.rounds import interleaved

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_rounds_interleave_and_drop_a_failed_plan(pool2, tiny_spec):
    good = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2)
    bad = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.99"),), chunks=2)
    order = []
    runs = interleaved(pool2, [good, bad], 2, repeats=1, drop_failed=True, tick=lambda i, r: order.append((i, r)))
    assert [i for i, _ in order] == [0, 1, 0, 1] and order[3][1] is None  # the bad plan ran once
    assert len(runs.results[0]) == 2 and runs.results[1] == () and "could not build" in runs.failures[1]
    assert len(runs.speedups(0)) == 2 and runs.last(0) is runs.results[0][-1]
