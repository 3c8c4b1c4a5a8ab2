import pytest

from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec


def test_round_trip_keeps_every_field():
    spec = ModelSpec(name="resnet18", kwargs={"num_classes": 7}, batch_size=4, input_shape=(3, 64, 64), seed=3)
    again = ModelSpec.from_dict(spec.to_dict())
    assert again == spec
    assert again.key == spec.key


def test_key_changes_with_kwargs():
    a = ModelSpec(name="resnet18", kwargs={"num_classes": 7})
    b = ModelSpec(name="resnet18", kwargs={"num_classes": 8})
    assert a.key != b.key


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"batch_size": 0}, "batch size must be a positive integer"),
        ({"dtype": "int8"}, "dtype 'int8' is not supported"),
        ({"input_shape": (3, 0, 4)}, "input shape"),
        ({"name": ""}, "model name is empty"),
    ],
)
def test_bad_values_name_themselves(kw, match):
    args = {"name": "resnet18", **kw}
    with pytest.raises(PipesplitError, match=match):
        ModelSpec(**args)


def test_newer_version_is_refused():
    d = ModelSpec(name="resnet18").to_dict()
    d["version"] = 99
    with pytest.raises(PipesplitError, match="version 99"):
        ModelSpec.from_dict(d)


def test_a_mixed_precision_spec_says_version_2_and_others_stay_as_they_were():
    plain = ModelSpec(name="resnet18")
    assert plain.to_dict()["version"] == 1 and "mixed_precision" not in plain.to_dict()
    mixed = ModelSpec(name="resnet18", mixed_precision="bf16")
    assert mixed.to_dict()["version"] == 2 and ModelSpec.from_dict(mixed.to_dict()) == mixed
    assert mixed.key != plain.key  # its profiles, references and studies are its own


@pytest.mark.parametrize("kw, match", [
    ({"mixed_precision": "fp8"}, "mixed precision 'fp8' is not supported: use bf16"),
    ({"mixed_precision": "bf16", "dtype": "bfloat16"}, "keeps float32 weights .* use --dtype float32"),
])
def test_mixed_precision_it_cannot_run_is_one_line(kw, match):
    with pytest.raises(PipesplitError, match=match):
        ModelSpec(name="resnet18", **kw)
