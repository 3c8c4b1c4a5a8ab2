"""The batch a model runs on: a tuple of tensors (its forward's positional inputs), each batched on dim 0."""

from __future__ import annotations

import torch

from pipeline.core.spec import ModelSpec, TensorSpec

Batch = tuple[torch.Tensor, ...]
"""Every input of one forward call, in order; most models take one."""

__all__ = ["Batch", "example_input", "first_chunk", "rows"]


def _draw(t: TensorSpec, batch: int, g: torch.Generator, device: str | torch.device, float_dtype: torch.dtype
          ) -> torch.Tensor:
    shape = (batch, *t.shape)
    if t.dtype == "bool":
        return torch.ones(shape, dtype=torch.bool, device=device)
    if t.dtype is not None:
        high = t.high if t.high is not None else t.low + 1
        x = torch.randint(t.low, high, shape, generator=g, dtype=torch.int64)
        return x.to(device=device, dtype=getattr(torch, t.dtype))
    return torch.randn(shape, generator=g).to(device=device, dtype=float_dtype)


def example_input(spec: ModelSpec, device: str | torch.device = "cpu") -> Batch:
    """The whole batch every rank generates identically from the seed (the first input drawn first)."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    first = TensorSpec(shape=spec.input_shape, dtype=spec.input_dtype, low=spec.input_low, high=spec.input_high)
    dtype: torch.dtype = getattr(torch, spec.dtype)
    return tuple(_draw(t, spec.batch_size, g, device, dtype) for t in (first, *spec.extra_inputs))


def rows(batch: Batch, m: int) -> Batch:
    """The first ``m`` samples of every input."""
    return tuple(t[:m] for t in batch)


def first_chunk(batch: Batch, chunks: int) -> Batch:
    """The first microbatch, as the schedule splits the batch (``tensor.chunk`` on dim 0)."""
    return tuple(t.chunk(chunks)[0] for t in batch)
