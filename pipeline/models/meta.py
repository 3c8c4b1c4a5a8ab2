"""Build a model on the meta device and materialise any of its tensors by name, never the whole model.

The model's constructor runs once under ``torch.device("meta")`` while a dispatch mode records every aten op
it runs: the model's own initialisation (timm's trunc-normal and zeros, HF's ``_init_weights``, a factory's
code), the buffers it computes (rotary ``inv_freq``, ``position_ids``, masks) and a final ``.to(dtype)``. To
materialise some tensors, the ops that wrote them (and what those ops read) are replayed in order on a real
device. Each random op draws from its own generator seeded by (``seed``, the name of the tensor it fills, how
many random ops filled that tensor before), on the CPU, so any rank, any split and the reference get the
same weights for the same name on any device, and a stage's weights cost only the stage's memory.
(torchdistx's ``deferred_init`` records a model's construction the same way; torchdistx itself was not tried here.)
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from pipeline.models.program import Op, Ref, overwritten_whole, replay_slice

__all__ = ["MetaModel", "build_meta", "from_eager", "storage_key"]


def storage_key(t: torch.Tensor) -> int:
    """The identity of a tensor's storage: views and ``.data`` aliases share their base's."""
    return int(t.untyped_storage()._cdata)


def _ref(t: torch.Tensor) -> Ref:
    return Ref(key=storage_key(t), dtype=t.dtype, shape=tuple(t.shape), stride=tuple(t.stride()),
                offset=int(t.storage_offset()), nbytes=t.untyped_storage().nbytes())


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _mutated(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The arguments an in-place or ``out=`` op writes, from its schema's alias annotations."""
    out: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out.extend(_tensors(value))
    return out


class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Every aten op the constructor runs, with the storages it reads and writes."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[Op] = []
        self.pins: list[torch.UntypedStorage] = []
        """Every meta storage an op saw, kept alive so that no later one takes its identity."""

    def snap(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_meta:
            self.pins.append(v.untyped_storage())
            return _ref(v)
        return v

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = _tensors((args, kwargs))
        metas = [t for t in ins if t.is_meta]
        written = [t for t in _mutated(func, args, kwargs) if t.is_meta] + [t for t in _tensors(out) if t.is_meta]
        schema = func._schema.arguments
        self.ops.append(Op(func=func, args=tree_map(self.snap, args), kwargs=tree_map(self.snap, kwargs),
                            out=tree_map(self.snap, out), random=any(a.name == "generator" for a in schema),
                            inplace=bool(schema and schema[0].alias_info is not None and schema[0].alias_info.is_write),
                            reads=frozenset(storage_key(t) for t in metas),
                            writes=frozenset(storage_key(t) for t in written)))
        return out


_DATA = (torch.tensor, torch.as_tensor, torch.asarray)
"""Factories from Python data, whose values reach a meta tensor without an aten op a dispatch mode sees."""


class _Data(TorchFunctionMode):
    """``torch.tensor(data)`` and its kin, recorded as ops of their own so that their values replay."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _DATA and isinstance(out, torch.Tensor) and out.is_meta \
                and not any(isinstance(t, torch.Tensor) and t.is_meta for t in _tensors((args, kwargs))):
            self.recorder.ops.append(Op(func=func, args=args, kwargs=kwargs, out=self.recorder.snap(out),
                                         random=False, reads=frozenset(), writes=frozenset({storage_key(out)})))
        return out


class MetaModel:
    """A model on the meta device, the program that built it, and every parameter and buffer by name."""

    def __init__(self, module: nn.Module, ops: list[Op], seed: int,
                 given: Callable[[str], torch.Tensor | None] | None = None) -> None:
        self.module = module
        self.seed = seed
        self._ops = ops
        self.given = given
        """Where a tensor comes from before the recorded build: a checkpoint's ``get`` (None: replay only)."""
        self.runs_on_meta: bool | None = None
        """Whether the model's forward runs on meta (None: not tried yet; ``weights.with_forward``)."""
        self.why_not_meta = ""
        self.built_whole = False
        """Whether this process built the whole model for real (its constructor cannot run on meta)."""
        self.fakes: dict[str, Any] = {}
        """Per device, the model with fake tensors there (``pipeline.models.fake.fake_model``)."""
        self.tensors: dict[str, torch.Tensor] = {}
        """Every parameter and buffer by each of its names (a tied weight under both)."""
        for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
            self.tensors.setdefault(name, t)
        self._names = self._storage_names()
        self._draw_keys = self._draw_keys_of_ops()

    def _draw_keys_of_ops(self) -> dict[int, str]:
        """Per random op, the key of its generator: (seed, the name it fills, how many random ops of the whole
        program filled that name before it), so that a replay that skips a draw another overwrites whole
        leaves every other draw's values as they are."""
        keys: dict[int, str] = {}
        count: dict[str, int] = {}
        for i, op in enumerate(self._ops):
            if not op.random:
                continue
            filled = list(op.writes)
            name = self._names.get(filled[0], f"#op{i}") if len(filled) == 1 else f"#op{i}"
            k = count.get(name, 0)
            count[name] = k + 1
            keys[i] = f"{self.seed}/{name}/{k}"
        return keys

    def _storage_names(self) -> dict[int, str]:
        """Each storage's name: its tensor's first name, passed back through the ops that copied it (a
        ``.to(dtype)``) so that the random op that filled the original is keyed by the same name."""
        names: dict[int, str] = {}
        for name, t in self.tensors.items():
            names.setdefault(storage_key(t), name)
        for op in reversed(self._ops):
            named = [names[w] for w in op.writes if w in names]
            if named and len(op.reads) == 1:
                (src,) = op.reads
                names.setdefault(src, named[0])
        return names

    def nbytes(self, names: Iterable[str]) -> int:
        """Bytes of these tensors (a tensor under two names counted once)."""
        seen: dict[int, int] = {}
        for n in names:
            t = self.tensors[n]
            seen[storage_key(t)] = t.numel() * t.element_size()
        return sum(seen.values())

    def materialise(self, names: Iterable[str], device: torch.device) -> dict[str, torch.Tensor]:
        """Real tensors for ``names`` on ``device``: ``self.given(name)`` where it returns one (a
        checkpoint's), else replayed from the constructor's program."""
        wanted = list(dict.fromkeys(names))
        given = self.given
        out: dict[str, torch.Tensor] = {}
        replay: list[str] = []
        for n in wanted:
            loaded = given(n) if given is not None else None
            if loaded is not None:
                out[n] = loaded.to(device=device, dtype=self.tensors[n].dtype)
            elif not self.tensors[n].is_meta:  # made real by the model's own code (torch.FloatTensor(...))
                out[n] = self.tensors[n].detach().to(device=device, copy=True)
            else:
                replay.append(n)
        if replay:
            real = _Replay(self, device).run({storage_key(self.tensors[n]) for n in replay})
            for n in replay:
                out[n] = _view(real, self.tensors[n], device)
        return out


def _view(real: dict[int, torch.UntypedStorage], meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The real tensor that ``meta`` is: its storage's replayed bytes, at its offset, size and strides."""
    t = torch.empty(0, dtype=meta.dtype, device=device)
    t.set_(real[storage_key(meta)], meta.storage_offset(), meta.shape, meta.stride())
    return t


class _Replay:
    """The ops that wrote some storages, run again in order on a real device."""

    def __init__(self, model: MetaModel, device: torch.device, prune: bool = True) -> None:
        self.model = model
        self.device = device
        self.prune = prune
        self.real: dict[int, torch.UntypedStorage] = {}
        self.draws = 0
        """Random ops run (a test counts the draws a pruned replay skips)."""
        self.blank: set[int] = set()

    def _slice(self, needed: set[int]) -> list[tuple[int, Op]]:
        return replay_slice(self.model._ops, needed, self.prune)

    def run(self, targets: set[int]) -> dict[int, torch.UntypedStorage]:
        ops = self._slice(set(targets))
        last: dict[int, int] = {}
        first: dict[int, Op] = {}
        for j, (_, op) in enumerate(ops):
            for k in op.reads | op.writes:
                last[k] = j
                first.setdefault(k, op)
        # a storage whose first op overwrites it whole (its dead writes pruned) starts unwritten, not zeroed:
        # zeroing 2.8 GiB first cost a 56-layer Llama's rank more than drawing it
        self.blank = {k for k, op in first.items() if overwritten_whole(op) == k}
        for j, (i, op) in enumerate(ops):
            self._run(i, op)
            for k in op.reads | op.writes:  # free what no later op needs (a fp32 original before .to(bf16))
                if last.get(k) == j and k not in targets:
                    self.real.pop(k, None)
        return {k: self.real[k] for k in targets}

    def _arg(self, v: Any) -> Any:
        if isinstance(v, Ref):
            if v.key not in self.real:  # made where no op was recorded: its bytes must be written before use
                make = torch.empty if v.key in self.blank else torch.zeros
                self.real[v.key] = make(v.nbytes, dtype=torch.uint8, device=self.device).untyped_storage()
            t = torch.empty(0, dtype=v.dtype, device=self.device)
            return t.set_(self.real[v.key], v.offset, v.shape, v.stride)
        if isinstance(v, torch.device) and v.type == "meta":
            return self.device
        return v

    def _run(self, index: int, op: Op) -> None:
        args = tree_map(self._arg, op.args)
        kwargs = tree_map(self._arg, op.kwargs)
        if op.random:
            out = self._draw(index, op, args, kwargs)
        elif op.func in _DATA:
            out = op.func(*args, **{**kwargs, "device": "cpu"}).to(self.device)
        else:
            out = op.func(*args, **kwargs)
        refs = [v for v in tree_flatten(op.out)[0] if isinstance(v, (Ref, torch.Tensor))]
        for m, r in zip(refs, _tensors(out), strict=False):
            if isinstance(m, Ref) and m.key not in self.real:
                self.real[m.key] = r.untyped_storage()

    def _draw(self, index: int, op: Op, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A random op on a CPU generator of its own: (seed, the name it fills, its count on that name)."""
        self.draws += 1
        digest = hashlib.sha256(self.model._draw_keys[index].encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
        if op.inplace:  # normal_, uniform_: draw into a CPU twin, then copy
            dst = args[0]
            if dst.device.type == "cpu" and dst.is_contiguous():  # the twin's own layout: the same values
                return op.func(dst, *args[1:], **{**kwargs, "generator": g})
            twin = torch.empty(dst.shape, dtype=dst.dtype)
            op.func(twin, *args[1:], **{**kwargs, "generator": g})
            with torch.no_grad():
                dst.copy_(twin)
            return dst
        cpu = tree_map(lambda v: torch.device("cpu") if isinstance(v, torch.device) else v, kwargs)
        return tree_map(lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t,
                        op.func(*tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, args),
                                **{**cpu, "generator": g}))


def build_meta(create: Callable[[], nn.Module], seed: int, dtype: torch.dtype) -> MetaModel:
    """``create()`` run on the meta device and recorded; the model in eval mode in ``dtype``."""
    recorder = _Recorder()
    torch.manual_seed(seed)
    with torch.device("meta"), recorder, _Data(recorder):
        module = create().to(dtype).eval()
    return MetaModel(module, recorder.ops, seed)


def from_eager(module: nn.Module, seed: int) -> MetaModel:
    """A model built for real (one whose code cannot run on meta) seen as a meta one: its tensors come
    from the real model by name, which this process keeps whole."""
    real = {n: t.detach() for n, t in [*module.named_parameters(remove_duplicate=False),
                                       *module.named_buffers(remove_duplicate=False)]}
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = b.to("meta")
    meta = copy.deepcopy(module, memo)  # the tensors by the memo: no second real copy
    out = MetaModel(meta, [], seed, given=real.get)
    out.built_whole = True
    return out
