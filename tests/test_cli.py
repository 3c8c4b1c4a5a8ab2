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
