"""Measurements a rank makes for the cost model: every candidate segment timed, and the link's ping-pong.

One trace of the model with a cut at *every* candidate gives the segments exactly as a pipeline runs
them (torch's ``pipeline(split_spec=...)``); each segment is timed at every microbatch size on this
rank's device and threads, while the other ranks do the same (``together`` lines them up). The cost
model sends these as commands (``pipeline.protocol``) and fits its numbers to the replies; nothing here
imports the cost model.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import fx

from pipeline.batch import Batch, example_input, rows
from pipeline.candidates import Candidates, find_candidates
from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec
from pipeline.messages import LinkReply, SegmentReply
from pipeline.models import build_model
from pipeline.stages import use_codegen

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
    from torch.utils._pytree import tree_leaves

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


def time_segments(spec: ModelSpec, *, granularity: str, micro: Sequence[int], repeats: int, warmup: int,
                  device: torch.device, rank: int = 0, count: bool = True,
                  together: Callable[[], Any] | None = None) -> SegmentReply:
    """This process's timing of every segment; ``together()`` lines ranks up before each size's timing."""
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    model = build_model(spec).to(device)
    cands = find_candidates(build_model(spec), spec, granularity)
    n = len(cands.blocks)
    x_all = example_input(spec, device)
    lat: dict[int, tuple[float, ...]] = {}
    spread: dict[int, tuple[tuple[float, float], ...]] = {}
    cross: tuple[int, ...] = ()
    params: tuple[int, ...] = ()
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
        if count and not params:
            cross = tuple(b // m for b in crossing_bytes(gm, runner.values, n))
            mods = dict(gm.named_children())
            params = tuple(sum(p.numel() * p.element_size() for p in mods[t].parameters())
                           + sum(b.numel() * b.element_size() for b in mods[t].buffers()) for t in names)
    return SegmentReply(rank=rank, blocks=cands.blocks, latency_s=lat, spread=spread, cross_bytes=cross,
                        param_bytes=params)


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
