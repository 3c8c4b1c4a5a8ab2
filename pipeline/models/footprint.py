"""What each stage of a plan will hold, from the model on meta, before any tensor is allocated.

Weights: each stage's parameters and buffers (``Candidates.stage_elements``; a tied weight on two stages is
counted on both, as both ranks make it). Activations, per sample: every leaf module's output bytes in one
forward on meta, summed over a stage (what autograd keeps for a training step's backward is about the
leaves' inputs and outputs) and their largest (what an inference step holds at once, in and out).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten

from pipeline.core.budget import BlockBytes, MemoryPrediction, RankMemory, format_size, leanest_cuts, predict_memory
from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.recompute import counts_for, least_counts
from pipeline.core.spec import ModelSpec
from pipeline.models.batch import example_input, rows
from pipeline.models.candidates import Candidates
from pipeline.models.meta import MetaModel
from pipeline.models.traces import run_hooked
from pipeline.models.weights import with_forward

__all__ = ["LeafBytes", "StageBytes", "default_budget", "leaf_outputs", "leanest", "least_recompute", "measured_saved",
           "predict_plan", "probe_resident", "require_fitting_plan", "rank_runtime",
           "require_whole_fits", "resident_bytes", "segment_bytes", "stage_bytes"]


@dataclass(frozen=True, kw_only=True)
class StageBytes:
    """Per stage of one plan: bytes of its weights, and of its leaves' outputs for one sample."""

    weights: tuple[int, ...]
    leaf_out_sum: tuple[int, ...]
    """All its leaf modules' outputs, one sample (a training step keeps about this per microbatch in flight)."""
    leaf_out_max: tuple[int, ...]
    """Its largest leaf output, one sample (an inference step holds a few such at once)."""
    blocks: tuple[tuple[BlockBytes, ...], ...] = ()
    """Per stage, each block of the stack that begins in it, in order: what recomputing it saves."""

    def to_dict(self) -> dict[str, list[int]]:
        return {"weights": list(self.weights), "leaf_out_sum": list(self.leaf_out_sum),
                "leaf_out_max": list(self.leaf_out_max)}


class LeafBytes(dict[int, int]):
    """Each leaf module call's output bytes for one sample, by the position of its start in ``cands.events``;
    ``inputs``: every once-called module's largest input tensor, one sample, by the same positions (what a
    recomputed block keeps: its hidden state; the masks and rotary tables it shares with the others cost nothing).
    ``saved_at``: where a training profile measured them (``measured_saved``), each segment's saved tensors for
    one sample by its start's position, which then replace the leaves' outputs as a stage's activations."""

    inputs: dict[int, int]
    saved_at: dict[int, int] | None = None


def measured_saved(leaves: LeafBytes, cands: Candidates, saved: Sequence[int]) -> None:
    """Count a stage's activations from what autograd measurably saved per segment (a training profile's
    ``saved_bytes``, one per candidate block), not from its leaf modules' outputs, which miss what functional
    ops keep (a Llama MLP's ``act(gate) * up``, rotary embeddings, attention): 1.5x more on an ``hf:llama``."""
    index = cands.event_index()
    leaves.saved_at = {index["B:" + b]: int(s) for b, s in zip(cands.blocks, saved)}


def _bytes(t: object) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def leaf_outputs(meta: MetaModel, spec: ModelSpec, cands: Candidates) -> LeafBytes:
    """Each leaf module call's output bytes for one sample (and each module's input: ``LeafBytes.inputs``)."""
    index = {e: i for i, e in enumerate(cands.events)}
    out = LeafBytes()
    out.inputs = {}

    def run(model: torch.nn.Module, x: tuple[torch.Tensor, ...]) -> None:
        out.clear()
        handles = []
        for name, mod in model.named_modules(remove_duplicate=False):
            if f"B:{name}" not in index:
                continue
            leaf = next(mod.children(), None) is None

            def hook(m: torch.nn.Module, a: object, k: object, o: object, pos: int = index[f"B:{name}"],
                     leaf: bool = leaf) -> None:
                out.inputs[pos] = max((_bytes(t) for t in tree_flatten((a, k))[0]), default=0)
                if leaf:
                    out[pos] = sum(_bytes(t) for t in tree_flatten(o)[0])

            handles.append(mod.register_forward_hook(hook, with_kwargs=True))
        run_hooked(model, x, handles)

    # mixed precision: the outputs' dtypes are autocast's (FSDP2's bf16 weights give no bigger ones)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.mixed_precision == "bf16"):
        with_forward(meta, rows(example_input(spec), 1), run)
    return out


def _blocks(cands: Candidates, plan: SplitPlan, leaves: dict[int, int]) -> tuple[tuple[BlockBytes, ...], ...]:
    """Per stage, what each of its stack's blocks saves for backward (its leaves' outputs) and keeps if
    recomputed (its input); empty where the model has no single stack."""
    try:
        names = cands.stage_blocks(plan)
    except PipesplitError:
        return ()
    index = cands.event_index()
    inputs = getattr(leaves, "inputs", {})
    out = []
    measured = getattr(leaves, "saved_at", None)
    for stage in names:
        got = []
        for n in stage:
            lo, hi = index["B:" + n], index.get("E:" + n, len(cands.events))
            saved = measured[lo] if measured and lo in measured else sum(b for pos, b in leaves.items() if lo <= pos < hi)
            got.append(BlockBytes(saved=saved, kept=inputs.get(lo, 0)))
        out.append(tuple(got))
    return tuple(out)


def stage_bytes(meta: MetaModel, spec: ModelSpec, cands: Candidates, plan: SplitPlan,
                leaves: dict[int, int] | None = None) -> StageBytes:
    """The plan's stages' weights and per-sample activations (``leaves`` from ``leaf_outputs``, made here when not given)."""
    size = torch.empty(0, dtype=getattr(torch, spec.dtype)).element_size()
    leaves = leaf_outputs(meta, spec, cands) if leaves is None else leaves
    starts = cands.stage_positions(plan)
    bounds = list(zip(starts, [*starts[1:], len(cands.events)]))
    within = [[b for pos, b in leaves.items() if lo <= pos < hi] for lo, hi in bounds]
    measured = getattr(leaves, "saved_at", None)
    sums = (tuple(sum(b for pos, b in measured.items() if lo <= pos < hi) for lo, hi in bounds) if measured
            else tuple(sum(w) for w in within))
    return StageBytes(weights=tuple(n * size for n in cands.stage_elements(plan)),
                      leaf_out_sum=sums, leaf_out_max=tuple(max(w, default=0) for w in within),
                      blocks=_blocks(cands, plan, leaves) if plan.mode == "train" else ())


def resident_bytes() -> int:
    """This process's resident memory now (Linux; 0 elsewhere): a rank's runtime, before it makes a model."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_PROBE = """
import sys
import torch, torch.distributed, torch._dynamo, torch.export
import pipeline.stage.trial
from pipeline.models.footprint import probe_resident
print(probe_resident(sys.argv[1], sys.argv[2]))
"""


def probe_resident(spec_json: str, granularity: str) -> int:
    """In a probe process (a fresh interpreter, or one forked as the ranks are): build what a rank builds
    before its stage (the model on meta, its candidates, its fake-tensor copy); its resident bytes then."""
    import json

    from pipeline.core.spec import ModelSpec
    from pipeline.models.build import build_meta_model
    from pipeline.models.candidates import find_candidates
    from pipeline.models.fake import fake_model

    spec = ModelSpec.from_dict(json.loads(spec_json))
    meta = build_meta_model(spec)
    find_candidates(meta, spec, granularity)
    fake_model(meta, torch.device("cpu"))
    return resident_bytes()


@functools.lru_cache(maxsize=4)
def rank_runtime(spec_json: str, granularity: str = "block", device: str = "cpu") -> int:
    """A stage rank's own memory before it makes its stage real: a fresh interpreter that imports what a rank
    imports and builds the model on meta and its fake-tensor copy, its resident memory (CPU; 0 on CUDA,
    where the peak measured is what torch allocates). A search replaces it with what measured trials held
    once it has any: a rank's process group and traces add to it (about 150 MiB for a small LLM here)."""
    if device == "cuda":
        return 0
    import subprocess
    import sys

    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, spec_json, granularity], capture_output=True, text=True,
                             timeout=600, check=True)
        return int(out.stdout.split()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return resident_bytes()  # this process imports the same stack, and more


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def default_budget(device: str, ranks: int) -> int:
    """Memory each stage's device has: the GPU's total on CUDA; on CPU the host's available memory shared
    among the ranks it runs."""
    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return _available_bytes() // max(1, ranks)


def predict_plan(plan: SplitPlan, meta: MetaModel, cands: Candidates, budget: int | None = None,
                 runtime: int | None = None, leaves: dict[int, int] | None = None,
                 serial: bool = False, counts: tuple[int, ...] | None = None) -> MemoryPrediction:
    """Each rank's predicted peak for ``plan`` against ``budget`` (default: ``default_budget``); the runtime
    is this process's resident memory on CPU (a rank imports the same stack), 0 on CUDA (where the peak
    measured is what torch allocates). ``leaves`` (``leaf_outputs``) saves a forward per plan; ``serial``:
    rank 0 also holds the whole model to time the serial baseline; ``counts``: recomputed blocks per stage in
    place of the plan's own (``--recompute``)."""
    sb = stage_bytes(meta, plan.model, cands, plan, leaves)
    if counts is None and plan.recompute != "none":
        counts = counts_for(plan.recompute, [len(b) for b in sb.blocks]) if sb.blocks else None
    if runtime is None:
        runtime = 0 if plan.device == "cuda" else resident_bytes()
    return predict_memory(plan, weights=sb.weights, leaf_out_sum=sb.leaf_out_sum, leaf_out_max=sb.leaf_out_max,
                          runtime=runtime, blocks=sb.blocks, counts=counts,
                          budget=default_budget(plan.device, plan.ranks) if budget is None else budget, serial=serial)


def least_recompute(plan: SplitPlan, meta: MetaModel, cands: Candidates, budget: int, runtime: int | Sequence[int],
                    leaves: dict[int, int] | None = None, serial: bool = False) -> tuple[int, ...] | None:
    """The fewest recomputed blocks per stage with which every rank of ``plan`` fits ``budget`` (``runtime``:
    one figure, or one per rank); None where even every block recomputed does not, or the model has no stack."""
    if plan.mode != "train":
        return None
    sb = stage_bytes(meta, plan.model, cands, plan, leaves)
    if not sb.blocks:
        return None
    rt = [runtime] * plan.ranks if isinstance(runtime, int) else list(runtime)

    def fits(r: int, mine: dict[int, int]) -> bool:
        counts = [mine.get(s, 0) for s in range(plan.stages)]
        p = predict_memory(plan, weights=sb.weights, leaf_out_sum=sb.leaf_out_sum, leaf_out_max=sb.leaf_out_max,
                           runtime=0, budget=budget, serial=serial, blocks=sb.blocks, counts=counts)
        return p.ranks[r].total + rt[min(r, len(rt) - 1)] <= budget

    return least_counts([len(b) for b in sb.blocks], [plan.rank_stages(r) for r in range(plan.ranks)], fits)


def require_whole_fits(meta: MetaModel, cands: Candidates, spec: ModelSpec, budget: int, why: str, *,
                       mode: str = "infer", optimizer: str = "adamw", device: str = "cpu",
                       leaves: dict[int, int] | None = None) -> MemoryPrediction:
    """The whole model's prediction on one device; one line saying ``why`` it must fit where it does not."""
    probe = SplitPlan(model=spec, split_points=(SplitPoint(cands.cuts[0]),), chunks=1, mode=mode, optimizer=optimizer,
                      device=device)
    whole = predict_plan(probe, meta, cands, budget, leaves=leaves)
    if not whole.serial_fits:
        raise PipesplitError(f"the whole {spec.label} needs about {format_size(whole.whole)} on one device, over "
                             f"--device-memory {format_size(budget)}: {why}")
    return whole


def segment_bytes(meta: MetaModel, spec: ModelSpec, cands: Candidates, leaves: dict[int, int] | None = None,
                  dtype: str | None = None) -> StageBytes:
    """Every candidate segment's bytes (a plan cut at every block), at ``dtype`` (default the spec's): what the
    leanest plan of any stage count is found from without a prediction per plan."""
    spec = spec if dtype is None else dataclasses.replace(spec, dtype=dtype)
    every = SplitPlan(model=spec, split_points=tuple(SplitPoint(c) for c in cands.cuts), chunks=1)
    return stage_bytes(meta, spec, cands, every, leaves)


def leanest(plan: SplitPlan, seg: StageBytes, runtime: int, serial: int = 0) -> tuple[tuple[int, ...], RankMemory]:
    """The block cuts (segment indices) of the plan's ranks whose largest rank needs least, and that rank."""
    return leanest_cuts(plan, weights=seg.weights, leaf_out_sum=seg.leaf_out_sum, leaf_out_max=seg.leaf_out_max,
                        runtime=runtime, serial=serial)


def require_fitting_plan(plan: SplitPlan, meta: MetaModel, cands: Candidates, budget: int, runtime: int,
                         leaves: dict[int, int] | None = None, serial: int = 0) -> tuple[int, ...]:
    """The leanest block cuts for ``plan``'s shape (ranks, chunks, mode) where its largest rank fits ``budget``
    (``serial``: bytes of the whole model rank 0 holds to time a serial baseline); else one line, before anything
    is built or profiled, naming the fewest ranks or the dtype at which one would."""
    leaves = leaf_outputs(meta, plan.model, cands) if leaves is None else leaves
    seg = segment_bytes(meta, plan.model, cands, leaves)
    if plan.stages_per_rank > 1 or plan.ranks > len(seg.weights):
        return ()  # round-robin stages: each plan is checked as it comes
    cuts, worst = leanest(plan, seg, runtime, serial)
    if worst.total <= budget:
        return cuts
    fixes = []
    if serial and leanest(plan, seg, runtime)[1].total <= budget:
        fixes.append("--objective throughput (no serial model beside the pipeline on rank 0)")
    for ranks in range(plan.ranks + 1, len(seg.weights) + 1):
        more = dataclasses.replace(plan, split_points=tuple(SplitPoint(c) for c in cands.cuts[:ranks - 1]))
        _, w = leanest(more, seg, runtime, serial)
        if w.total <= budget:
            fixes.append(f"--stages {ranks} (its leanest plan's largest rank: about {format_size(w.total)})")
            break
    if plan.model.dtype == "float32":
        half = dataclasses.replace(plan.model, dtype="bfloat16")
        _, w = leanest(dataclasses.replace(plan, model=half), segment_bytes(meta, plan.model, cands, leaves,
                                                                            "bfloat16"), runtime, serial // 2)
        if w.total <= budget:
            fixes.append(f"--dtype bfloat16 (about {format_size(w.total)})")
    if runtime >= budget:
        fixes.append(f"a larger --device-memory: the runtime alone is about {format_size(runtime)}")
    raise PipesplitError(
        f"no split of {plan.model.label} into {plan.ranks} stages fits --device-memory {format_size(budget)}: the "
        f"leanest one's {worst.describe()}; nothing was run. Use " + (" or ".join(fixes) if fixes else
                                                                      "a smaller model, batch or --device-memory"))
