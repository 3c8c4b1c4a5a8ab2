"""pipeline.factory: a user's own model and example batch, and every way a factory can be wrong."""

import pytest
import torch

from pipeline.candidates import find_candidates
from pipeline.core.errors import PipesplitError
from pipeline.models import build_model, example_input, resolve_spec

FILE = "tests/factories/tiny_mlp.py"


@pytest.mark.parametrize("path", [f"{FILE}:build", "tests.factories.tiny_mlp:build"])
def test_a_factory_by_file_or_module_gives_its_batch_shape_and_candidates(path):
    spec = resolve_spec(path, source="factory", kwargs={"width": 12}, batch_size=None)
    assert (spec.batch_size, spec.input_shape, spec.input_dtype) == (8, (12,), None)
    model = build_model(spec)
    assert model(example_input(spec)).shape == (8, 3)
    assert len(find_candidates(model, spec).blocks) >= 4


@pytest.mark.parametrize("path, kwargs, message", [
    ("tests/factories/nope.py:build", {}, "does not exist"),
    ("no_such_pkg.models:build", {}, "does not import"),
    (f"{FILE}:missing", {}, "has no callable 'missing'"),
    (f"{FILE}:not_a_pair", {}, "returned Linear: it must return \\(model, example_batch\\)"),
    (f"{FILE}:two_inputs", {}, "returned 2 input tensors"),
    (f"{FILE}:build", {"height": 3}, "rejected --model-kwargs"),
    ("justaname", {}, "must name module:function"),
])
def test_a_bad_factory_is_one_line(path, kwargs, message):
    with pytest.raises(PipesplitError, match=message) as e:
        resolve_spec(path, source="factory", kwargs=kwargs, batch_size=None)
    assert "\n" not in str(e.value)


def test_integer_inputs_stay_in_the_examples_range(tmp_path):
    f = tmp_path / "tok.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "def build():\n    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 2)), torch.randint(3, 50, (4, 6))\n")
    spec = resolve_spec(f"{f}:build", source="factory", batch_size=None)
    x = example_input(spec)
    assert x.dtype == torch.int64 and int(x.min()) >= 3 and int(x.max()) < 50 and x.shape == (4, 6)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_factory_model_runs_as_a_two_stage_pipeline(tmp_path, capsys):
    import json

    from pipeline.run import main

    out = tmp_path / "plan.json"
    assert main(["--model-factory", f"{FILE}:build", "--stages", "2", "--policy", "uniform", "--chunks", "2",
                 "--repeats", "1", "--warmup", "0", "--no-serial-all", "--out", str(out)]) == 0
    model = json.loads(out.read_text())["model"]
    assert model["source"] == "factory" and model["name"] == f"{FILE}:build"
    assert main(["--split", str(out), "--repeats", "1", "--warmup", "0", "--no-serial-all"]) == 0
