"""The model with fake tensors on a real device type: cut, traced and run for shapes without storage.

A copy of the model on meta (``pipeline.models.meta``) whose parameters and buffers are ``FakeTensor``s on the
device the ranks run on: the model's code then takes that device's paths (transformers' mixture-of-experts
layers pick a CUDA-only grouped matmul when the weights sit on ``meta``), and torch.export traces it as
PiPPy's meta-init example does.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipeline.models.meta import MetaModel

__all__ = ["FakeModel", "fake_copies_allowed", "fake_model", "module_copy"]


@dataclass
class FakeModel:
    """The model with fake tensors on a real device type: no storage, but the model's code sees the device it
    will run on (transformers picks its CPU or CUDA paths by the weights' device: a mixture-of-experts layer
    on ``meta`` takes a CUDA-only grouped matmul), and torch.export traces it as PiPPy's meta-init example does."""

    module: nn.Module
    mode: Any
    """Its ``FakeTensorMode``; inputs are made fake in it (``inputs``)."""

    def inputs(self, batch: Iterable[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``batch`` as fake tensors of this mode, on the model's device."""
        from torch._subclasses.fake_tensor import FakeTensor

        device = next(iter(t.device for t in [*self.module.parameters(), *self.module.buffers()]),
                      torch.device("cpu"))
        return tuple(FakeTensor(self.mode, t.to("meta"), device) for t in batch)

    def run(self, batch: Iterable[torch.Tensor]) -> Any:
        """One forward for shapes and module calls (under no_grad)."""
        with torch.no_grad():
            return self.module(*self.inputs(batch))


@contextlib.contextmanager
def fake_copies_allowed() -> Iterator[None]:
    """torch's ``Pipe`` deep-copies a replicated (tied) parameter, which warns for a fake tensor ("Accessing the
    data pointer of FakeTensor is deprecated"); the copy is a fake tensor as it should be."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        yield


def module_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module``'s modules that shares its tensors (annotating split points rewrites modules, never
    tensors; and deep-copying fake tensors is deprecated in torch)."""
    memo: dict[int, Any] = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return copy.deepcopy(module, memo)


def fake_model(meta: MetaModel, device: torch.device, params: torch.dtype | None = None) -> FakeModel:
    """A copy of ``meta.module`` whose parameters and buffers are fake tensors on ``device`` (one per device:
    a cached export and the inputs traced with it share its fake mode); ``params``: floating parameters in
    that dtype (buffers as they are), as FSDP2's mixed precision computes with them."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    key = str(device) + (f"|{params}" if params is not None else "")
    known: FakeModel | None = meta.fakes.get(key)
    if known is not None:
        return known
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, Any] = {}
    for p in meta.module.parameters():
        t = p.detach().to("meta")
        t = t.to(params) if params is not None and t.is_floating_point() else t
        memo[id(p)] = nn.Parameter(FakeTensor(mode, t, device), requires_grad=p.requires_grad)
    for b in meta.module.buffers():
        memo[id(b)] = FakeTensor(mode, b.to("meta"), device)
    made = FakeModel(module=copy.deepcopy(meta.module, memo), mode=mode)
    meta.fakes[key] = made
    return made
