"""A split in the formats torchtitan, Megatron-Core and DeepSpeed users paste: pure text from a plan's cuts.

Each format says what its user writes to get the plan: torchtitan's ``module_fqns_per_model_part`` (TOML and
Python config forms), Megatron-Core's ``--pipeline-model-parallel-layout``, DeepSpeed's ``parts``. What a
format cannot express (a cut inside a layer, a schedule it lacks, several stages per rank where it runs one)
gets one line saying so, and the nearest plan it can express is written instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.stack import Stack, nearest_allowed
from pipeline.peers.recompute_text import deepspeed_recompute, megatron_recompute, torchtitan_recompute

__all__ = ["FORMATS", "Exported", "PlanView", "deepspeed", "export_to", "megatron", "torchtitan"]

FORMATS = ("torchtitan", "megatron", "deepspeed")


@dataclass(frozen=True, kw_only=True)
class PlanView:
    """What the formats need of a plan, in terms of the model's candidate segments."""

    stack: Stack
    names: tuple[str, ...]
    """The candidate segments' module names (``Candidates.blocks``)."""
    cuts: tuple[int, ...]
    """The segment each later stage begins at; -1 where a cut is not at a segment's start (inside one)."""
    prefix: tuple[float, ...]
    """The share of the parameters before each segment (``segments + 1`` values, the last 1.0)."""
    cut_shares: tuple[float, ...]
    """The share of the parameters before each of the plan's cuts (a cut inside a segment has no index)."""
    ranks: int
    per_rank: int
    schedule: str
    chunks: int
    batch_size: int
    mode: str
    segment_elements: tuple[int, ...] = ()
    recompute: tuple[int, ...] = ()
    """Training: the layers each stage recomputes (empty: none)."""
    dp_shard: int = 1
    """Data-parallel replicas, each stage sharded over them (FSDP2 / ZeRO-3)."""
    mixed_precision: str | None = None
    """Training: ``bf16`` (float32 weights computing in bfloat16), or None (the model's dtype)."""


@dataclass(frozen=True, kw_only=True)
class Exported:
    """What a user pastes, and, for a plan the format cannot express, why and which cuts were written instead."""

    text: str
    unexpressible: str | None = None
    """One line: what of the plan the format cannot express (None: the plan as it is)."""
    cuts: tuple[int, ...] = ()
    """The cuts written (the plan's own, or the nearest the format can express)."""


def _expressible(view: PlanView, allowed: Sequence[int], what: str) -> tuple[tuple[int, ...], str | None]:
    """The plan's cuts if the format allows them all, else the nearest it allows and why."""
    ok = set(allowed)
    bad = [k for k, c in enumerate(view.cuts) if c not in ok]
    if not bad:
        return view.cuts, None
    shares = list(view.prefix)
    own = [c if c in ok else -1 for c in view.cuts]
    # a cut inside a segment (or inside a layer) is placed by its parameter share among the allowed ones
    points = []
    for k, c in enumerate(own):
        if c >= 0:
            points.append(c)
        else:
            shares.append(view.cut_shares[k])
            points.append(len(shares) - 1)
    near = nearest_allowed(points, allowed, shares)
    where = ", ".join(f"cut {k + 1}" for k in bad)
    return near, f"{where} of the plan fall{'s' if len(bad) == 1 else ''} inside {what}"


def _stage_items(stack: Stack, cuts: Sequence[int], titan: bool) -> list[list[str]]:
    """torchtitan's module names (``titan``) or Megatron's layer letters of each stage."""
    bounds = [0, *cuts, stack.segments]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        items: list[str] = []
        if a == 0:
            items.append("tok_embeddings" if titan else "E")
        items += [f"layers.{i}" if titan else "t" for i, s in enumerate(stack.starts) if a <= s < b]
        if b == stack.segments:
            items += ["norm", "lm_head"] if titan else ["L"]
        out.append(items)
    return out


def torchtitan(view: PlanView) -> Exported:
    """``module_fqns_per_model_part`` with the degree, schedule and microbatches, as TOML and as Python."""
    cuts, why = _expressible(view, view.stack.whole_cuts(), "the embedding, a layer or the norm + head, which "
                             "torchtitan keeps whole")
    parts = _stage_items(view.stack, cuts, titan=True)
    d = view.dp_shard
    micro = view.batch_size // (view.chunks * d)
    local = view.batch_size // d
    lists = json.dumps(parts)
    pre = ", ".join(view.names[:view.stack.pre]) or "-"
    names = (f"# module names as torchtitan's Llama calls them: tok_embeddings = {pre}; "
             f"layers.<i> = {view.stack.prefix}.<i>; norm, lm_head = {', '.join(view.names[view.stack.end:]) or '-'}")
    # torchtitan's mixed_precision_param defaults to bfloat16 and applies through FSDP (or alone, with autocast)
    param = "bfloat16" if view.mixed_precision else "float32"
    precision = [f'mixed_precision_param = "{param}"', 'mixed_precision_reduce = "float32"'] if d > 1 else []
    if view.mixed_precision and d == 1:
        why = _also(why, "torchtitan applies mixed_precision_param through FSDP (data_parallel_shard_degree > 1), or "
                    "with autocast only without other parallelism: its pipeline without sharding trains in float32")
    toml = "\n".join([
        "# torchtitan <= 0.2: the job config TOML (--job.config_file)", "[parallelism]",
        f"pipeline_parallel_degree = {view.ranks}", f'pipeline_parallel_schedule = "{view.schedule}"',
        f"pipeline_parallel_microbatch_size = {micro}", f"module_fqns_per_model_part = {lists}",
        *([f"data_parallel_shard_degree = {d}"] if d > 1 else []), "",
        "[training]", f"local_batch_size = {local}  # {view.chunks} microbatches of {micro}"
        + (f" per replica, {d} replicas: a global batch of {view.batch_size}" if d > 1 else ""), *precision])
    py = "\n".join([
        "# torchtitan >= 0.3: in your config_registry function's Trainer.Config",
        "from torchtitan.config import ParallelismConfig, TrainingConfig", "",
        "parallelism = ParallelismConfig(", f"    pipeline_parallel_degree={view.ranks},",
        f'    pipeline_parallel_schedule="{view.schedule}",', f"    pipeline_parallel_microbatch_size={micro},",
        f"    module_fqns_per_model_part={lists},", *([f"    data_parallel_shard_degree={d},"] if d > 1 else []), ")",
        f"training = TrainingConfig(local_batch_size={local}"
        + (f', mixed_precision_param="{param}", mixed_precision_reduce="float32"' if d > 1 else "")
        + f")  # {view.chunks} microbatches of {micro}"])
    rc = f"\n{torchtitan_recompute(view.stack, cuts, view.recompute)}\n" if any(view.recompute) else ""
    return Exported(text=f"{names}\n\n{toml}\n\n{py}\n{rc}", unexpressible=why, cuts=cuts)


def _letters(items: Sequence[str]) -> str:
    out, k = "", 0
    while k < len(items):
        run = 1
        while k + run < len(items) and items[k + run] == items[k]:
            run += 1
        out += items[k] + (f"*{run}" if run > 1 else "")
        k += run
    return out


def _also(why: str | None, extra: str) -> str:
    return f"{why}; {extra}" if why else extra


def megatron(view: PlanView) -> Exported:
    """``--pipeline-model-parallel-layout`` with its size flags; Megatron runs 1F1B (interleaved with V > 1)."""
    cuts, why = _expressible(view, view.stack.whole_cuts(), "the embedding, a decoder layer or the output layer "
                             "(final norm, head, loss), which Megatron-Core keeps whole")
    if view.schedule not in ("1F1B", "Interleaved1F1B"):
        why = _also(why, f"Megatron-Core has no {view.schedule} schedule: it runs this layout as "
                    + ("interleaved 1F1B, a rank's stages placed round-robin" if view.per_rank > 1 else "1F1B"))
    layout = "|".join(_letters(s) for s in _stage_items(view.stack, cuts, titan=False))
    flags = [f"--pipeline-model-parallel-size {view.ranks}", f"--num-layers {view.stack.layers}",
             f'--pipeline-model-parallel-layout "{layout}"',
             f"--micro-batch-size {view.batch_size // (view.chunks * view.dp_shard)}",
             f"--global-batch-size {view.batch_size}"]
    if view.dp_shard > 1:  # Megatron's data-parallel size is the world over the model-parallel sizes
        flags.append("--use-distributed-optimizer")
    if view.mixed_precision:  # bf16 weights that compute, float32 main weights in the optimizer
        flags.append("--bf16")
    rc = megatron_recompute(view.stack, cuts, view.recompute) if any(view.recompute) else []
    flags += [f for f in rc if not f.startswith("#")]
    note = (f"# {view.per_rank} virtual stages per rank (interleaved 1F1B), read from the layout's "
            f"{view.ranks * view.per_rank} stages\n" if view.per_rank > 1 else "")
    note += (f"# E: the embedding ({', '.join(view.names[:view.stack.pre]) or '-'}), t: a decoder layer "
             f"({view.stack.prefix}.<i>), L: the output layer and loss ({', '.join(view.names[view.stack.end:]) or '-'})\n")
    note += "".join(f"{line}\n" for line in rc if line.startswith("#"))
    if view.dp_shard > 1:
        note += (f"# run on {view.ranks * view.dp_shard} GPUs: data-parallel size {view.dp_shard}, the optimizer state "
                 "sharded over it (--use-distributed-optimizer; Megatron-FSDP shards weights and gradients too)\n")
    return Exported(text=note + " \\\n    ".join(flags) + "\n", unexpressible=why, cuts=cuts)


def deepspeed(view: PlanView, parameters_parts: Sequence[int] | None = None,
              uniform_parts: Sequence[int] | None = None) -> Exported:
    """``parts`` over the PipelineModule's layers (each segment outside the stack, each stacked layer), and the
    smallest code that applies them, or the partition_method that already does (given its ``*_parts``)."""
    cuts, why = _expressible(view, view.stack.item_cuts(), "a layer, which a PipelineModule keeps whole")
    if view.per_rank > 1:
        why = _also(why, f"DeepSpeed runs one stage per rank: these {view.ranks * view.per_rank} stages on {view.ranks} "
                    "ranks are written as that many PipelineModule stages (num_stages)")
    if view.schedule not in ("GPipe", "1F1B"):
        why = _also(why, f"DeepSpeed has no {view.schedule} schedule: its engine runs its own 1F1B (TrainSchedule)")
    if view.dp_shard > 1:
        why = _also(why, f"DeepSpeed's pipeline engine runs with ZeRO stage 1 at most: over {view.dp_shard} data-parallel "
                    "replicas it shards the optimizer state, not the weights and gradients this plan shards, so each "
                    "rank holds its whole stage's weights and gradients")
    starts = [0, *view.stack.item_cuts()]
    parts = [0, *(starts.index(c) for c in cuts), len(starts)]
    stages = len(parts) - 1
    layers = [*view.names[:view.stack.pre], *(f"{view.stack.prefix}[{i}]" for i in range(view.stack.layers)),
              *view.names[view.stack.end:]]
    head = (f"# PipelineModule(layers=[...]) with one entry per layer, in this order ({len(layers)}):\n"
            f"#   {', '.join(layers)}\nparts = {parts}  # stage s builds layers[parts[s]:parts[s + 1]]\n")
    config = (f'# ds_config: "train_micro_batch_size_per_gpu": {view.batch_size // (view.chunks * view.dp_shard)}, '
              f'"gradient_accumulation_steps": {view.chunks}  ({view.chunks} microbatches per step)\n')
    if view.mixed_precision:
        config += '# ds_config: "bf16": {"enabled": true}  (bfloat16 compute, float32 master weights in the optimizer)\n'
    if any(view.recompute):
        config += deepspeed_recompute(view.stack, cuts, view.recompute)
    for method, given in (("parameters", parameters_parts), ("uniform", uniform_parts)):
        if given is not None and [int(p) for p in given] == parts:
            return Exported(text=head + f'PipelineModule(layers=layers, num_stages={stages}, partition_method="{method}")'
                            f"  # gives exactly these parts\n" + config, unexpressible=why, cuts=cuts)
    code = "\n".join([
        "from deepspeed.pipe import PipelineModule", "", "",
        "class PinnedPipe(PipelineModule):",
        '    """A PipelineModule whose stage boundaries are pipesplit\'s measured split."""', "",
        '    def _partition_layers(self, method="parameters"):',
        f"        self.parts = {parts}",
        "        self._set_bounds(start=self.parts[self.stage_id], stop=self.parts[self.stage_id + 1])", "", "",
        f"model = PinnedPipe(layers=layers, num_stages={stages})"])
    return Exported(text=head + code + "\n" + config, unexpressible=why, cuts=cuts)


def export_to(fmt: str, view: PlanView, **deepspeed_parts: Sequence[int] | None) -> Exported:
    """The plan in format ``fmt`` (one of ``FORMATS``)."""
    if fmt == "torchtitan":
        return torchtitan(view)
    if fmt == "megatron":
        return megatron(view)
    if fmt == "deepspeed":
        return deepspeed(view, **deepspeed_parts)
    raise ValueError(f"--to {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
