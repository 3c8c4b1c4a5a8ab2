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
