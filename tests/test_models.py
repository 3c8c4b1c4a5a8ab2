import pytest
import torch

from pipeline.core.errors import PipesplitError
from pipeline.models.batch import example_input
from pipeline.models.build import build_model, resolve_spec
from tests.conftest import TINY_VIT


def test_vit_input_size_comes_from_its_kwargs(tiny_spec):
    assert tiny_spec.input_shape == (3, 32, 32)


def test_cnn_takes_image_size_override():
    spec = resolve_spec("resnet18", image_size=64, batch_size=2)
    assert spec.input_shape == (3, 64, 64)
    assert build_model(spec)(*example_input(spec)).shape == (2, 1000)


def test_fixed_size_model_refuses_image_size_with_the_fix():
    with pytest.raises(PipesplitError, match=r"fixed input size of 32px.*--model-kwargs '\{\"img_size\": 48\}'"):
        resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, image_size=48)


def test_unknown_model_suggests_close_names():
    with pytest.raises(PipesplitError, match=r"unknown timm model 'deit_smal_patch16_224' \(did you mean deit_small"):
        resolve_spec("deit_smal_patch16_224")


def test_bad_kwargs_are_one_line():
    with pytest.raises(PipesplitError, match="rejected --model-kwargs"):
        resolve_spec("resnet18", kwargs={"no_such_arg": 1})


def test_same_seed_same_weights_and_inputs(tiny_spec):
    a, b = build_model(tiny_spec), build_model(tiny_spec)
    (x,) = example_input(tiny_spec)
    assert torch.equal(x, example_input(tiny_spec)[0])
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def test_checkpoint_is_loaded(tmp_path, tiny_spec):
    model = build_model(tiny_spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    path = tmp_path / "ckpt.pt"
    torch.save(model.state_dict(), path)
    spec = resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=8, checkpoint=str(path))
    loaded = build_model(spec)
    assert torch.equal(next(loaded.parameters()), next(model.parameters()))


def test_bad_checkpoints_are_one_line(tmp_path):
    with pytest.raises(PipesplitError, match="does not exist"):
        resolve_spec("resnet18", checkpoint=str(tmp_path / "nope.pt"))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    spec = resolve_spec("resnet18", checkpoint=str(junk))
    with pytest.raises(PipesplitError, match="could not be read"):
        build_model(spec)
    other = tmp_path / "other.pt"
    torch.save({"fc.weight": torch.zeros(3, 3)}, other)
    with pytest.raises(PipesplitError, match="does not fit resnet18"):
        build_model(resolve_spec("resnet18", checkpoint=str(other)))
