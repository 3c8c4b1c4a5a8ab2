"""pipeline.models.weights: a module's own tensors made by name; a checkpoint read key by key."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_VIT

from pipeline.core.errors import PipesplitError
from pipeline.models.build import build_meta_model, build_model, resolve_spec
from pipeline.models.weights import Checkpoint, materialise_module, whole_model


def _spec(**kw):
    return resolve_spec("deit_tiny_patch16_224", kwargs=TINY_VIT, batch_size=2, **kw)


def test_a_module_gets_only_its_own_tensors_and_their_bytes():
    meta = build_meta_model(_spec())
    block = copy.deepcopy(meta.module.blocks[1])
    made = materialise_module(block, meta, torch.device("cpu"), lambda n: f"blocks.1.{n}")
    want = sum(p.numel() * 4 for p in block.parameters())
    assert made == want
    assert not any(p.is_meta for p in block.parameters())
    assert all(p.is_meta for p in meta.module.parameters())  # the model itself stays on meta
    whole = build_model(_spec())
    assert torch.equal(block.attn.qkv.weight, whole.blocks[1].attn.qkv.weight)


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_a_checkpoint_is_read_key_by_key(tmp_path, fmt):
    model = build_model(_spec())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    path = tmp_path / f"ckpt.{fmt}"
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if fmt == "pt":
        torch.save(state, path)
    else:
        from safetensors.torch import save_file

        save_file(state, str(path))
    meta = build_meta_model(_spec(checkpoint=str(path)))
    read: list[str] = []
    get = meta.given
    assert get is not None
    meta.given = lambda n: read.append(n) or get(n)
    got = meta.materialise(["blocks.2.mlp.fc1.weight"], torch.device("cpu"))
    assert read == ["blocks.2.mlp.fc1.weight"]
    assert torch.equal(got["blocks.2.mlp.fc1.weight"], model.blocks[2].mlp.fc1.weight)
    meta.given = get
    loaded = whole_model(meta, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_a_checkpoint_of_another_shape_is_one_line(tmp_path):
    state = build_model(_spec()).state_dict()
    state["head.weight"] = torch.zeros(3, 3)
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    with pytest.raises(PipesplitError, match="size mismatch for head.weight"):
        Checkpoint(str(path), "tiny").check(build_meta_model(_spec()))
