"""What each stage of a plan will hold, from the model on meta, before any tensor is allocated.

Weights: each stage's parameters and buffers (``Candidates.stage_elements``; a tied weight on two stages is
counted on both, as both ranks make it). Activations, per sample: every leaf module's output bytes in one
forward on meta, summed over a stage (what autograd keeps for a training step's backward is about the
leaves' inputs and outputs) and their largest (what an inference step holds at once, in and out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten

from pipeline.core.budget import MemoryPrediction, predict_memory
from pipeline.core.plan import SplitPlan
from pipeline.core.spec import ModelSpec
from pipeline.models.batch import example_input, rows
from pipeline.models.candidates import Candidates
from pipeline.models.meta import MetaModel
from pipeline.models.weights import with_forward

__all__ = ["StageBytes", "default_budget", "leaf_outputs", "predict_plan", "require_whole_fits", "resident_bytes",
           "stage_bytes"]


@dataclass(frozen=True, kw_only=True)
class StageBytes:
    """Per stage of one plan: bytes of its weights, and of its leaves' outputs for one sample."""

    weights: tuple[int, ...]
    leaf_out_sum: tuple[int, ...]
    """All its leaf modules' outputs, one sample (a training step keeps about this per microbatch in flight)."""
    leaf_out_max: tuple[int, ...]
    """Its largest leaf output, one sample (an inference step holds a few such at once)."""

    def to_dict(self) -> dict[str, list[int]]:
        return {"weights": list(self.weights), "leaf_out_sum": list(self.leaf_out_sum),
                "leaf_out_max": list(self.leaf_out_max)}


def leaf_outputs(meta: MetaModel, spec: ModelSpec, cands: Candidates) -> dict[int, int]:
    """Each leaf module call's output bytes for one sample, by the position of its start in ``cands.events``."""
    index = {e: i for i, e in enumerate(cands.events)}
    out: dict[int, int] = {}

    def run(model: torch.nn.Module, x: tuple[torch.Tensor, ...]) -> None:
        out.clear()
        handles = []
        for name, mod in model.named_modules(remove_duplicate=False):
            if f"B:{name}" not in index or next(mod.children(), None) is not None:
                continue

            def hook(m: torch.nn.Module, a: object, o: object, pos: int = index[f"B:{name}"]) -> None:
                out[pos] = sum(t.numel() * t.element_size() for t in tree_flatten(o)[0] if isinstance(t, torch.Tensor))

            handles.append(mod.register_forward_hook(hook))
        try:
            with torch.no_grad():
                model(*x)
        finally:
            for h in handles:
                h.remove()

    with_forward(meta, rows(example_input(spec), 1), run)
    return out


def stage_bytes(meta: MetaModel, spec: ModelSpec, cands: Candidates, plan: SplitPlan,
                leaves: dict[int, int] | None = None) -> StageBytes:
    """The plan's stages' weights and per-sample activations (``leaves`` from ``leaf_outputs``, made here when not given)."""
    size = torch.empty(0, dtype=getattr(torch, spec.dtype)).element_size()
    leaves = leaf_outputs(meta, spec, cands) if leaves is None else leaves
    starts = cands.stage_positions(plan)
    bounds = list(zip(starts, [*starts[1:], len(cands.events)]))
    within = [[b for pos, b in leaves.items() if lo <= pos < hi] for lo, hi in bounds]
    return StageBytes(weights=tuple(n * size for n in cands.stage_elements(plan)),
                      leaf_out_sum=tuple(sum(w) for w in within), leaf_out_max=tuple(max(w, default=0) for w in within))


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
                 runtime: int | None = None, leaves: dict[int, int] | None = None) -> MemoryPrediction:
    """Each rank's predicted peak for ``plan`` against ``budget`` (default: ``default_budget``); the runtime
    is this process's resident memory on CPU (a rank imports the same stack), 0 on CUDA (where the peak
    measured is what torch allocates). ``leaves`` (``leaf_outputs``) saves a forward per plan."""
    sb = stage_bytes(meta, plan.model, cands, plan, leaves)
    if runtime is None:
        runtime = 0 if plan.device == "cuda" else resident_bytes()
    return predict_memory(plan, weights=sb.weights, leaf_out_sum=sb.leaf_out_sum, leaf_out_max=sb.leaf_out_max,
                          runtime=runtime, budget=default_budget(plan.device, plan.ranks) if budget is None else budget)


def require_whole_fits(meta: MetaModel, cands: Candidates, spec: ModelSpec, budget: int, why: str, *,
                       mode: str = "infer", optimizer: str = "adamw", device: str = "cpu",
                       leaves: dict[int, int] | None = None) -> MemoryPrediction:
    """The whole model's prediction on one device; one line saying ``why`` it must fit where it does not."""
    from pipeline.core.budget import format_size
    from pipeline.core.errors import PipesplitError
    from pipeline.core.plan import SplitPoint

    probe = SplitPlan(model=spec, split_points=(SplitPoint(cands.cuts[0]),), chunks=1, mode=mode, optimizer=optimizer,
                      device=device)
    whole = predict_plan(probe, meta, cands, budget, leaves=leaves)
    if not whole.serial_fits:
        raise PipesplitError(f"the whole {spec.label} needs about {format_size(whole.whole)} on one device, over "
                             f"--device-memory {format_size(budget)}: {why}")
    return whole
