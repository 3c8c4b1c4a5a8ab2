"""Timeline: spans on one clock, consistency checks and the Gantt chart (pure; no processes)."""

import dataclasses

import pytest

from pipeline.stage.timeline import Span, Timeline, render
from tests.conftest import good_timeline as good


def test_spans_are_numbered_per_kind_and_sorted():
    tl = good()
    assert tl.stages == 2
    assert [s.microbatch for s in tl.rank(1, "recv")] == [0, 1]
    assert tl.rank(0, "send_wait")[0].microbatch == -1
    assert [s.start for s in tl.rank(0)] == sorted(s.start for s in tl.rank(0))
    assert Timeline.from_dict(tl.to_dict()) == tl


def test_a_consistent_timeline_has_no_problems_and_idle_fills_the_rest():
    tl = good()
    assert tl.problems() == []
    t = tl.totals(0)
    assert t["compute"] == pytest.approx(1.9)
    assert t["idle"] == pytest.approx(3.0 - 2.1)  # rank 0 is busy 0-1.05, 1.1-2.05 and 2.1-2.2 of 0-3.0


@pytest.mark.parametrize("compute, message", [
    ([[(0, 0.0, 1.0), (1, 0.5, 2.0)], []], "microbatch 1 starts before 0 ends"),
    ([[(1, 0.0, 1.0), (0, 1.0, 2.0)], []], "not microbatches 0..1 in order"),
    ([[(0, 0.0, 1.0)], [(0, 0.5, 1.5)]], "starts 0.5000s before rank 0 finished it"),
])
def test_inconsistent_timelines_are_caught(compute, message):
    problems = Timeline.from_events(compute).problems()
    assert any(message in p for p in problems), problems


def test_render_writes_a_png(tmp_path):
    import matplotlib.image

    path = render(good(), tmp_path / "sub" / "t.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).shape[0] > 100
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp file left


def test_span_duration():
    assert Span(0, "compute", 0, 1.0, 1.5).duration == 0.5


def test_a_training_run_draws_backward_and_weight_grad_spans_beside_the_forwards(tmp_path):
    work = [[("0F0", 0.0, 1.0), ("0I0", 2.0, 2.5), ("0W0", 2.5, 3.0)], [("1F0", 1.1, 1.9), ("1B0", 1.9, 2.0)]]
    tl = Timeline.from_events([[(0, 0.0, 1.0)], [(0, 1.1, 1.9)]], [], work)
    assert [(s.kind, s.microbatch) for s in tl.rank(0)] == [("compute", 0), ("backward", 0), ("weight_grad", 0)]
    assert tl.totals(1)["backward"] == pytest.approx(0.1) and tl.problems() == []
    assert render(tl, tmp_path / "t.png").stat().st_size > 0


def test_a_recomputing_ranks_row_says_what_its_backwards_recompute(tmp_path, tiny_spec):
    from pipeline.core.plan import SplitPlan, SplitPoint
    from pipeline.stage.timeline import recompute_notes

    plan = SplitPlan(model=tiny_spec, split_points=(SplitPoint("blocks.2"),), chunks=2, mode="train", recompute="2,0")
    assert recompute_notes(plan) == ("backward recomputes 2 blocks", "")
    assert recompute_notes(dataclasses.replace(plan, recompute="full")) == ("backward recomputes every block",) * 2
    assert recompute_notes(dataclasses.replace(plan, recompute="none")) == ()
    t = dataclasses.replace(good(), rank_notes=recompute_notes(plan))
    assert render(t, tmp_path / "t.png").exists()
