"""Models from a user's own callable: ``my_pkg.models:build`` or ``path/to/file.py:build``.

The contract: ``build(**kwargs)`` returns ``(model, example_batch)``, where ``model`` is an ``nn.Module``
and ``example_batch`` is the whole batch it runs on: one tensor, or a tuple of tensors that the forward takes
as positional arguments (token ids and an attention mask), each with the batch as its first dimension.
Every rank calls it with the same kwargs after seeding torch, and pipesplit regenerates a batch of those
shapes, dtypes and value ranges from the seed (floats from N(0, 1), integers uniformly within the
example's own range, bool as ones), so every trial, profile and check sees the same batch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import PipesplitError, one_line
from pipeline.core.spec import TensorSpec

__all__ = ["FactoryInput", "build_factory", "factory_input"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INTS = {torch.int64: "int64", torch.int32: "int32"}


@dataclass(frozen=True, kw_only=True)
class FactoryInput:
    """The example batch, described: its size and each input's per-sample shape, dtype and integer range."""

    batch_size: int
    inputs: tuple[TensorSpec, ...]


def _function(path: str) -> Any:
    """The callable that ``path`` (``module:function`` or ``file.py:function``) names."""
    where, sep, attr = path.rpartition(":")
    if not sep or not where or not attr:
        raise PipesplitError(f"--model-factory {path!r} must name module:function or path/to/file.py:function")
    try:
        if where.endswith(".py"):
            file = Path(where)
            if not file.is_file():
                raise PipesplitError(f"--model-factory file {where} does not exist: give a path from the current folder")
            name = f"pipesplit_factory_{abs(hash(str(file.resolve())))}"
            if name not in sys.modules:
                spec = importlib.util.spec_from_file_location(name, file)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            module = sys.modules[name]
        else:
            module = importlib.import_module(where)
    except PipesplitError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module failed to import
        raise PipesplitError(f"--model-factory {path}: {where} does not import ({one_line(e)})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise PipesplitError(f"--model-factory {path}: {where} has no callable {attr!r}")
    return fn


def _call(path: str, kwargs: dict[str, Any]) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    fn = _function(path)
    try:
        got = fn(**kwargs)
    except TypeError as e:
        raise PipesplitError(f"--model-factory {path} rejected --model-kwargs {kwargs}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's factory failed
        raise PipesplitError(f"--model-factory {path} failed: {one_line(e)}") from None
    contract = ("return (model, example_batch): an nn.Module and a tensor (or a tuple of tensors) whose first "
                "dimension is the batch")
    if not isinstance(got, tuple) or len(got) != 2 or not isinstance(got[0], nn.Module):
        raise PipesplitError(f"--model-factory {path} returned {type(got).__name__}: it must {contract}")
    model, batch = got
    tensors = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    if not tensors:
        raise PipesplitError(f"--model-factory {path}'s example batch is empty: it must {contract}")
    for i, t in enumerate(tensors):
        which = f"example batch{f' input {i}' if len(tensors) > 1 else ''}"
        if not isinstance(t, torch.Tensor) or t.dim() < 1:
            raise PipesplitError(f"--model-factory {path}'s {which} is a {type(t).__name__}: it must {contract}")
        if t.dtype not in _FLOATS and t.dtype not in _INTS and t.dtype != torch.bool:
            raise PipesplitError(f"--model-factory {path}'s {which} has dtype {t.dtype}: use a float, "
                                 "int64, int32 or bool tensor")
        if t.shape[0] != tensors[0].shape[0]:
            raise PipesplitError(f"--model-factory {path}'s example batch input {i} has {t.shape[0]} samples, input 0 "
                                 f"has {tensors[0].shape[0]}: every input's first dimension is the batch")
    return model, tensors


def build_factory(path: str, kwargs: dict[str, Any]) -> nn.Module:
    """The factory's model (the caller seeds torch first), in eval mode."""
    return _call(path, kwargs)[0].eval()


def factory_input(path: str, kwargs: dict[str, Any]) -> FactoryInput:
    """The factory's example batch, described so that any rank regenerates one like it from a seed."""
    _, batch = _call(path, kwargs)
    return FactoryInput(batch_size=int(batch[0].shape[0]), inputs=tuple(_described(t) for t in batch))


def _described(t: torch.Tensor) -> TensorSpec:
    shape = tuple(int(d) for d in t.shape[1:])
    if t.dtype in _FLOATS:
        return TensorSpec(shape=shape)
    if t.dtype == torch.bool:
        return TensorSpec(shape=shape, dtype="bool")
    return TensorSpec(shape=shape, dtype=_INTS[t.dtype], low=int(t.min()), high=int(t.max()) + 1)
