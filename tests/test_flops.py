import pytest

from costmodel.flops import count_flops, vit_macs
from pipeline.models.batch import example_input
from pipeline.models.build import build_model, resolve_spec


@pytest.mark.slow
def test_deit_small_matches_the_analytic_vit_formula():
    spec = resolve_spec("deit_small_patch16_224", batch_size=1)
    got = count_flops(build_model(spec), example_input(spec))
    want = vit_macs(img=224, patch=16, dim=384, depth=12, classes=1000)
    assert abs(got - want) / want < 0.01


def test_fused_attention_is_counted(tiny_spec):
    """timm runs F.scaled_dot_product_attention; without the handle fvcore would drop 2*N^2*D per block."""
    model = build_model(tiny_spec)
    (x,) = example_input(tiny_spec)
    x = x[:1]
    assert model.blocks[0].attn.fused_attn
    got = count_flops(model, (x,))
    want = vit_macs(img=32, patch=8, dim=48, depth=4, classes=10)
    n = (32 // 8) ** 2 + 1
    assert abs(got - want) / want < 0.02
    assert got > want - 4 * 2 * n * n * 48 * 0.5  # the attention matmuls are in


def test_counts_scale_with_batch(tiny_spec):
    model = build_model(tiny_spec)
    (x,) = example_input(tiny_spec)
    assert count_flops(model, (x[:2],)) == 2 * count_flops(model, (x[:1],))


def test_sdpa_handle_counts_both_matmuls():
    from costmodel.flops import sdpa_flop_jit

    class V:
        def __init__(self, shape):
            self.shape = shape

        def isCompleteTensor(self):
            return True

        def type(self):
            return self

        def sizes(self):
            return list(self.shape)

    q = V((2, 3, 5, 8))
    assert sdpa_flop_jit([q, q, q], []) == 2 * 3 * 5 * 5 * (8 + 8)


def test_torch_fallback_counts_macs_like_fvcore(monkeypatch):
    import torch
    from torch import nn

    from costmodel import flops

    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16)
    assert flops.torch_flops(lin, (x,)) == flops.fvcore_flops(lin, (x,)) == 4 * 16 * 8

    def broken(*_a):
        raise RuntimeError("jit cannot trace this")

    monkeypatch.setattr(flops, "fvcore_flops", broken)
    assert flops.count_flops(lin, (x,)) == 4 * 16 * 8
