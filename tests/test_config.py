"""SearchConfig: the cheap checks happen before anything is built or measured."""

import pytest

from pipeline.cli import ModelArgs
from pipeline.core.errors import PipesplitError
from pipeline.core.plan import parse_chunks
from search.optimize import build_parser
from search.study.config import SearchConfig, default_study_name


def test_flags_become_a_frozen_config():
    args = build_parser("p", "", "").parse_args(["--stages", "3", "--chunks", "2,4", "--no-prune", "--trace"])
    cfg = SearchConfig.from_args(args, args.stages)
    assert (cfg.stages, cfg.chunks, cfg.prune, cfg.trace, cfg.model.name) == (3, (2, 4), False, True,
                                                                                 "deit_small_patch16_224")
    with pytest.raises(AttributeError):
        cfg.stages = 2  # type: ignore[misc]


@pytest.mark.parametrize("kw, message", [
    ({"stages": 1}, "a pipeline needs at least 2 ranks: --stages 1 is one rank; use --stages 2"),
    ({"trials": 0}, "--trials must be at least 1"),
    ({"repeats": 0}, "--repeats must be at least 1"),
    ({"timeout_s": -1}, "--timeout must be a positive number"),
    ({"min_trial_seconds": float("nan")}, "--min-trial-seconds must be 0 or more"),
    ({"objective": "latency"}, "--objective latency is not one this search knows"),
    ({"backend": "pippy", "schedules": ("GPipe", "1F1B")}, "torchpippy runs only GPipe"),
    ({"model": ModelArgs(mixed_precision="bf16")}, "--mixed-precision bf16 is how a training step computes: use "
                                                  "--mode train"),
])
def test_bad_settings_are_one_line(kw, message):
    with pytest.raises(PipesplitError, match=message):
        SearchConfig(**kw)


def test_chunks_and_study_names():
    assert parse_chunks("1, 4,16") == (1, 4, 16)
    with pytest.raises(PipesplitError, match="must be comma-separated integers"):
        parse_chunks("a,b")
    assert default_study_name("m", 2, 8, "cpu", "block") == "m-s2-b8-cpu"
    assert default_study_name("m", 2, 8, "cpu", "layer") == "m-s2-b8-cpu-layer"
    assert default_study_name("m", 2, 8, "cpu", "block", "train", "bf16") == "m-s2-b8-cpu-train-bf16"


@pytest.mark.parametrize("flags, objective, two", [
    ([], None, False), (["--objective", "throughput"], "throughput", False),
    (["--objectives", "throughput,memory"], "throughput", True), (["--objectives", "speedup"], "speedup", False),
    (["--max-stage-memory", "2GiB"], None, False),
])
def test_the_ranked_figure_and_the_memory_objective_from_the_flags(flags, objective, two):
    args = build_parser("p", "", "").parse_args(flags)
    cfg = SearchConfig.from_args(args, 4)
    assert (cfg.objective, cfg.memory_objective) == (objective, two)
    if "--max-stage-memory" in flags:  # the older spelling of the one memory limit
        assert cfg.device_memory == 2 * 2**30
