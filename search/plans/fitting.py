"""What ``--device-memory`` means for a study, settled before anything is profiled or built: whether the
whole model fits one device (a serial baseline, so speedup can be the figure), the figure plans are ranked
by, each plan's per-rank prediction from the model on meta (rank 0 also holding the serial model where
speedup is the figure), and the leanest plan, or one line where no plan of the asked shape fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.budget import MemoryPrediction, format_size
from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.core.spec import ModelSpec
from search.trials.metric import choose_metric

__all__ = ["DeviceFit", "device_fit"]


@dataclass(frozen=True, kw_only=True)
class DeviceFit:
    """A study's memory settings as the search uses them."""

    metric: str = "speedup"
    """The figure plans are ranked by (``search.trials.metric``): speedup only where a serial baseline is timed."""
    serial_fits: bool = True
    """The whole model fits one device (always, without a limit): a serial baseline can be timed."""
    whole_bytes: int = 0
    """The whole model's predicted peak on one device (0 without a limit)."""
    memory_of: Callable[[SplitPlan], MemoryPrediction] | None = field(default=None, compare=False)
    """Each plan's per-rank prediction without the runtime's own memory (None without a limit)."""
    first_runtime: int = 0
    """The runtime memory predicted on each rank until a trial measures it: a process's started as the ranks are
    that builds what a rank builds before its stage (``pipeline.ranks.probe.rank_runtime``)."""
    lean_cuts: tuple[int, ...] = ()
    """Block cuts whose largest rank needs least (empty without a limit, or with virtual stages)."""
    least_recompute: Callable[[SplitPlan, Sequence[int]], tuple[int, ...] | None] | None = field(default=None,
                                                                                                   compare=False)
    """Training under a limit: the fewest recomputed blocks per stage with which a plan fits, given each rank's
    runtime memory (None where even recomputing every block does not)."""
    leaves: Any = field(default=None, compare=False)
    """The per-sample activation bytes every prediction above reads (``pipeline.models.footprint.LeafBytes``):
    a training study replaces them with its profile's measured saved bytes once it has one (``use_profile``)."""

    def use_profile(self, saved: Sequence[int], cands: Any) -> bool:
        """Predict activations from a training profile's measured saved bytes per segment from now on; whether
        there were any to use (a forward-only profile has none)."""
        if self.leaves is None or not any(saved):
            return False
        from pipeline.models.footprint import measured_saved

        measured_saved(self.leaves, cands, saved)
        return True


def device_fit(budget: int | None, meta: Any, cands: Any, spec: ModelSpec, *, ranks: int, chunks: int,
               schedule: str, per_rank: int, mode: str, optimizer: str, device: str, backend: str,
               objective: str | None = None, recompute: str = "none", dp_shard: int = 1) -> DeviceFit:
    """The study's ``DeviceFit`` for the ``objective`` asked (None: speedup where the whole model fits); one
    line, before anything starts, where no plan of ``ranks`` ranks at ``chunks`` microbatches fits
    ``budget``, or where the model must be whole on a rank (torchpippy, a model that cannot be built on
    meta) and does not fit."""
    if budget is None:
        return DeviceFit(metric=choose_metric(objective, serial_fits=True))
    from pipeline.models.footprint import leaf_outputs, least_recompute, predict_plan, require_fitting_plan
    from pipeline.ranks.probe import rank_runtime

    leaves = leaf_outputs(meta, spec, cands)
    import json

    runtime = rank_runtime(json.dumps(spec.to_dict(), sort_keys=True), cands.granularity, device)
    template = SplitPlan(model=spec, split_points=tuple(SplitPoint(c) for c in cands.cuts[:ranks * per_rank - 1]),
                         chunks=chunks, schedule=schedule, stages_per_rank=per_rank, mode=mode, optimizer=optimizer,
                         device=device, dp_shard=dp_shard)
    whole = predict_plan(template, meta, cands, budget, runtime=runtime, leaves=leaves)
    why_whole = None
    if backend == "pippy":
        why_whole = "torchpippy 0.2 traces the whole model on every rank: use --backend torch"
    elif meta.built_whole:
        why_whole = ("it cannot be built on the meta device, so every rank builds it whole: make its constructor "
                     "meta-friendly (no explicit device='cpu', no reading values in __init__)")
    if why_whole and not whole.serial_fits:
        raise PipesplitError(f"the whole {spec.label} needs about {format_size(whole.whole)} on one device, over "
                             f"--device-memory {format_size(budget)}, and {why_whole}")
    metric = choose_metric(objective, serial_fits=whole.serial_fits)
    serial = metric == "speedup"
    try:
        lean = require_fitting_plan(template, meta, cands, budget, runtime, leaves,
                                    serial=whole.whole - runtime if serial else 0)
    except PipesplitError:
        if recompute == "none" or mode != "train" or not _fits_recomputed(template, meta, cands, budget, runtime,
                                                                            leaves, serial, ranks * per_rank):
            raise
        lean = ()  # only recomputation makes a plan fit: each plan is given what it needs as it comes

    def memory_of(plan: SplitPlan) -> MemoryPrediction:
        return predict_plan(plan, meta, cands, budget, runtime=0, leaves=leaves, serial=serial)

    def least(plan: SplitPlan, runtimes: Sequence[int]) -> tuple[int, ...] | None:
        return least_recompute(plan, meta, cands, budget, runtimes, leaves, serial=serial)

    return DeviceFit(metric=metric, serial_fits=whole.serial_fits, whole_bytes=whole.whole, memory_of=memory_of,
                     first_runtime=runtime, lean_cuts=lean, leaves=leaves,
                     least_recompute=least if mode == "train" and recompute == "search" else None)


def _fits_recomputed(template: SplitPlan, meta: Any, cands: Any, budget: int, runtime: int, leaves: Any,
                     serial: bool, stages: int) -> bool:
    """Whether the uniform plan of ``stages`` stages fits ``budget`` with every block recomputed."""
    import dataclasses

    from pipeline.models.footprint import predict_plan

    try:
        plan = dataclasses.replace(template, split_points=cands.policy_points("uniform", stages), recompute="full")
    except PipesplitError:
        return False
    return predict_plan(plan, meta, cands, budget, runtime=runtime, leaves=leaves, serial=serial).worst.total <= budget
