"""One export of a model per microbatch shape, reused to build every plan's torch-backend stage.

torch's ``pipeline()`` exports the model (``torch.export``) with a ``pipe_split`` marker at each of the
plan's cuts and splits the graph at them; the export is most of a build (DeiT-S, batch 2: 0.85-1.25 s,
the split 0.3 s). Plans
differ only in which markers they cut at, so a worker exports each model once per microbatch shape with a
marker at the start of *every* module called once (every cut point any granularity or PiPPy's policy can
name), and builds each plan's ``Pipe`` with torch's own ``Pipe._from_traced`` on that export, after a
``split_policy`` that removes the markers the plan does not cut at, then gives the first stage the
model's own calling convention as ``Pipe.from_tracing`` ends (``_first_stage_codegen``), from a codegen
unlifted once per export: ``from_tracing`` unlifts the whole exported program again for every plan only
to read it (DeiT-S: 0.2 s of a 0.4-1.0 s split, on every rank). ``_from_traced`` itself unlifts the export
again too: it is given one unlifting per export (``_Unlifted``), and unflattens only the stages the rank
runs (``held``; torch unflattens every stage into modules whose each graph it compiles). The output check
still runs on every trial. A plan that cuts elsewhere (an ``END`` split, a module called twice), or a model whose marked
export or split fails here, is traced afresh (and a failure there is the trial's reason).

The stages share the cached export's parameters: they only run forward (inference); a stage that
trains must not be built from here.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch
from torch import fx, nn
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module

from pipeline.models.batch import Batch
from pipeline.models.fake import module_copy

__all__ = ["LIMIT", "TraceCache", "call_events", "compile_now", "marker_fqn"]

LIMIT = 8
"""Exports kept per worker (one per model and microbatch shape; the oldest is dropped first)."""


def marker_fqn(node: fx.Node) -> str | None:
    """The module whose start a ``pipe_split`` node marks: the innermost module on its call stack."""
    if node.op != "call_function" or "pipe_split" not in str(node.target):
        return None
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    fqn = list(stack.values())[-1][0]
    return str(fqn)


def call_events(model: nn.Module, x: Batch) -> list[tuple[str, str]]:
    """("B" or "E", module FQN) for the start and end of every module call in one forward, in order."""
    events: list[tuple[str, str]] = []
    handles = []
    for name, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(lambda m, a, n=name: events.append(("B", n))))
        handles.append(mod.register_forward_hook(lambda m, a, o, n=name: events.append(("E", n))))
    run_hooked(model, x, handles)
    return events


def run_hooked(model: nn.Module, x: Batch, handles: list[Any]) -> None:
    """One forward without gradients for the hooks in ``handles`` to see, which are removed whatever happens."""
    try:
        with torch.no_grad():
            model(*x)
    finally:
        for h in handles:
            h.remove()


def _module_starts(model: nn.Module, mb: Batch) -> list[str]:
    """Every submodule called exactly once in one forward, in order (where a ``BEGINNING`` cut may go)."""
    calls = Counter(n for kind, n in call_events(model, mb) if kind == "B" and n)
    return [n for n, k in calls.items() if k == 1]


def _shape_key(key: str, mb: Batch) -> tuple[str, str]:
    """An export is reused for the same model at the same microbatch shapes and dtypes."""
    return key, ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in mb)


def _first_stage_codegen(pipe: Any, arity: int, codegen: Any) -> None:
    """The last step of torch's ``Pipe.from_tracing``: the first stage takes the model's own arguments
    (kwargs included) when it takes as many as the model, from the model's codegen without its output spec."""
    from inspect import signature

    submod0 = next(iter(pipe.split_gm.children()))
    if arity != len(signature(submod0.forward).parameters):
        return
    submod0.graph._codegen = copy.deepcopy(codegen)
    submod0.graph._codegen.pytree_info = submod0.graph._codegen.pytree_info._replace(out_spec=None)
    submod0.recompile()


def _keep_only(cuts: frozenset[str]) -> Callable[[fx.GraphModule], fx.GraphModule]:
    def policy(gm: fx.GraphModule) -> fx.GraphModule:
        kept = 0
        for node in list(gm.graph.nodes):
            fqn = marker_fqn(node)
            if fqn is None:
                continue
            if fqn in cuts:
                kept += 1
            else:
                gm.graph.erase_node(node)
        if kept != len(cuts):
            raise RuntimeError(f"the cached export marks {kept} of the plan's {len(cuts)} cuts")
        gm.recompile()
        return gm

    return policy


FLAT = "_pipesplit_flat"
"""Set on a stage module left as one flat graph (a stage this rank does not run)."""


class _Unlifted:
    """An export as ``Pipe._from_traced`` reads it, unlifted once: its ``module()`` is a new graph module over
    a copy of the one unlifted graph (torch unlifts the whole exported program again for every plan)."""

    def __init__(self, exported: Any) -> None:
        self.constants = exported.constants
        self.unlifted = exported.module(check_guards=False)

    def module(self, check_guards: bool = False) -> fx.GraphModule:
        # its code is never run (torch splits its graph): generated only if something asks (``_lazily``)
        gm = _LazyGraphModule(self.unlifted, copy.deepcopy(self.unlifted.graph))
        if not logging.getLogger("torch.distributed.pipelining._IR").isEnabledFor(logging.DEBUG):
            gm.print_readable = lambda *a, **k: ""  # type: ignore[method-assign]  # torch logs it at DEBUG, made always
        return gm


@contextlib.contextmanager
def _outlining(held: Collection[int] | None) -> Iterator[None]:
    """While ``Pipe._from_traced`` runs: only the stages in ``held`` unflattened (torch outlines every stage,
    in the order it registers them, into modules whose each graph it compiles: most of a split's time)."""
    if held is None:
        yield
        return
    from torch.distributed.pipelining import _IR

    outline: Callable[[fx.Graph], fx.GraphModule] = getattr(_IR, "_outline_submodules")  # noqa: B009
    seen = [0]

    def some(graph: fx.Graph) -> fx.GraphModule:
        i, seen[0] = seen[0], seen[0] + 1
        if i in held:
            return outline(graph)
        flat = _LazyGraphModule(nn.Module(), graph)  # never run on this rank: its code generated only if asked
        setattr(flat, FLAT, True)
        return flat

    setattr(_IR, "_outline_submodules", some)  # noqa: B010
    try:
        yield
    finally:
        setattr(_IR, "_outline_submodules", outline)  # noqa: B010


@contextlib.contextmanager
def _lazily() -> Iterator[None]:
    """While ``Pipe._from_traced`` runs: the graph modules torch's ``split_module`` makes generate their Python
    code when first called, not at every ``recompile`` (it compiles the whole model's code, then each stage's,
    then each stage's again, and most are replaced or never run: DeiT-S, microbatch 4, one thread, median of 40
    splits 0.19 -> 0.085 s). The stage modules a rank runs are outlined into eager modules; ``compile_now``
    makes sure of it before any timing."""
    with _use_lazy_graph_module(True):
        yield


def compile_now(module: nn.Module) -> None:
    """Generate the code of every lazily compiled graph module in ``module`` now, so that a stage's first
    timed run does not."""
    for m in module.modules():
        if isinstance(m, _LazyGraphModule):
            m.real_recompile()


class TraceCache:
    """A worker's exports: per model one copy marked at every module start; per microbatch shape, its export."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._marked: dict[str, nn.Module] = {}
        self._exports: OrderedDict[tuple[str, str], tuple[Any, frozenset[str]]] = OrderedDict()
        self._codegen: dict[tuple[str, str], tuple[int, Any]] = {}
        """Per export, the unlifted model's forward arity and graph codegen (``_first_stage_codegen``)."""
        self.hits = 0
        self.misses = 0

    def pipe(self, key: str, model: nn.Module, mb: Batch, split_spec: Mapping[str, str],
             held: Collection[int] | None = None) -> Any | None:
        """torch's ``Pipe`` for these cuts from the cached export (made on first use), or None when the
        plan cuts somewhere the export has no marker (the caller traces it afresh). ``held``: the stages this
        rank runs, the only ones unflattened into torch's module tree (the others stay one flat graph each,
        which only their place in the split's root graph is read from); None: every stage."""
        if any(kind != "BEGINNING" for kind in split_spec.values()):
            return None
        try:
            exported, markers = self._export(key, model, mb)
        except Exception:  # noqa: BLE001 - a model that exports only with fewer markers: trace each plan afresh
            self._exports[_shape_key(key, mb)] = (None, frozenset())
            return None
        cuts = frozenset(split_spec)
        if exported is None or not cuts <= markers:
            return None
        from torch.distributed.pipelining._IR import MultiUseParameterConfig, Pipe

        try:
            with _outlining(held), _lazily():
                pipe = Pipe._from_traced(self._marked[key], exported, MultiUseParameterConfig.REPLICATE,
                                         output_loss_value_spec=None, split_policy=_keep_only(cuts))
            if held is not None and [not getattr(m, FLAT, False) for m in pipe.split_gm.children()] != \
                    [i in held for i in range(pipe.num_stages)]:
                return None  # stages not in the order torch registers them: traced afresh, whole
            _first_stage_codegen(pipe, *self._codegen_of(_shape_key(key, mb), exported))
            return pipe
        except Exception:  # noqa: BLE001 - the fresh trace then runs, and reports its own failure
            return None

    def _codegen_of(self, k: tuple[str, str], exported: _Unlifted) -> tuple[int, Any]:
        if k not in self._codegen:
            from inspect import signature

            unlifted = exported.unlifted
            self._codegen[k] = (len(signature(unlifted.forward).parameters), unlifted.graph._codegen)
        return self._codegen[k]

    def _export(self, key: str, model: nn.Module, mb: Batch) -> tuple[Any, frozenset[str]]:
        k = _shape_key(key, mb)
        if k in self._exports:
            self.hits += 1
            self._exports.move_to_end(k)
            return self._exports[k]
        self.misses += 1
        from torch.distributed.pipelining import SplitPoint
        from torch.distributed.pipelining._IR import Pipe, annotate_split_points

        if key not in self._marked:
            self._marked.clear()  # one model at a time, as the worker caches it
            self._exports.clear()
            self._codegen.clear()
            marked = module_copy(model)  # annotate_split_points rewrites forwards in place
            annotate_split_points(marked, {fqn: SplitPoint.BEGINNING for fqn in _module_starts(model, mb)})
            self._marked[key] = marked
        exported = Pipe._trace_with_export(self._marked[key], mb, None)
        markers = frozenset(f for f in (marker_fqn(n) for n in exported.graph.nodes) if f is not None)
        self._exports[k] = (_Unlifted(exported), markers)
        while len(self._exports) > self.limit:
            dropped, _ = self._exports.popitem(last=False)
            self._codegen.pop(dropped, None)
        return self._exports[k]
