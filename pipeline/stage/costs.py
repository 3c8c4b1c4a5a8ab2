"""What one segment of a model costs besides its forward: its backward (whole, input and weight halves),
what its forward saves for the backward, and one optimizer step over its parameters (``pipeline.stage.probes``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

__all__ = ["SavedBytes", "backward_times", "optimizer_time", "saved_bytes"]


def backward_times(mod: nn.Module, inputs: tuple[Any, ...], repeats: int,
                    sync: Callable[[], None], *, takes_batch: bool = False) -> tuple[float, float, float]:
    """One segment's median (whole backward, input grad, weight grad) seconds at the inputs' microbatch:
    autograd from the segment's outputs to its float inputs and its parameters, as a pipeline stage's
    backward runs, and split as a zero-bubble schedule's ``I`` then ``W`` run it: torch's own
    ``stage_backward_input`` (which keeps the intermediate gradients) then ``stage_backward_weight`` (which
    starts from them), so I + W is about one backward, not two. A segment that ``takes_batch`` needs no
    input gradient (the batch is no activation): torch runs its whole backward as the ``W``."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    params = [q for q in mod.parameters() if q.requires_grad]
    whole, first, second = [], [], []
    for _ in range(repeats + 1):
        ins = tuple(t.detach().requires_grad_(not takes_batch) if isinstance(t, torch.Tensor) and t.is_floating_point()
                    else t for t in inputs)
        leaves = [t for t in ins if isinstance(t, torch.Tensor) and t.requires_grad]
        times = []
        for split in (False, True):
            with torch.enable_grad():
                outs = [t for t in tree_leaves(mod(*ins)) if isinstance(t, torch.Tensor) and t.requires_grad]
            grads = [torch.ones_like(t) for t in outs]
            if not outs:
                times += [0.0] if not split else [0.0, 0.0]
                continue
            sync()
            t0 = time.perf_counter()
            if not split or not leaves:
                torch.autograd.grad(outs, [*leaves, *params], grads, allow_unused=True)
                sync()
                times += [time.perf_counter() - t0] if not split else [0.0, time.perf_counter() - t0]
                continue
            # torch detaches the outputs in place after I, which a view refuses: hand it a copy of those
            _, groups = stage_backward_input([t.clone() if t._is_view() else t for t in outs], grads, leaves,
                                             iter(params))
            sync()
            t1 = time.perf_counter()
            if params:
                stage_backward_weight(iter(params), groups)
            sync()
            times += [t1 - t0, time.perf_counter() - t1]
            for q in [*params, *leaves]:
                q.grad = None
        whole.append(times[0])
        first.append(times[1])
        second.append(times[2])
    return (statistics.median(whole[1:]), statistics.median(first[1:]), statistics.median(second[1:]))


@dataclass(frozen=True, kw_only=True)
class SavedBytes:
    """What a segment's forward keeps for its backward, and how much of it is its own input or output: a
    stage of several segments holds a tensor that one saves as output and the next as input only once."""

    total: int
    inputs: int
    outputs: int


def saved_bytes(mod: nn.Module, inputs: tuple[Any, ...]) -> SavedBytes:
    """Bytes a segment's forward keeps for its backward (autograd's saved tensors, parameters and shared
    storage counted once, parameters not at all): its activation memory per microbatch in flight."""
    params = {q.untyped_storage().data_ptr() for q in mod.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    ins = tuple(t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                for t in inputs)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = mod(*ins)
    in_ptrs = {t.untyped_storage().data_ptr() for t in tree_leaves(ins) if isinstance(t, torch.Tensor)}
    out_ptrs = {t.untyped_storage().data_ptr() for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
    del out
    return SavedBytes(total=sum(seen.values()), inputs=sum(b for p, b in seen.items() if p in in_ptrs),
                      outputs=sum(b for p, b in seen.items() if p in out_ptrs))


def optimizer_time(mod: nn.Module, repeats: int, sync: Callable[[], None]) -> float:
    """Median seconds of one AdamW step over a segment's parameters (on copies, with unit gradients)."""
    params = [torch.nn.Parameter(q.detach().clone()) for q in mod.parameters() if q.requires_grad]
    if not params:
        return 0.0
    for q in params:
        q.grad = torch.ones_like(q)
    opt = torch.optim.AdamW(params)
    opt.step()  # the first step makes the optimizer's state
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
