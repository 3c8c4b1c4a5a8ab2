"""pipeline.models.meta: a model built on meta and any of its tensors made by name, as an eager build makes them."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_VIT

from pipeline.models.build import _create, build_meta_model, build_model, resolve_spec
from pipeline.models.meta import build_meta, storage_key

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 32}
LLAMA = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
         "num_key_value_heads": 1, "vocab_size": 128}
FAMILIES = [
    ("deit_tiny_patch16_224", "timm", TINY_VIT),  # a ViT: trunc-normal, zeros, a pos_embed
    ("test_resnet", "timm", {"num_classes": 10}),  # a CNN with BatchNorm's running statistics
    ("llama", "hf", LLAMA),  # rotary inv_freq, HF's _init_weights
    ("gpt2", "hf", GPT2),  # tied embeddings
    ("tests/factories/tiny_mlp.py:build", "factory", {"width": 12}),
]


def _spec(name, source, kwargs):
    return resolve_spec(name, source=source, kwargs=kwargs, batch_size=None if source == "factory" else 2,
                        **({"seq_len": 8} if source == "hf" else {}))


def _eager(spec):
    """The model as its own code builds it, on the CPU, from torch's global generator."""
    torch.manual_seed(spec.seed)
    return _create(spec).eval()


@pytest.mark.parametrize("name, source, kwargs", FAMILIES)
def test_every_tensor_is_made_as_the_models_own_code_makes_it(name, source, kwargs):
    spec = _spec(name, source, kwargs)
    meta = build_meta_model(spec)
    eager = dict(_eager(spec).state_dict(keep_vars=True))
    real = meta.materialise(list(meta.tensors), torch.device("cpu"))
    assert set(real) >= set(eager)
    assert all(meta.tensors[n].is_meta for n in meta.tensors)
    for n, e in eager.items():
        r = real[n]
        assert r.shape == e.shape and r.dtype == e.dtype, n
        e = e.detach()
        if not isinstance(e, torch.nn.Parameter) and n in dict(_eager(spec).named_buffers()):
            assert torch.equal(r, e), f"buffer {n} differs from the eager build's"  # computed, not drawn
        elif e.numel() < 2 or not e.is_floating_point() or float(e.float().std()) == 0.0:
            assert torch.equal(r, e), f"{n}: a constant init differs"
        elif e.numel() < 256:  # drawn, too few to compare moments: the same scale
            assert float(r.abs().max()) <= 2 * float(e.abs().max()) + 1e-6, n
        else:  # drawn: the same distribution (the model's own scheme), from a generator of its own name
            std = float(e.float().std())
            assert abs(float(r.float().std()) - std) < 0.25 * std + 1e-6, n
            assert abs(float(r.float().mean()) - float(e.float().mean())) < 0.25 * std + 1e-3, n


@pytest.mark.parametrize("name, source, kwargs", FAMILIES)
def test_any_subset_of_names_gets_the_same_values_as_the_whole_model(name, source, kwargs):
    spec = _spec(name, source, kwargs)
    meta = build_meta_model(spec)
    whole = dict(build_model(spec).state_dict())
    names = sorted(whole)
    for part in (names[: len(names) // 3], names[len(names) // 3:][::2], names[-1:]):
        got = meta.materialise(part, torch.device("cpu"))
        for n in part:
            assert torch.equal(got[n], whole[n]), n


def test_a_tied_weight_is_one_storage_made_once():
    spec = _spec("gpt2", "hf", GPT2)
    meta = build_meta_model(spec)
    assert storage_key(meta.tensors["lm_head.weight"]) == storage_key(meta.tensors["transformer.wte.weight"])
    got = meta.materialise(["lm_head.weight"], torch.device("cpu"))
    assert torch.equal(got["lm_head.weight"], meta.materialise(["transformer.wte.weight"], torch.device("cpu"))
                       ["transformer.wte.weight"])
    model = build_model(spec)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_the_seed_changes_every_drawn_weight_and_bfloat16_keeps_the_draws():
    spec = _spec("deit_tiny_patch16_224", "timm", TINY_VIT)
    a = build_meta_model(spec).materialise(["blocks.0.attn.qkv.weight"], torch.device("cpu"))["blocks.0.attn.qkv.weight"]
    other = build_meta(lambda: _create(spec), 1, torch.float32)
    b = other.materialise(["blocks.0.attn.qkv.weight"], torch.device("cpu"))["blocks.0.attn.qkv.weight"]
    assert not torch.equal(a, b)
    half = build_meta(lambda: _create(spec), 0, torch.bfloat16)
    c = half.materialise(["blocks.0.attn.qkv.weight"], torch.device("cpu"))["blocks.0.attn.qkv.weight"]
    assert c.dtype == torch.bfloat16 and torch.equal(c, a.to(torch.bfloat16))


def test_nbytes_counts_a_shared_storage_once():
    meta = build_meta_model(_spec("gpt2", "hf", GPT2))
    one = meta.nbytes(["transformer.wte.weight"])
    assert one == 128 * 32 * 4
    assert meta.nbytes(["transformer.wte.weight", "lm_head.weight"]) == one


def test_a_model_whose_code_cannot_run_on_meta_is_built_whole_with_one_line(tmp_path):
    f = tmp_path / "cpu_only.py"
    f.write_text("import torch\nfrom torch import nn\n\n"
                 "class M(nn.Module):\n"
                 "    def __init__(self):\n"
                 "        super().__init__()\n"
                 "        self.a = nn.Linear(4, 4)\n"
                 "        self.b = nn.Linear(4, 4)\n"
                 "        self.a.weight.data[0, 0] = float(self.a.weight.data[0, 0].item())\n"
                 "    def forward(self, x):\n"
                 "        return self.b(self.a(x))\n\n"
                 "def build():\n"
                 "    return M(), torch.randn(4, 4)\n")
    spec = resolve_spec(f"{f}:build", source="factory", batch_size=None)
    with pytest.warns(UserWarning, match="cannot be built on the meta device"):
        meta = build_meta_model(spec)
    assert meta.module.a.weight.is_meta
    got = meta.materialise(["a.weight"], torch.device("cpu"))["a.weight"]
    assert torch.equal(got, _eager(spec).a.weight.detach())


@pytest.mark.parametrize("name, source, kwargs", FAMILIES)
def test_a_replay_skips_the_draws_a_later_op_overwrites_whole_and_every_value_stays(name, source, kwargs):
    """HF's ``normal_`` after ``nn.Linear``'s ``kaiming_uniform_``, timm's trunc-normal after the default
    init: the first draw is dead, and skipping it changes no tensor (each draw keeps its own generator)."""
    from pipeline.models.meta import _Replay, _view

    meta = build_meta_model(_spec(name, source, kwargs))
    names = [n for n, t in meta.tensors.items() if t.is_meta]
    keys = {storage_key(meta.tensors[n]) for n in names}
    made, draws = {}, {}
    for prune in (False, True):
        replay = _Replay(meta, torch.device("cpu"), prune)
        real = replay.run(set(keys))
        made[prune] = {n: _view(real, meta.tensors[n], torch.device("cpu")) for n in names}
        draws[prune] = replay.draws
    assert all(torch.equal(made[False][n], made[True][n]) for n in names)
    assert draws[True] <= draws[False]
    if source != "factory":  # every family here initialises a weight twice
        assert draws[True] < draws[False]
