"""Real weights by name: a module on meta given its own tensors, from a checkpoint read key by key or the
recorded build (``pipeline.models.meta``); the whole model only where a caller asks for it."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from pipeline.core.errors import PipesplitError, one_line
from pipeline.models.fake import fake_model
from pipeline.models.kept import KeptTensors
from pipeline.models.meta import MetaModel, storage_key

T = TypeVar("T")

__all__ = ["Checkpoint", "checkpoint_reader", "empty_copy", "with_forward", "materialise_module", "module_tensors",
           "whole_model"]


class Checkpoint:
    """A local checkpoint read one key at a time: safetensors by ``safe_open``, a ``torch.save`` file through
    ``torch.load(mmap=True)`` (pages of the keys read only)."""

    def __init__(self, path: str, label: str) -> None:
        self.path = path
        self.label = label
        self._safe = path.endswith(".safetensors")
        self._state: dict[str, torch.Tensor] | None = None
        try:
            if self._safe:
                from safetensors import safe_open

                with safe_open(path, framework="pt") as f:
                    self._keys = set(f.keys())
            else:
                self._keys = set(self._load())
        except PipesplitError:
            raise
        except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input problem
            raise PipesplitError(f"checkpoint {path} could not be read ({type(e).__name__}: {one_line(e)})") from None

    def _load(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            try:
                with warnings.catch_warnings():  # torch's pickle-protocol warning would stand before our one line
                    warnings.simplefilter("ignore")
                    state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # an old (non-zip) file cannot be mapped: read whole
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    state = torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001
                why = "not a file of tensors that torch.load(weights_only=True) accepts" \
                    if "Unpickl" in type(e).__name__ else one_line(e)
                raise PipesplitError(f"checkpoint {self.path} could not be read ({type(e).__name__}: {why})") from None
            if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
                state = state["state_dict"]
            if not isinstance(state, dict):
                raise PipesplitError(f"checkpoint {self.path} holds a {type(state).__name__}, not a state_dict: save "
                                     "model.state_dict() with torch.save")
            self._state = state
        return self._state

    def check(self, meta: MetaModel) -> None:
        """One line naming the first missing and unexpected keys, or the first tensor whose shape differs."""
        want = set(meta.module.state_dict(keep_vars=True))
        missing = sorted(want - self._keys)
        unexpected = sorted(self._keys - set(meta.tensors))
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s), first {missing[0]!r}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), first {unexpected[0]!r}")
        if parts:
            raise PipesplitError(f"checkpoint {self.path} does not fit {self.label}: {'; '.join(parts)}")
        for name in sorted(want):
            got = self.shape(name)
            if got != tuple(meta.tensors[name].shape):
                raise PipesplitError(f"checkpoint {self.path} does not fit {self.label}: size mismatch for {name}: "
                                     f"copying a param with shape {list(got)}, the model's is "
                                     f"{list(meta.tensors[name].shape)}")

    def shape(self, name: str) -> tuple[int, ...]:
        if self._safe:
            from safetensors import safe_open

            with safe_open(self.path, framework="pt") as f:
                return tuple(f.get_slice(name).get_shape())
        return tuple(self._load()[name].shape)

    def get(self, name: str) -> torch.Tensor | None:
        """The tensor saved under ``name`` (None where the file has none: a non-persistent buffer)."""
        if name not in self._keys:
            return None
        if self._safe:
            from safetensors import safe_open

            with safe_open(self.path, framework="pt") as f:
                got: torch.Tensor = f.get_tensor(name)
                return got
        return self._load()[name]


def module_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor, bool]]:
    """Every (name, tensor, is a parameter) of ``module``, tied ones under each name."""
    return [(n, p, True) for n, p in module.named_parameters(remove_duplicate=False)] + \
        [(n, b, False) for n, b in module.named_buffers(remove_duplicate=False)]


def materialise_module(module: nn.Module, meta: MetaModel, device: torch.device,
                       name_of: Callable[[str], str] = lambda n: n, *, train: bool = False,
                       kept: KeptTensors | None = None) -> int:
    """Give ``module`` (on meta, its tensors named as in the model through ``name_of``) its real tensors on
    ``device``, in place, taking those ``kept`` holds from an earlier trial; returns the bytes of its tensors.
    A tensor shared under two names stays one tensor."""
    entries = module_tensors(module)
    names = {n: name_of(n) for n, _, _ in entries}
    real = kept.materialise(meta, names.values(), device) if kept is not None else meta.materialise(names.values(), device)
    made: dict[int, torch.Tensor] = {}
    for n, t, is_param in entries:
        owner, _, leaf = n.rpartition(".")
        host = module.get_submodule(owner) if owner else module
        if id(t) not in made:
            value = real[names[n]]
            made[id(t)] = nn.Parameter(value, requires_grad=train and t.requires_grad) if is_param else value
        if is_param:
            host._parameters[leaf] = made[id(t)]  # type: ignore[assignment]
        else:
            host._buffers[leaf] = made[id(t)]
    retarget(module, device)
    return sum(v.untyped_storage().nbytes() for v in {storage_key(v): v for v in made.values()}.values())


def retarget(module: nn.Module, device: torch.device) -> int:
    """Point the traced graphs of ``module`` at ``device``: a model cut on meta burned ``device=meta`` into the
    ops that make or move tensors in forward (Llama's ``inv_freq.to(x.device)``, masks, ``arange``), as
    keywords or positional arguments; returns how many ops changed."""
    from torch import fx

    def swap(v: Any) -> Any:
        return device if isinstance(v, torch.device) and v.type == "meta" else v

    changed = 0
    for m in module.modules():
        graph = getattr(m, "graph", None)
        if not isinstance(graph, fx.Graph):
            continue
        edited = 0
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            args, kwargs = fx.node.map_aggregate(node.args, swap), fx.node.map_aggregate(node.kwargs, swap)
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs = args, kwargs
                edited += 1
        if edited:
            owner = m if isinstance(m, fx.GraphModule) else getattr(m, "graph_module", None)
            if isinstance(owner, fx.GraphModule):
                owner.recompile()
            changed += edited
    return changed


def empty_copy(module: nn.Module) -> nn.Module:
    """A private copy of ``module`` whose parameters and buffers are plain meta tensors of the same shapes
    (for ``materialise_module`` to fill): deep-copying fake tensors themselves is deprecated in torch."""
    memo: dict[int, object] = {}
    for _, t, is_param in module_tensors(module):
        if id(t) not in memo:
            empty = torch.empty(t.shape, dtype=t.dtype, device="meta")
            memo[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if is_param else empty
    return copy.deepcopy(module, memo)


def whole_model(meta: MetaModel, device: torch.device) -> nn.Module:
    """The whole model, real on ``device``: for the serial baseline and backends that trace a real model."""
    module = copy.deepcopy(meta.module)
    materialise_module(module, meta, device, train=True)
    return module


def checkpoint_reader(path: str | None, label: str) -> Checkpoint | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise PipesplitError(f"checkpoint {path} does not exist: pass a local state_dict file or leave it out")
    return Checkpoint(path, label)



def with_forward(meta: MetaModel, example: tuple[torch.Tensor, ...], use: Callable[[nn.Module, tuple[Any, ...]], T]) -> T:
    """``use(module, inputs)`` on a module and inputs whose forward shows the model's calls and shapes: the
    model with fake tensors on the CPU where its code runs so, else the whole model made real on the CPU, with
    one line why (a model that reads a value in forward). One forward where fake tensors work."""
    if meta.runs_on_meta is not False:
        fake = fake_model(meta, torch.device("cpu"))
        try:
            out = use(fake.module, fake.inputs(example))
            meta.runs_on_meta = True
            return out
        except Exception as e:  # noqa: BLE001 - any failure with fake tensors: the real model runs instead
            if meta.runs_on_meta:
                raise  # it ran on fake tensors before: this failure is the caller's own
            meta.runs_on_meta = False
            meta.why_not_meta = one_line(e)
            warnings.warn(f"the model's forward cannot run without storage ({meta.why_not_meta[:160]}): its module "
                          "calls and its split come from a whole real copy (made, used, freed)", stacklevel=2)
    return use(whole_model(meta, torch.device("cpu")).eval(), example)
