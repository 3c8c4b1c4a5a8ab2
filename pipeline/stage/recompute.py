"""Activation recomputation on a rank's traced stages: the first N blocks of a stage run under torch's
non-reentrant checkpoint (they keep their input, and run their forward again inside the backward).

torch's split keeps the model's hierarchy in each stage module (``model.layers.3`` is an ``InterpreterModule``
under stage 1), so a block is found by its name in the model. Its ``forward`` is replaced on the instance by
``torch.utils.checkpoint.checkpoint(forward, ..., use_reentrant=False)``: the parameter names (which the
optimizer, the tied-gradient sum and the check go by) stay the model's, which ``checkpoint_wrapper``'s
``_checkpoint_wrapped_module.`` prefix would change. The reentrant variant was not used: it needs an input
that requires grad, which a first stage's token ids do not.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.core.recompute import Recompute, counts_for
from pipeline.core.stack import outer_index

__all__ = ["apply_recompute", "recompute_blocks", "stage_blocks"]


def _numbered(module: nn.Module) -> dict[str, list[int]]:
    """The outermost numbered containers under ``module`` and the indices of theirs it holds."""
    out: dict[str, set[int]] = {}
    for name, _ in module.named_modules():
        got = outer_index(name)
        if got is not None:
            out.setdefault(got[0], set()).add(got[1])
    return {p: sorted(i) for p, i in out.items()}


def stage_blocks(stages: Sequence[nn.Module]) -> list[list[str]]:
    """Per stage of a whole split (every stage module, in order), the names of the stack's blocks that begin
    in it: those of the model's one numbered stack that no earlier stage holds a part of; a RuntimeError
    where the stages hold no single stack."""
    found = [_numbered(m) for m in stages]
    prefixes = {p for f in found for p in f}
    if len(prefixes) != 1:
        raise RuntimeError(f"recomputation needs one stack of numbered blocks, and this model's stages hold "
                           f"{len(prefixes)} ({', '.join(sorted(prefixes)) or 'none'}): use --recompute none")
    prefix = prefixes.pop()
    seen: set[int] = set()
    out: list[list[str]] = []
    for f in found:
        mine = [i for i in f.get(prefix, []) if i not in seen]
        seen.update(f.get(prefix, []))
        out.append([f"{prefix}.{i}" for i in mine])
    return out


def recompute_blocks(stage: nn.Module, names: Sequence[str]) -> None:
    """Make each named block of ``stage`` keep only its input and recompute its forward in the backward."""
    for name in names:
        block = stage.get_submodule(name)
        inner = block.forward
        block.forward = functools.partial(_checkpointed, inner)


def _checkpointed(fn: Any, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # forward-only runs (the check's reference, inference) gain nothing
        return fn(*args, **kwargs)
    return checkpoint(fn, *args, use_reentrant=False, **kwargs)


def apply_recompute(rc: Recompute, split_stages: Sequence[nn.Module], built: dict[int, nn.Module]) -> tuple[int, ...]:
    """Recompute in each of this rank's ``built`` stages (by index) the first blocks ``rc`` gives it, found
    from the whole split's stage modules; returns every stage's count."""
    if rc == "none":
        return tuple(0 for _ in split_stages)
    blocks = stage_blocks(split_stages)
    counts = counts_for(rc, [len(b) for b in blocks])
    for i, module in built.items():
        recompute_blocks(module, blocks[i][:counts[i]])
    return counts
