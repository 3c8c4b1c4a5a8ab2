"""FLOP counts with fvcore, plus the fused-attention op that fvcore skips.

Convention (fvcore's): one multiply-accumulate counts as one flop, so a (m x k) @ (k x n) matmul is m*k*n.
"""

from __future__ import annotations

import logging
import warnings
from math import prod
from typing import Any

import torch
from torch import nn


def sdpa_flop_jit(inputs: list[Any], outputs: list[Any]) -> int:
    """``aten::scaled_dot_product_attention``: q @ k^T and attn @ v, as MACs (softmax not counted)."""
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(x) for x in inputs[:3])
    batch = prod(q[:-2])
    length, embed = q[-2], q[-1]
    source = k[-2]
    return int(batch * length * source * (embed + v[-1]))


EXTRA_HANDLES = {
    "aten::scaled_dot_product_attention": sdpa_flop_jit,
    "aten::_scaled_dot_product_flash_attention_for_cpu": sdpa_flop_jit,
}


def count_flops(module: nn.Module, inputs: tuple[Any, ...]) -> int:
    """Total MACs of ``module(*inputs)``, fused attention included: fvcore's count, or torch's own
    ``FlopCounterMode`` where fvcore's jit trace fails on a model."""
    try:
        return fvcore_flops(module, inputs)
    except Exception:  # noqa: BLE001 - fvcore traces with torch.jit, which some models do not survive
        return torch_flops(module, inputs)


def torch_flops(module: nn.Module, inputs: tuple[Any, ...]) -> int:
    """MACs counted by ``torch.utils.flop_counter`` (it counts 2 flops per multiply-accumulate)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(*inputs)
    return int(counter.get_total_flops()) // 2


def fvcore_flops(module: nn.Module, inputs: tuple[Any, ...]) -> int:
    """MACs counted by fvcore, with the fused-attention handles it lacks."""
    logging.getLogger("fvcore").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit tracer and deprecation chatter; the count is what matters
        from fvcore.nn import FlopCountAnalysis

        analysis = FlopCountAnalysis(module, inputs)
        analysis.set_op_handle(**EXTRA_HANDLES)
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        return int(analysis.total())


def vit_macs(*, img: int, patch: int, dim: int, depth: int, classes: int, in_chans: int = 3, mlp_ratio: float = 4.0,
             class_tokens: int = 1) -> int:
    """The analytic ViT count per image: patch embedding, per block qkv + attention + proj + MLP, and head."""
    n = (img // patch) ** 2 + class_tokens
    hidden = int(dim * mlp_ratio)
    patch_embed = (img // patch) ** 2 * in_chans * patch * patch * dim
    block = n * dim * 3 * dim + 2 * n * n * dim + n * dim * dim + 2 * n * dim * hidden
    return patch_embed + depth * block + dim * classes
