"""Measurements a rank makes for the cost model: every candidate segment timed, and the link's ping-pong.

One trace of the model with a cut at *every* candidate gives the segments exactly as a pipeline runs
them (torch's ``pipeline(split_spec=...)``); each segment is timed at every microbatch size on this
rank's device and threads, while the other ranks do the same (``together`` lines them up). The cost
model sends these as commands (``pipeline.ranks.protocol``) and fits its numbers to the replies; nothing here
imports the cost model.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.utils._pytree import tree_leaves

from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec
from pipeline.models.batch import Batch, example_input, rows
from pipeline.models.build import build_meta_model, build_model
from pipeline.models.candidates import Candidates, find_candidates
from pipeline.stage.build import use_codegen
from pipeline.stage.messages import LinkReply, SegmentReply

__all__ = ["SegmentRunner", "ping_pong", "stage_targets", "time_segments", "timed_repeats", "trace_all_cuts"]


class SegmentRunner(fx.Interpreter):
    """Runs a split model stage by stage, timing each stage module and keeping its inputs."""

    def __init__(self, gm: fx.GraphModule, sync: Callable[[], None]) -> None:
        super().__init__(gm)
        self.sync = sync
        self.times: dict[str, float] = {}
        self.inputs: dict[str, tuple[Any, ...]] = {}
        self.values: dict[str, Any] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        self.inputs[target] = args
        self.sync()
        t = time.perf_counter()
        out = super().call_module(target, args, kwargs)
        self.sync()
        self.times[target] = time.perf_counter() - t
        return out

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.values[n.name] = value
        return value


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def stage_targets(gm: fx.GraphModule) -> list[str]:
    """The stage modules of a split graph in execution order (``submod_i`` or ``submod_pp_i`` by version)."""
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]


def crossing_bytes(gm: fx.GraphModule, values: dict[str, Any], n_stages: int) -> list[int]:
    """Bytes crossing each cut k (between stage k-1 and k): values made before k and used at k or later."""
    index = {t: i for i, t in enumerate(stage_targets(gm))}
    stage_of = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            stage_of[node.name] = index[str(node.target)]
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node) \
                and node.args[0].name in stage_of:
            stage_of[node.name] = stage_of[node.args[0].name]
    cross = [0] * n_stages
    for node in gm.graph.nodes:
        if node.name not in stage_of:
            continue
        producer = stage_of[node.name]
        # a stage returning a tuple is consumed through getitem nodes, which carry the stage index too
        consumers = [index[str(u.target)] for u in node.users if u.op == "call_module"]
        if not consumers:
            continue
        size = _nbytes(values[node.name])
        for k in range(producer + 1, max(consumers) + 1):
            cross[k] += size
    return cross[1:]


def trace_all_cuts(model: torch.nn.Module, cands: Candidates, x: Batch) -> fx.GraphModule:
    """The model traced with a cut before every candidate block: one stage module per segment."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    pipe = pipeline(copy.deepcopy(model), mb_args=x, split_spec={f: SplitPoint.BEGINNING for f in cands.cuts})
    if pipe.num_stages != len(cands.blocks):
        raise PipesplitError(f"tracing every cut gave {pipe.num_stages} segments, expected {len(cands.blocks)}")
    use_codegen(pipe.split_gm)
    return pipe.split_gm


def timed_repeats(repeats: int, m: int, batch: int) -> int:
    """At least ``repeats``, and at least one whole batch of samples, as one pipeline run pushes through.

    A run at microbatch 1 lasts 1/32 of one at 32: three of them were too few to time it (on DeiT-S the
    sum of per-segment minima was 10 % below the medians), so small sizes are timed more often. Every rank
    computes the same count, so concurrent ranks stay in step without talking.
    """
    return max(repeats, -(-batch // m))


def _backward_times(mod: nn.Module, inputs: tuple[Any, ...], repeats: int,
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


def _saved_bytes(mod: nn.Module, inputs: tuple[Any, ...]) -> SavedBytes:
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


def _optimizer_time(mod: nn.Module, repeats: int, sync: Callable[[], None]) -> float:
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


def time_segments(spec: ModelSpec, *, granularity: str, micro: Sequence[int], repeats: int, warmup: int,
                  device: torch.device, rank: int = 0, count: bool = True,
                  together: Callable[[], Any] | None = None, train: bool = False) -> SegmentReply:
    """This process's timing of every segment; ``together()`` lines ranks up before each size's timing;
    ``train`` also times each segment's backward (whole, input grad, weight grad) and optimizer step."""
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    model = build_model(spec).to(device)
    cands = find_candidates(build_meta_model(spec), spec, granularity)
    n = len(cands.blocks)
    x_all = example_input(spec, device)
    lat: dict[int, tuple[float, ...]] = {}
    spread: dict[int, tuple[tuple[float, float], ...]] = {}
    cross: tuple[int, ...] = ()
    params: tuple[int, ...] = ()
    bwd: dict[int, tuple[tuple[float, float, float], ...]] = {}
    opt: tuple[float, ...] = ()
    saved: list[SavedBytes] = []
    largest: tuple[int, ...] = ()
    for m in micro:
        gm = trace_all_cuts(model, cands, rows(x_all, m))
        runner = SegmentRunner(gm, sync)
        names = stage_targets(gm)
        samples: list[list[float]] = [[] for _ in range(n)]
        if together is not None:
            together()
        with torch.no_grad():
            for i in range(warmup + timed_repeats(repeats, m, spec.batch_size)):
                runner.run(*rows(x_all, m))
                if i >= warmup:
                    for k in range(n):
                        samples[k].append(runner.times[names[k]])
        lat[m] = tuple(statistics.median(v) for v in samples)
        spread[m] = tuple((min(v), max(v)) for v in samples)
        mods = dict(gm.named_children())
        if train:
            bwd[m] = tuple(_backward_times(mods[t], runner.inputs[t], max(1, repeats), sync, takes_batch=k == 0)
                           for k, t in enumerate(names))
            if not opt:
                opt = tuple(_optimizer_time(mods[t], max(1, repeats), sync) for t in names)
            if m == max(micro):  # per sample, from the largest microbatch (the least rounding)
                saved = [_saved_bytes(mods[t], runner.inputs[t]) for t in names]
        if count and not params:
            cross = tuple(b // m for b in crossing_bytes(gm, runner.values, n))
            params = tuple(sum(p.numel() * p.element_size() for p in mods[t].parameters())
                           + sum(b.numel() * b.element_size() for b in mods[t].buffers()) for t in names)
            largest = tuple(max((p.numel() * p.element_size() for p in mods[t].parameters()), default=0)
                            for t in names)
    top = max(micro)
    return SegmentReply(rank=rank, blocks=cands.blocks, latency_s=lat, spread=spread, cross_bytes=cross,
                        param_bytes=params, backward_s=bwd, optimizer_s=opt,
                        saved_bytes=tuple(v.total // top for v in saved),
                        saved_input_bytes=tuple(v.inputs // top for v in saved),
                        saved_output_bytes=tuple(v.outputs // top for v in saved), largest_param_bytes=largest)


def ping_pong(rank: int, device: torch.device, sizes: Sequence[int], repeats: int,
              sync: Callable[[], None]) -> LinkReply:
    """Ping-pong between ranks 0 and 1 (the others wait in the barriers): median one-way seconds per size."""
    out = []
    for size in sizes:
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            sync()
            t = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync()
            if i:
                times.append((time.perf_counter() - t) / 2)
        out.append((buf.numel() * 4, sorted(times)[len(times) // 2]))
    return LinkReply(rank=rank, samples=tuple(out))
