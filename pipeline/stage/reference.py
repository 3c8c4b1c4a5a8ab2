"""The unsplit model's output, loss and gradients without ever holding the whole model: streamed.

The plan's own stages (cut on the meta device) run in order on one rank, one stage's weights materialised
at a time (made by name, run on every microbatch, freed), the values that cross each cut kept. In training
each stage's inputs are kept on the way forward; the way back runs from the last stage to the first,
remaking each stage and recomputing its forward from its kept inputs before its backward, and keeps the
gradients of the parameters asked for (a rank's own). The stages are torch's traced graphs, run without a
schedule or a process group: what this checks is the pipeline's run (microbatches, schedule, sends,
receives, tied weights) and its stages' weights, against the same computation made serially.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef

from pipeline.models.batch import Batch
from pipeline.models.kept import KeptTensors
from pipeline.models.meta import MetaModel
from pipeline.models.weights import empty_copy, materialise_module
from pipeline.stage.precision import run_stage
from pipeline.stage.training import Reference, loss_fn

__all__ = ["trim_heap", "release", "step_node", "streamed_output", "streamed_step"]


def _stage(split_gm: fx.GraphModule, target: str, meta: MetaModel, device: torch.device, name_of: Callable[[str], str],
           train: bool, kept: KeptTensors | None = None) -> nn.Module:
    """A private, real copy of one stage of ``split_gm`` (which stays on meta), its tensors taken from ``kept``
    where it holds them."""
    mod = empty_copy(split_gm.get_submodule(target))
    materialise_module(mod, meta, device, name_of, train=train, kept=kept)
    return mod


def _chunks(x: Batch, chunks: int) -> list[Batch]:
    """The microbatches as the schedule splits the batch (``tensor.chunk`` on dim 0)."""
    parts = [t.chunk(chunks) for t in x]
    return [tuple(p[c] for p in parts) for c in range(chunks)]


def _first(out: Any) -> torch.Tensor:
    first: torch.Tensor = out[0] if isinstance(out, (tuple, list)) else out
    return first


def _forward(split_gm: fx.GraphModule, meta: MetaModel, x: Batch, chunks: int, device: torch.device,
             name_of: Callable[[str], str], keep: bool, mp: str | None = None, sharded: bool = False
             ) -> tuple[list[Any], list[dict[fx.Node, Any]]]:
    """Every microbatch through the stages in order; (outputs per microbatch, every node's value per microbatch
    when ``keep``, else only what is still to be read). Each stage runs in the pipeline's precision (``mp``, the
    spec's ``mixed_precision``; ``sharded``: FSDP2's policy, not autocast; ``pipeline.stage.precision``)."""
    graph = split_gm.graph
    nodes = list(graph.nodes)
    last_use: dict[fx.Node, int] = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last_use[a] = i
    envs: list[dict[fx.Node, Any]] = [{} for _ in range(chunks)]
    mbs = _chunks(x, chunks)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    outs: list[Any] = [None] * chunks
    for i, node in enumerate(nodes):
        if node.op == "call_module":
            mod = _stage(split_gm, str(node.target), meta, device, name_of, train=False)
            with torch.no_grad():
                for env in envs:
                    env[node] = run_stage(mod, mp, sharded, device, *fx.node.map_arg(node.args, env.__getitem__),
                                          **fx.node.map_arg(node.kwargs, env.__getitem__))
            release(mod)
        step_node(node, i, envs, mbs, placeholders, outs, None if keep else last_use)
    return outs, envs


def step_node(node: fx.Node, i: int, envs: list[dict[fx.Node, Any]], mbs: list[Batch], placeholders: list[fx.Node],
              outs: list[Any], last_use: dict[fx.Node, int] | None) -> None:
    """Node ``i`` of a split's root graph on every microbatch, a stage call aside (an input, a getitem, the
    output); the values it read last freed (``last_use`` None: every value kept)."""
    for c, env in enumerate(envs):
        if node.op == "placeholder":
            env[node] = mbs[c][placeholders.index(node)]
        elif node.op == "call_function":
            fn: Any = node.target
            env[node] = fn(*fx.node.map_arg(node.args, env.__getitem__), **fx.node.map_arg(node.kwargs, env.__getitem__))
        elif node.op == "output":
            outs[c] = fx.node.map_arg(node.args[0], env.__getitem__)
        if last_use is not None:
            for a in node.all_input_nodes:
                if last_use.get(a) == i:
                    env.pop(a, None)


def streamed_output(split_gm: fx.GraphModule, meta: MetaModel, x: Batch, chunks: int, device: torch.device,
                    name_of: Callable[[str], str] = lambda n: n) -> torch.Tensor:
    """The model's output for the whole batch (its first output where it has several), stage by stage."""
    outs, _ = _forward(split_gm, meta, x, chunks, device, name_of, keep=False)
    return torch.cat([_first(o) for o in outs], dim=0)


def streamed_step(split_gm: fx.GraphModule, meta: MetaModel, x: Batch, target: torch.Tensor, chunks: int,
                  device: torch.device, wanted: Iterable[str], name_of: Callable[[str], str] = lambda n: n,
                  mp: str | None = None, sharded: bool = False) -> Reference:
    """The serial training step's loss (the mean of the microbatches' losses, as the schedule reports it)
    and the gradients of the parameters named in ``wanted`` (the others' are made and dropped), in the
    pipeline's precision (``mp``; ``sharded``: FSDP2's mixed precision, not autocast's)."""
    want = set(wanted)
    outs, envs = _forward(split_gm, meta, x, chunks, device, name_of, keep=True, mp=mp, sharded=sharded)
    targets = target.chunk(chunks)
    grads: dict[fx.Node, list[Any]] = {}
    """Per node, per microbatch, the gradient of the loss with respect to the node's value."""
    losses = []
    out_node = next(n for n in split_gm.graph.nodes if n.op == "output")
    for c in range(chunks):
        y = _first(outs[c]).detach().requires_grad_(True)
        with torch.enable_grad():
            loss = loss_fn(y, targets[c])
            (loss / chunks).backward()  # type: ignore[no-untyped-call]
        losses.append(float(loss.detach()))
        src = out_node.args[0]
        first = src[0] if isinstance(src, (tuple, list)) else src
        if isinstance(envs[c].get(first), (tuple, list)):  # a stage's first of several outputs
            grads.setdefault(first, [None] * chunks)[c] = {0: y.grad}
        else:
            _add(grads, first, c, chunks, y.grad)
    kept: dict[str, torch.Tensor] = {}
    for node in reversed(list(split_gm.graph.nodes)):
        if node.op == "call_function" and node in grads:  # getitem of a stage's several outputs
            src, index = node.args[0], node.args[1]
            for c in range(chunks):
                g = grads[node][c]
                if g is not None:
                    whole = grads.setdefault(src, [None] * chunks)
                    parts = whole[c] if whole[c] is not None else {}
                    parts[index] = g if index not in parts else parts[index] + g
                    whole[c] = parts
        elif node.op == "call_module" and node in grads:
            _backward(split_gm, node, meta, device, name_of, envs, grads, chunks, want, kept, mp, sharded)
    return Reference(loss=sum(losses) / chunks, grads=kept)


def _add(grads: dict[fx.Node, list[Any]], node: Any, c: int, chunks: int, g: torch.Tensor | None) -> None:
    if g is None or not isinstance(node, fx.Node):
        return
    slot = grads.setdefault(node, [None] * chunks)
    slot[c] = g if slot[c] is None else slot[c] + g


def _backward(split_gm: fx.GraphModule, node: fx.Node, meta: MetaModel, device: torch.device,
              name_of: Callable[[str], str], envs: list[dict[fx.Node, Any]], grads: dict[fx.Node, list[Any]],
              chunks: int, want: set[str], kept: dict[str, torch.Tensor], mp: str | None = None,
              sharded: bool = False) -> None:
    """One stage's backward on every microbatch, its forward recomputed from the kept inputs; its inputs'
    gradients passed on to the nodes that made them, its wanted parameters' gradients kept."""
    mod = _stage(split_gm, str(node.target), meta, device, name_of, train=True)
    ins = [a for a in node.all_input_nodes]
    for c, env in enumerate(envs):
        g_out = grads[node][c]
        if g_out is None:
            continue
        leaves = {a: _leaf(env[a]) for a in ins}
        with torch.enable_grad():
            out = run_stage(mod, mp, sharded, device, *fx.node.map_arg(node.args, leaves.__getitem__),
                            **fx.node.map_arg(node.kwargs, leaves.__getitem__))
            pairs = _pairs(out, g_out)
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        for a, v in leaves.items():
            if isinstance(v, torch.Tensor) and v.grad is not None:
                _add(grads, a, c, chunks, v.grad)
    for n, p in mod.named_parameters(remove_duplicate=False):
        name = name_of(n)
        if name in want and p.grad is not None:
            kept[name] = kept[name] + p.grad if name in kept else p.grad.detach()
    release(mod)


GC_BYTES = 64 * 2**20
"""A freed stage at least this big is collected at once (smaller ones wait for the collector's own pace)."""


def release(mod: nn.Module) -> None:
    """Let a stage's weights go now: dropped from its modules, they are freed at once unless something refers
    to them in a cycle (traced modules do), which only a full collection frees (without one the last rank kept
    every streamed stage: 3.2 GiB of a 2 GiB Llama); that collection runs only where a storage outlived the drop."""
    held = 0
    storages: list[StorageWeakRef] = []
    for m in mod.modules():
        for t in [*m._parameters.values(), *m._buffers.values()]:
            if t is not None:
                held += t.untyped_storage().nbytes()
                storages.append(StorageWeakRef(t.untyped_storage()))  # type: ignore[no-untyped-call]
        m._parameters.clear()
        m._buffers.clear()
    t = None  # the loop's last tensor would otherwise keep its storage alive past the check below
    if held >= GC_BYTES:  # a full collection costs 0.1-0.4 s with torch loaded: worth it for a big stage only
        if any(not s.expired() for s in storages):  # type: ignore[no-untyped-call]
            gc.collect()
        trim_heap()


def trim_heap() -> None:
    """Hand freed heap pages back to the system (glibc's ``malloc_trim``): tensors under glibc's mmap threshold
    (which grows to 32 MiB as big blocks are freed) come from the heap, and without this a persistent worker's
    resident memory kept the last stages' weights: +100 MiB per trial of a 180 MiB Llama, which every later
    trial's measured peak carried."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def _leaf(v: Any) -> Any:
    """A kept input as a leaf that collects its gradient (integer inputs, token ids and masks, as they are)."""
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.detach().requires_grad_(True)
    return v


def _pairs(out: Any, g: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(output, its gradient) for each output of a stage that has one."""
    if isinstance(g, dict):
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [(outs[i], gi) for i, gi in g.items() if isinstance(outs[i], torch.Tensor) and outs[i].requires_grad]
    o = _first(out) if isinstance(out, (tuple, list)) and len(out) == 1 else out
    return [(o, g)] if isinstance(o, torch.Tensor) and o.requires_grad else []
