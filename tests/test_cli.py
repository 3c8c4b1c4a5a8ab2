"""The shared model flags: ModelArgs before the model is built, and its one-line errors."""

import argparse

import pytest

from pipeline.cli import ModelArgs, add_model_args, parse_kwargs
from pipeline.core.errors import PipesplitError


def test_flags_become_model_args_with_defaults():
    p = argparse.ArgumentParser()
    add_model_args(p)
    m = ModelArgs.from_args(p.parse_args(["--model-kwargs", '{"depth": 2}', "--batch-size", "4"]))
    assert (m.name, m.kwargs, m.batch_size, m.seed, m.granularity) == ("deit_small_patch16_224", {"depth": 2}, 4, 0,
                                                                       "block")


@pytest.mark.parametrize("text, message", [("{depth: 2}", "not valid JSON"), ("[1]", "must be a JSON object")])
def test_bad_model_kwargs_are_one_line(text, message):
    with pytest.raises(PipesplitError, match=message):
        parse_kwargs(text)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_stages_and_stages_per_rank_mean_the_same_ranks_and_pieces_in_every_command(tmp_path):
    """--stages 2 --stages-per-rank 2: 2 ranks holding 4 stages in pipeline.run, search.optimize and
    costmodel.validate alike (a real validation run of one plan)."""
    import json

    from costmodel.validate import main as validate
    from pipeline.run import parser, plan_from_args
    from search.optimize import parser as search_parser
    from search.plans.layouts import choose_layouts
    from search.study.config import SearchConfig
    from tests.conftest import TINY_VIT_ARGS

    flags = ["--stages", "2", "--stages-per-rank", "2", "--schedule", "Interleaved1F1B"]
    plan = plan_from_args(parser().parse_args([*TINY_VIT_ARGS, *flags, "--policy", "uniform", "--chunks", "4"]))
    assert (plan.ranks, plan.stages) == (2, 4) and "4 stages on 2 ranks, 2 per rank" in plan.describe()

    cfg = SearchConfig.from_args(search_parser().parse_args([*TINY_VIT_ARGS, *flags, "--chunks", "4"]), 2)
    choice = choose_layouts(cfg.schedules, cfg.stages_per_rank, ranks=cfg.stages, mode=cfg.mode, chunks=[4],
                            segments=7)
    (layout,) = choice.layouts
    assert (cfg.stages, cfg.stages * layout.per_rank) == (2, 4)

    out = tmp_path / "v.json"
    assert validate([*TINY_VIT_ARGS, *flags, "--mode", "train", "--chunks", "4", "--cuts", "1", "--rounds", "1",
                     "--repeats", "1", "--out", str(out)]) == 0
    (record,) = json.loads(out.read_text())["plans"]
    assert (record["plan"]["stages"], record["plan"]["stages_per_rank"], record["plan"]["total_stages"]) == (2, 2, 4)
