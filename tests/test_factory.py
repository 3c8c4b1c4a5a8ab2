"""pipeline.models.factory: a user's own model and example batch, and every way a factory can be wrong."""

import pytest
import torch

from pipeline.core.errors import PipesplitError
from pipeline.models.batch import example_input
from pipeline.models.build import build_model, resolve_spec
from pipeline.models.candidates import find_candidates

FILE = "tests/factories/tiny_mlp.py"


@pytest.mark.parametrize("path", [f"{FILE}:build", "tests.factories.tiny_mlp:build"])
def test_a_factory_by_file_or_module_gives_its_batch_shape_and_candidates(path):
    spec = resolve_spec(path, source="factory", kwargs={"width": 12}, batch_size=None)
    assert (spec.batch_size, spec.input_shape, spec.input_dtype) == (8, (12,), None)
    model = build_model(spec)
    assert model(*example_input(spec)).shape == (8, 3)
    assert len(find_candidates(model, spec).blocks) >= 4


@pytest.mark.parametrize("path, kwargs, message", [
    ("tests/factories/nope.py:build", {}, "does not exist"),
    ("no_such_pkg.models:build", {}, "does not import"),
    (f"{FILE}:missing", {}, "has no callable 'missing'"),
    (f"{FILE}:not_a_pair", {}, "returned Linear: it must return \\(model, example_batch\\)"),
    (f"{FILE}:uneven", {}, "input 1 has 3 samples, input 0 has 4"),
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
    (x,) = example_input(spec)
    assert x.dtype == torch.int64 and int(x.min()) >= 3 and int(x.max()) < 50 and x.shape == (4, 6)


def test_a_factory_with_two_inputs_describes_both():
    spec = resolve_spec(f"{FILE}:masked", source="factory", batch_size=None)
    assert spec.input_shape == (6,) and spec.input_dtype == "int64" and 0 < spec.input_high <= 50
    (mask,) = spec.extra_inputs
    assert (mask.shape, mask.dtype) == ((6,), "bool")
    ids, m = example_input(spec)
    assert ids.shape == m.shape == (8, 6) and m.dtype == torch.bool
    assert build_model(spec)(ids, m).shape == (8, 3)
    assert "extra_inputs" not in resolve_spec(f"{FILE}:build", source="factory", batch_size=None).to_dict()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["torch", "pippy"])
def test_a_two_input_factory_runs_split_and_reruns_from_its_plan(tmp_path, backend):
    import json

    from pipeline.run import main

    out = tmp_path / "plan.json"
    assert main(["--model-factory", f"{FILE}:masked", "--stages", "2", "--split-points", "blocks.2", "--chunks", "2",
                 "--backend", backend, "--repeats", "1", "--warmup", "0", "--no-serial-all", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["model"]["extra_inputs"] == [{"shape": [6], "dtype": "bool", "low": 0, "high": None}]
    assert doc["measured"]["max_abs_diff"] <= 1e-4
    assert doc["model"]["source"] == "factory" and doc["model"]["name"] == f"{FILE}:masked"
    if backend == "torch":
        assert main(["--split", str(out), "--repeats", "1", "--warmup", "0", "--no-serial-all"]) == 0
