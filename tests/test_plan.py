import json

import pytest

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
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
    with pytest.raises(PipesplitError, match="says 4 stages but has 1 split points"):
        SplitPlan.from_dict(d)


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
