"""What a traced stage needs before torch's runtime runs it: contiguous sends and receives, generated code
for its unflattened modules, and no warm-up exchange with a neighbour on the same rank."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

__all__ = ["contiguous_receives", "use_codegen"]


def _contiguous(mod: nn.Module, args: Any, out: Any) -> Any:
    """Stage outputs go out through send(), which needs contiguous tensors; a cut before a ViT head
    sends ``x[:, 0]``, a strided view ("input tensor has to be contiguous" from gloo otherwise)."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.contiguous() if isinstance(t, torch.Tensor) else t, out)


def contiguous_receives(split_gm: Any) -> int:
    """Make every stage input that is received from another stage a contiguous buffer; returns how many.

    torch's pipelining allocates each receive buffer with the strides the trace saw (``empty_strided`` of
    the placeholder's ``meta["val"]``); a value that crosses a cut as a strided view (a ViT's ``x[:, 0]``
    before ``head``, a ConvNeXt activation after its NCHW->NHWC permute, at a BEGINNING or an END cut)
    would arrive in a non-contiguous buffer, which gloo refuses ("input tensor has to be contiguous").
    The sender's outputs are made contiguous (``_contiguous``); so are the buffers here, and, for training,
    the outputs' recorded strides, from which torch allocates the buffer the gradient comes back into.
    Eager stage code does not depend on the strides of its inputs.
    """
    changed = 0
    for sub in split_gm.children():
        graph = getattr(sub, "graph", None)
        if graph is None:
            continue
        outputs: set[Any] = set()
        for node in graph.nodes:
            if node.op == "output":
                fx.node.map_arg(node.args, outputs.add)
        for node in graph.nodes:
            val = node.meta.get("val") if node.op == "placeholder" or node in outputs else None
            if isinstance(val, torch.Tensor) and not val.is_contiguous():
                node.meta["val"] = torch.empty(val.shape, dtype=val.dtype, device="meta")
                changed += 1
    return changed


def use_codegen(module: nn.Module) -> None:
    """Run unflattened stage modules as generated code, not node by node through ``fx.Interpreter``.

    torch's unflatten builds ``InterpreterModule``s that interpret their graph in Python by default; on a
    tiny DeiT stage that made compute ~4x slower than torchpippy's GraphModules (measured here).
    """
    for m in module.modules():
        if hasattr(m, "_run_with_interpreter") and not _names_self(m):
            m._run_with_interpreter = False  # type: ignore[assignment]


def _names_self(module: nn.Module) -> bool:
    """Whether generated code for ``module`` would rebind ``self``: a submodule called ``self`` (BERT's
    ``attention.self``) becomes a graph value named ``self``; such a module stays interpreted."""
    graph = getattr(module, "graph", None)
    return graph is not None and any(node.name == "self" for node in graph.nodes)


def _no_self_warmup(stage: Any) -> None:
    """A V-schedule puts neighbouring stages on one rank (rank 1 of 2 holds stages 1 and 2): torch 2.14's
    warm-up for stages built from a traced pipe still exchanges a dummy tensor with that neighbour, a
    send to itself that gloo refuses ("Pair is not connected"); the runtime passes same-rank activations
    directly, so only the warm-up ops with a peer on this rank are dropped."""
    warmup = stage._get_init_p2p_neighbors_ops

    def ops() -> list[Any]:
        return [op for op in warmup() if op.group_peer != stage.group_rank]

    stage._get_init_p2p_neighbors_ops = ops
