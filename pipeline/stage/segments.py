"""Every candidate segment timed without the whole model: one segment made real at a time.

The model is cut before every candidate block from its fake-tensor copy (no storage); each segment in turn
is made real by name (``pipeline.models.weights``), fed the real values the segments before it made, timed
``warmup + repeats`` times back to back (and in training its backward, what it saves, an optimizer step),
then freed. A rank holds at most one segment's weights and the values that cross the cuts, so a model
bigger than its device can be profiled. The reply is the same ``SegmentReply`` as ``time_segments``'s.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import is_fake
from torch.utils._pytree import tree_leaves

from pipeline.core.errors import PipesplitError
from pipeline.core.spec import ModelSpec
from pipeline.models.batch import Batch, example_input, rows
from pipeline.models.candidates import Candidates
from pipeline.models.fake import fake_copies_allowed, fake_model, module_copy
from pipeline.models.meta import MetaModel
from pipeline.models.weights import empty_copy, materialise_module
from pipeline.stage.build import name_in
from pipeline.stage.costs import SavedBytes, backward_times, optimizer_time, saved_bytes
from pipeline.stage.instrument import Peak
from pipeline.stage.messages import SegmentReply
from pipeline.stage.patches import use_codegen
from pipeline.stage.reference import release

__all__ = ["crossing_bytes", "stage_targets", "time_streamed", "timed_repeats", "trace_all_cuts"]


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
    """The model traced with a cut before every candidate block: one stage module per segment (a model of fake
    tensors gives a split without storage, each segment made real when it is timed)."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    fake = any(is_fake(t) for t in x)
    with fake_copies_allowed():
        pipe = pipeline(module_copy(model) if fake else copy.deepcopy(model), mb_args=x,
                        split_spec={f: SplitPoint.BEGINNING for f in cands.cuts})
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


def _segment(gm: fx.GraphModule, target: str, meta: MetaModel, device: torch.device, train: bool) -> Any:
    mod = empty_copy(gm.get_submodule(target))
    materialise_module(mod, meta, device, name_in(meta), train=train)
    use_codegen(mod)
    return mod


def time_streamed(meta: MetaModel, cands: Candidates, spec: ModelSpec, *, micro: Sequence[int], repeats: int,
                  warmup: int, device: torch.device, rank: int, count: bool, together: Callable[[], Any] | None,
                  train: bool, sync: Callable[[], None]) -> SegmentReply:
    """Each segment's median forward seconds per microbatch size (and in training its backward halves, optimizer
    step and saved bytes), one segment real at a time."""
    peak = Peak(device)
    peak.reset()
    fake = fake_model(meta, device)
    x_all = example_input(spec, device)
    n = len(cands.blocks)
    lat: dict[int, tuple[float, ...]] = {}
    spread: dict[int, tuple[tuple[float, float], ...]] = {}
    cross: tuple[int, ...] = ()
    params: list[int] = []
    largest: list[int] = []
    bwd: dict[int, tuple[tuple[float, float, float], ...]] = {}
    opt: list[float] = []
    saved: list[SavedBytes] = []
    for m in micro:
        x = rows(x_all, m)
        gm = trace_all_cuts(fake.module, cands, fake.inputs(x))
        names = stage_targets(gm)
        reps = timed_repeats(repeats, m, spec.batch_size)
        env: dict[fx.Node, Any] = {}
        values: dict[str, Any] = {}
        times: list[list[float]] = []
        back: list[tuple[float, float, float]] = []
        size_saved: list[SavedBytes] = []
        if together is not None:
            together()
        placeholders = [nd for nd in gm.graph.nodes if nd.op == "placeholder"]
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = x[placeholders.index(node)]
            elif node.op == "call_function":
                env[node] = node.target(*fx.node.map_arg(node.args, env.__getitem__),
                                        **fx.node.map_arg(node.kwargs, env.__getitem__))
            elif node.op == "call_module":
                k = names.index(str(node.target))
                mod = _segment(gm, str(node.target), meta, device, train)
                args = fx.node.map_arg(node.args, env.__getitem__)
                kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
                samples = []
                with torch.no_grad():
                    for i in range(warmup + reps):
                        sync()
                        t0 = time.perf_counter()
                        out = mod(*args, **kwargs)
                        sync()
                        if i >= warmup:
                            samples.append(time.perf_counter() - t0)
                env[node] = out
                times.append(samples)
                if train:
                    back.append(backward_times(mod, args, max(1, repeats), sync, takes_batch=k == 0))
                    if len(opt) < n:
                        opt.append(optimizer_time(mod, max(1, repeats), sync))
                    if m == max(micro):
                        size_saved.append(saved_bytes(mod, args))
                if count and len(params) < n:
                    params.append(sum(t.numel() * t.element_size() for t in [*mod.parameters(), *mod.buffers()]))
                    largest.append(max((p.numel() * p.element_size() for p in mod.parameters()), default=0))
                release(mod)
            values[node.name] = env.get(node)
        lat[m] = tuple(statistics.median(v) for v in times)
        spread[m] = tuple((min(v), max(v)) for v in times)
        if train:
            bwd[m] = tuple(back)
            if size_saved:
                saved = size_saved
        if count and not cross:
            cross = tuple(b // m for b in crossing_bytes(gm, values, n))
    top = max(micro)
    return SegmentReply(rank=rank, blocks=cands.blocks, latency_s=lat, spread=spread, cross_bytes=cross,
                        param_bytes=tuple(params), backward_s=bwd, optimizer_s=tuple(opt),
                        saved_bytes=tuple(v.total // top for v in saved),
                        saved_input_bytes=tuple(v.inputs // top for v in saved),
                        saved_output_bytes=tuple(v.outputs // top for v in saved), largest_param_bytes=tuple(largest),
                        peak_mem_bytes=peak.read(), base_mem_bytes=peak.base)
