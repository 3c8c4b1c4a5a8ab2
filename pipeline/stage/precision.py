"""Mixed precision as users train (``--mixed-precision bf16``): float32 weights, bfloat16 compute.

On a sharded mesh, FSDP2's own ``MixedPrecisionPolicy`` as torchtitan sets it (``param_dtype`` bfloat16,
``reduce_dtype`` float32): each block's parameters are all-gathered and computed in bfloat16, gradients
reduce-scattered and kept in float32, the optimizer steps the float32 shards. Without sharding,
``torch.autocast`` around the whole step, as torchtitan does for a pipeline without FSDP: one bfloat16 copy
of each weight per step (autocast's cast cache), the ops autocast lists in bfloat16.

torch's traced stages allocate their receive buffers (and the gradients' buffers) from the trace, and the
trace drops a conversion that did nothing when it was traced (an RMSNorm's ``.to(input_dtype)`` in float32)
and asserts the dtype it saw. So a sharded stage is traced from the model with bfloat16 parameters (its float
inputs in bfloat16), as FSDP2 computes it: it sends and receives bfloat16, as torchtitan's stages do. Under
autocast the weights stay float32, the float32 trace holds, and a stage's floating outputs are cast back to
float32 before they are sent (twice the bytes torchtitan would send; the compute is unchanged). The streamed
reference runs each stage the same way (``run_stage``), so the check compares like with like, at bfloat16's
tolerance.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pipeline.core.spec import ModelSpec

__all__ = ["BF16", "autocast", "float_outputs", "in_dtype", "mixed", "policy", "run_stage"]

BF16 = torch.bfloat16


def mixed(spec: ModelSpec) -> bool:
    """Whether ``spec`` computes in bfloat16 over float32 weights."""
    return spec.mixed_precision == "bf16"


@contextlib.contextmanager
def autocast(spec: ModelSpec, device: torch.device, on: bool = True) -> Iterator[None]:
    """``torch.autocast`` to bfloat16 where ``spec`` computes in mixed precision (and ``on``); nothing otherwise."""
    if on and mixed(spec):
        with torch.autocast(device.type, dtype=BF16):
            yield
    else:
        yield


def _to_float32(t: Any) -> Any:
    return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float32 else t


def float_outputs(mod: nn.Module, args: Any, out: Any) -> Any:
    """A forward hook: the stage's floating outputs in float32, the dtype of the buffers its peers receive into."""
    from torch.utils._pytree import tree_map

    return tree_map(_to_float32, out)


def policy(spec: ModelSpec) -> Any:
    """FSDP2's mixed-precision policy for a stage and its blocks, as torchtitan sets it; None in full precision."""
    if not mixed(spec):
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32)


def in_dtype(batch: tuple[torch.Tensor, ...], low: torch.dtype | None) -> tuple[torch.Tensor, ...]:
    """A batch's floating tensors in ``low`` (None: as they are); token ids and masks stay as they are."""
    if low is None:
        return batch
    return tuple(t.to(low) if t.is_floating_point() else t for t in batch)


def run_stage(mod: nn.Module, mixed_precision: str | None, sharded: bool, device: torch.device, *args: Any,
              **kwargs: Any) -> Any:
    """One stage's forward as the pipeline runs it, for the streamed reference: as it is in full precision;
    under autocast; or, where the pipeline is sharded, with its parameters cast to bfloat16 (a differentiable
    cast, so their float32 gradients are what FSDP2 reduces in float32) and its floating inputs cast too,
    as ``MixedPrecisionPolicy`` does. Floating outputs come back in float32."""
    if mixed_precision != "bf16":
        return mod(*args, **kwargs)
    from torch.utils._pytree import tree_map

    if not sharded:
        with torch.autocast(device.type, dtype=BF16):
            out = mod(*args, **kwargs)
        return tree_map(_to_float32, out)
    from torch.func import functional_call

    def low(t: Any) -> Any:
        return t.to(BF16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    params = {n: p.to(BF16) for n, p in mod.named_parameters()}
    out = functional_call(mod, params, tree_map(low, args), tree_map(low, kwargs))
    return tree_map(_to_float32, out)
