"""Which cost model prices a plan of the search, and its prediction: speed, bubble and memory per rank.

Forward-only plans at one stage per rank on GPipe or 1F1B are priced by ``costmodel.simulate`` (the
machine-aware flow shop that calibration refits). Every other plan (training steps, virtual stages,
zero-bubble and V schedules) is priced by ``costmodel.train``: the schedule's own per-rank action order
replayed over the profile's forward, backward and optimizer times. The order is torch's
(``pipeline.stage.orders``) or, where this torch cannot say, what a measured trial of that layout and chunk
count recorded; a training plan also needs a profile with backward times. A plan neither can price is
measured, not pruned, and its trial says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.simulate import simulate
from costmodel.train import predict_train
from costmodel.types import Machine, Profile
from search.plans.space import Layout

__all__ = ["SIMULATED", "Price", "price", "unpriced_reason"]

SIMULATED = ("GPipe", "1F1B")
"""Schedules ``costmodel.simulate`` prices (forward passes, one stage per rank)."""


@dataclass(frozen=True, kw_only=True)
class Price:
    """One plan's prediction, whichever model made it."""

    speedup: float
    makespan_s: float
    bubble_fraction: float
    model: str
    """``simulate`` or ``replay``."""
    rank_mem_bytes: tuple[int, ...] = ()
    """Per rank: what its stages hold (parameters; training: + gradients, optimizer state and activations
    in flight), without the runtime's own memory."""
    stage_s: tuple[float, ...] = ()
    """``simulate``'s per-stage seconds (the calibration's rows need them); empty for a replay."""
    ceiling: float | None = None


def simulated(layout: Layout, mode: str) -> bool:
    return mode == "infer" and layout.per_rank == 1 and layout.schedule in SIMULATED


def unpriced_reason(layout: Layout, mode: str, profile: Profile, order: object | None) -> str | None:
    """Why neither model can price a plan of ``layout`` (None when one can)."""
    if simulated(layout, mode):
        return None
    if mode == "train" and not profile.segments[0].backward_s:
        return "none: the profile has no backward times (a forward-only profile): measured, not pruned"
    if order is None:
        return (f"none: this torch does not give {layout.schedule} with V = {layout.per_rank}'s action order and no "
                "measured trial of that layout and chunk count has recorded one yet: measured, not pruned")
    return None


def _stage_params(profile: Profile, cuts: Sequence[int], ranks: int) -> tuple[int, ...]:
    bounds = [0, *cuts, len(profile.segments)]
    per_stage = [sum(s.param_bytes for s in profile.segments[a:b]) for a, b in zip(bounds, bounds[1:])]
    return tuple(sum(per_stage[r::ranks]) for r in range(ranks))  # round-robin; at V = 1 one stage each


def price(profile: Profile, cuts: Sequence[int], chunks: int, layout: Layout, *, mode: str, optimizer: str,
          order: Sequence[Sequence[str]] | None, machine: Machine | None = None,
          recompute: Sequence[int] | None = None, dp_shard: int = 1) -> Price:
    """The prediction for the plan (``unpriced_reason`` must be None); ``machine`` replaces the profile's;
    ``recompute``: the blocks each stage recomputes (training)."""
    if simulated(layout, mode):
        p = simulate(profile, cuts, chunks, layout.schedule, machine=machine)
        return Price(speedup=p.speedup, makespan_s=p.makespan_s, bubble_fraction=p.bubble_fraction,
                     model="simulate", rank_mem_bytes=_stage_params(profile, cuts, len(cuts) + 1),
                     stage_s=p.stage_s, ceiling=p.ceiling)
    if order is None:
        raise ValueError(f"{layout.label} needs an action order to be priced")
    t = predict_train(profile, cuts, chunks, order, optimizer=optimizer, train=mode == "train", machine=machine,
                      recompute=recompute, dp_shard=dp_shard)
    return Price(speedup=t.speedup, makespan_s=t.makespan_s, bubble_fraction=t.bubble_fraction, model="replay",
                 rank_mem_bytes=t.rank_mem_bytes)
