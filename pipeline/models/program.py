"""The program a model's constructor ran on meta, as recorded ops, and which of them a replay needs: every
op that writes a needed storage and what it reads, less the writes a later op overwrites whole unread (HF's
``normal_`` after ``nn.Linear``'s own ``kaiming_uniform_``: half the draws of a language model's weights)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["Op", "Ref", "overwritten_whole", "replay_slice"]


@dataclass(frozen=True)
class Ref:
    """A meta tensor as an op saw it: ``param.data = ...`` (``Module.to``) later changes the same tensor
    object's storage and dtype in place, so the op keeps what it was then."""

    key: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass
class Op:
    """One aten op the constructor ran: what it read and wrote (storage keys), so a replay runs only what a
    tensor needs; whether it draws (its generator is then keyed by the tensor's name)."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    reads: frozenset[int]
    writes: frozenset[int]
    random: bool
    inplace: bool = False


_FILLS = frozenset({"normal_", "uniform_", "fill_", "zero_", "copy_", "random_", "exponential_", "log_normal_",
                    "cauchy_", "geometric_", "bernoulli_"})
"""In-place ops whose result does not depend on the values they overwrite (``copy_`` reads only its source)."""


def _dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether a tensor of this shape and stride covers every element of its span exactly once."""
    expected = 1
    for size, step in sorted(((s, st) for s, st in zip(shape, stride, strict=True) if s != 1), key=lambda d: d[1]):
        if step != expected:
            return False
        expected *= size
    return True


def overwritten_whole(op: Op) -> int | None:
    """The storage ``op`` overwrites whole without reading it (HF's ``normal_`` after ``nn.Linear``'s own
    ``kaiming_uniform_``), whose earlier writes no later value depends on; None where there is none."""
    if not op.inplace or not op.args or not isinstance(op.args[0], Ref):
        return None
    if op.func._schema.name.split("::")[-1] not in _FILLS:
        return None
    dst = op.args[0]
    size = 1
    for d in dst.shape:
        size *= d
    if dst.offset != 0 or size * dst.dtype.itemsize != dst.nbytes or not _dense(dst.shape, dst.stride):
        return None
    others = [v for v in tree_flatten((op.args[1:], op.kwargs))[0] if isinstance(v, Ref)]
    return None if any(v.key == dst.key for v in others) else dst.key


def replay_slice(ops: list[Op], needed: set[int], prune: bool = True) -> list[tuple[int, Op]]:
    """The ops (with their index) that the storages in ``needed`` depend on, in order: every op that writes
    one, and what those read; ``prune``: none whose writes a later op overwrites whole before any read."""
    keep: list[tuple[int, Op]] = []
    needed = set(needed)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.writes & needed:
            keep.append((i, op))
            whole = overwritten_whole(op) if prune else None
            if whole is not None:
                needed.discard(whole)  # its earlier values are dead: ops before this one need not write them
                needed |= op.reads - {whole}
            else:
                needed |= op.reads
    keep.reverse()
    return keep
