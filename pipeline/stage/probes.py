"""Measurements a rank makes for the cost model: every candidate segment timed, and the link's ping-pong.

One trace of the model with a cut at *every* candidate gives the segments exactly as a pipeline runs
them (torch's ``pipeline(split_spec=...)``); each segment is timed at every microbatch size on this
rank's device and threads, while the other ranks do the same (``together`` lines them up). The cost
model sends these as commands (``pipeline.ranks.protocol``) and fits its numbers to the replies; nothing here
imports the cost model.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import fx

from pipeline.core.spec import ModelSpec
from pipeline.models.batch import example_input, rows
from pipeline.models.build import build_meta_model, build_model
from pipeline.models.candidates import find_candidates
from pipeline.stage.costs import SavedBytes, backward_times, optimizer_time, saved_bytes
from pipeline.stage.messages import LinkReply, SegmentReply
from pipeline.stage.precision import autocast
from pipeline.stage.segments import crossing_bytes, stage_targets, time_streamed, timed_repeats, trace_all_cuts

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


def time_segments(spec: ModelSpec, *, granularity: str, micro: Sequence[int], repeats: int, warmup: int,
                  device: torch.device, rank: int = 0, count: bool = True,
                  together: Callable[[], Any] | None = None, train: bool = False, streamed: bool = False
                  ) -> SegmentReply:
    """This process's timing of every segment; ``together()`` lines ranks up before each size's timing;
    ``train`` also times each segment's backward (whole, input grad, weight grad) and optimizer step;
    ``streamed`` never makes the whole model real: one segment at a time (``pipeline.stage.segments``). A
    mixed-precision spec (training only) is timed under ``torch.autocast`` (bfloat16), its forward-only
    profiles too: the contention of stages at once is their ratio to the profile of one alone."""
    with autocast(spec, device):
        return _time_segments(spec, granularity=granularity, micro=micro, repeats=repeats, warmup=warmup,
                              device=device, rank=rank, count=count, together=together, train=train, streamed=streamed)


def _time_segments(spec: ModelSpec, *, granularity: str, micro: Sequence[int], repeats: int, warmup: int,
                   device: torch.device, rank: int, count: bool, together: Callable[[], Any] | None, train: bool,
                   streamed: bool) -> SegmentReply:
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    meta = build_meta_model(spec)
    cands = find_candidates(meta, spec, granularity)
    if streamed:
        return time_streamed(meta, cands, spec, micro=micro, repeats=repeats, warmup=warmup, device=device,
                             rank=rank, count=count, together=together, train=train, sync=sync)
    model = build_model(spec).to(device)
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
            bwd[m] = tuple(backward_times(mods[t], runner.inputs[t], max(1, repeats), sync, takes_batch=k == 0)
                           for k, t in enumerate(names))
            if not opt:
                opt = tuple(optimizer_time(mods[t], max(1, repeats), sync) for t in names)
            if m == max(micro):  # per sample, from the largest microbatch (the least rounding)
                saved = [saved_bytes(mods[t], runner.inputs[t]) for t in names]
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
