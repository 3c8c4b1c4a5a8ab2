import dataclasses
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SCHEDULES, SplitPlan, SplitPoint, check_ranks, schedule_rule
from pipeline.core.spec import ModelSpec

SPEC = ModelSpec(name="deit_small_patch16_224", batch_size=32)


def plan(**kw):
    args = {"model": SPEC, "split_points": (SplitPoint("blocks.6"),), "chunks": 16}
    args.update(kw)
    return SplitPlan(**args)


def test_json_round_trip(tmp_path):
    p = plan(split_points=(SplitPoint("blocks.4"), SplitPoint("blocks.8", "END")), backend="pippy")
    path = tmp_path / "plan.json"
    p.save(path)
    assert SplitPlan.load(path) == p
    d = json.loads(path.read_text())
    assert d["stages"] == 3
    assert d["split_points"] == [{"fqn": "blocks.4", "kind": "BEGINNING"}, {"fqn": "blocks.8", "kind": "END"}]


def test_reads_best_split_shape_with_extra_keys():
    d = plan().to_dict() | {"measured": {"speedup": 1.9}, "predicted": {}, "provenance": {}}
    assert SplitPlan.from_dict(d) == plan()


def test_split_spec_is_what_annotate_split_points_takes():
    assert plan().split_spec() == {"blocks.6": "BEGINNING"}
    assert SplitPoint.parse("blocks.2:end") == SplitPoint("blocks.2", "END")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"chunks": 0}, r"chunks must be a positive integer \(got 0\)"),
        ({"chunks": 5}, r"chunks 5 does not divide batch size 32: use one of \[1, 2, 4, 8, 16, 32\]"),
        ({"backend": "deepspeed"}, "backend 'deepspeed' is unknown"),
        ({"schedule": "Zigzag"}, "schedule 'Zigzag' is not supported"),
        ({"backend": "pippy", "schedule": "1F1B"}, "torchpippy runs only GPipe"),
        ({"device": "tpu"}, "device 'tpu' is unknown"),
        ({"threads_per_stage": 0}, "threads per stage"),
        ({"split_points": (SplitPoint("blocks.6"), SplitPoint("blocks.6"))}, "blocks.6:BEGINNING is repeated"),
    ],
)
def test_static_validation(kw, match):
    with pytest.raises(PipesplitError, match=match):
        plan(**kw)


def test_bad_kind():
    with pytest.raises(PipesplitError, match="kind 'MIDDLE'"):
        SplitPoint("blocks.1", "MIDDLE")


def test_stage_count_must_match_split_points():
    d = plan().to_dict()
    d["stages"] = 4
    with pytest.raises(PipesplitError, match="says 4 stages but its 1 split points make 2 stages on 2 ranks"):
        SplitPlan.from_dict(d)


def test_a_version_1_plan_counts_stages_as_pieces_and_loads_as_it_did():
    """Plan files before version 2 said ``stages`` for every piece and wrote ``stages_per_rank`` only when not
    1: such a file with V = 2 loads as the same plan (4 stages on 2 ranks), and a version-2 file of it says
    ``stages`` 2; a file without a version may say either."""
    p = plan(split_points=tuple(SplitPoint(f"blocks.{i}") for i in (3, 6, 9)), chunks=8, schedule="Interleaved1F1B",
             stages_per_rank=2)
    old = {k: v for k, v in p.to_dict().items() if k != "total_stages"}
    old.update(version=1, stages=4)
    assert SplitPlan.from_dict(old) == p and (p.stages, p.ranks) == (4, 2)
    with pytest.raises(PipesplitError, match="says 2 stages but its 3 split points make 4 stages on 2 ranks, 2 per rank"):
        SplitPlan.from_dict({**old, "stages": 2})
    for stages in (2, 4):
        assert SplitPlan.from_dict({k: v for k, v in {**old, "stages": stages}.items() if k != "version"}) == p


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(PipesplitError, match="does not exist"):
        SplitPlan.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PipesplitError, match="not valid JSON"):
        SplitPlan.load(bad)
    bad.write_text('{"chunks": 2}')
    with pytest.raises(PipesplitError, match="no 'model' key"):
        SplitPlan.load(bad)


@settings(max_examples=200, deadline=None)
@given(schedule=st.sampled_from(SCHEDULES), ranks=st.integers(1, 4), per=st.integers(1, 3), chunks=st.integers(1, 12))
def test_a_schedule_the_rules_allow_places_every_stage_on_exactly_one_rank(schedule, ranks, per, chunks):
    stages = ranks * per
    assume(stages >= 2 and schedule_rule(schedule, stages, per, chunks, "train") is None)
    p = SplitPlan(model=ModelSpec(name="m", batch_size=chunks), split_points=tuple(SplitPoint(f"b{i}") for i in
                  range(1, stages)), chunks=chunks, schedule=schedule, stages_per_rank=per, mode="train")
    held = [s for r in range(p.ranks) for s in p.rank_stages(r)]
    assert p.ranks == ranks and sorted(held) == list(range(stages))
    assert 0 in p.rank_stages(0) and stages - 1 in p.rank_stages(p.last_rank)


@pytest.mark.parametrize("schedule, stages, per, chunks, rule", [
    ("GPipe", 4, 2, 4, "runs one stage per rank"),
    ("ZBVZeroBubble", 6, 3, 6, "exactly 2 stages per rank"),
    ("DualPipeV", 4, 2, 2, "DualPipeV needs at least as many chunks as stages"),
    ("Interleaved1F1B", 4, 2, 5, "multiple of its rounds"),
    ("Interleaved1F1B", 5, 2, 4, "do not split into 2 per rank"),
    ("1F1B", 2, 1, 1, "1F1B needs at least as many chunks as stages"),
    ("ZBVZeroBubble", 4, 2, 4, "ZBVZeroBubble trains only"),
])
def test_an_infeasible_schedule_is_refused_by_construction_with_its_rule(schedule, stages, per, chunks, rule):
    mode = "infer" if "trains only" in rule else "train"
    assert rule in schedule_rule(schedule, stages, per, chunks, mode)
    with pytest.raises(PipesplitError, match=rule):
        SplitPlan(model=ModelSpec(name="m", batch_size=60), split_points=tuple(SplitPoint(f"b{i}") for i in
                  range(1, stages)), chunks=chunks, schedule=schedule, stages_per_rank=per, mode=mode)


def test_virtual_stages_round_trip_and_name_their_placement():
    p = plan(split_points=tuple(SplitPoint(f"blocks.{i}") for i in (3, 6, 9)), chunks=8, schedule="Interleaved1F1B",
             stages_per_rank=2)
    assert (p.ranks, p.rank_stages(0), p.rank_stages(1), p.last_rank) == (2, (0, 2), (1, 3), 1)
    d = p.to_dict()
    assert (d["version"], d["stages"], d["stages_per_rank"], d["total_stages"]) == (3, 2, 2, 4)
    assert SplitPlan.from_dict(json.loads(json.dumps(d))) == p and "4 stages on 2 ranks, 2 per rank" in p.describe()
    v = dataclasses.replace(p, schedule="ZBVZeroBubble", mode="train")
    assert (v.rank_stages(0), v.rank_stages(1), v.last_rank) == ((0, 3), (1, 2), 0)


@given(st.integers(-2, 6), st.integers(-1, 4))
def test_ranks_are_refused_in_one_line_exactly_when_they_cannot_make_a_pipeline(stages, per_rank):
    bad = stages < 2 or per_rank < 1
    try:
        check_ranks(stages, per_rank)
    except PipesplitError as e:
        assert bad and "\n" not in str(e)
        if per_rank >= 1:
            assert str(e).startswith(f"a pipeline needs at least 2 ranks: --stages {stages}") and "use --stages 2" in str(e)
    else:
        assert not bad


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 4]), st.sampled_from([(1, "GPipe"), (2, "Interleaved1F1B"), (3, "LoopedBFS")]))
def test_every_plan_file_states_ranks_and_pieces_and_reads_back_in_both_versions(ranks, layout):
    per, schedule = layout
    pieces = ranks * per
    p = plan(split_points=tuple(SplitPoint(f"blocks.{i}") for i in range(1, pieces)), chunks=8,
             schedule=schedule, stages_per_rank=per)
    d = p.to_dict()
    assert (d["stages"], d["stages_per_rank"], d["total_stages"]) == (ranks, per, pieces) == (p.ranks, per, p.stages)
    assert SplitPlan.from_dict(d) == p
    v1 = {k: v for k, v in d.items() if k != "total_stages"}
    v1.update(version=1, stages=pieces)
    assert SplitPlan.from_dict(v1) == p


def test_a_training_plan_file_carries_its_recomputation_and_older_files_load_as_none(tmp_path):
    p = plan(mode="train", recompute="1,0")
    d = p.to_dict()
    assert d["version"] == 3 and d["recompute"] == [1, 0] and SplitPlan.from_dict(d) == p
    assert SplitPlan.from_dict({**d, "recompute": "full"}).recompute == "full"
    old = {k: v for k, v in d.items() if k != "recompute"} | {"version": 2}
    assert SplitPlan.from_dict(old).recompute == "none"
    assert "recompute, 1,0" not in p.describe() and "recompute 1,0" in p.describe()
    assert "recompute" not in plan().to_dict()  # inference: no backward to recompute for
    assert plan(recompute="full").recompute == "none"


@pytest.mark.parametrize("value, message", [("2,x", "is not a recomputation"), ("1,0,1", "gives 3 counts for 2 stages"),
                                            ([-1, 0], "is not a recomputation")])
def test_a_bad_recomputation_in_a_plan_is_one_line(value, message):
    with pytest.raises(PipesplitError, match=message):
        plan(mode="train", recompute=value)


def test_mixed_precision_is_a_training_plans_and_says_so():
    import dataclasses

    mixed = dataclasses.replace(SPEC, mixed_precision="bf16")
    plan = SplitPlan(model=mixed, split_points=(SplitPoint("blocks.6"),), chunks=2, mode="train")
    assert "bf16 mixed precision" in plan.describe() and SplitPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(PipesplitError, match="is how a training step computes: use --mode train"):
        SplitPlan(model=mixed, split_points=(SplitPoint("blocks.6"),), chunks=2)
