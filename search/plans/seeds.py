"""The plans a search starts from: the cost model's best and every reference policy, deduplicated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costmodel.partition import ranked
from costmodel.simulate import simulate
from costmodel.types import Profile
from pipeline.core.plan import SplitPoint
from pipeline.core.policies import nearest_boundaries
from pipeline.models.candidates import Candidates
from pipeline.peers.registry import DEFAULT_RULES, PIPPY, POLICIES
from pipeline.peers.remembered import RememberedRules
from search.plans.space import PlanPoint, PlanSpace

__all__ = ["Seed", "forward_starts", "layout_seeds", "frameworks_line", "seeds", "unseeded_frameworks"]


@dataclass(frozen=True, kw_only=True)
class Seed:
    """A plan to measure early: block cuts (searchable), or fixed split points (PiPPy's may cut mid-block)."""

    source: str
    """The policy names (or ``costmodel-optimum`` / ``costmodel-next``) that chose it, joined by '+'."""
    chunks: int
    cuts: tuple[int, ...] | None = None
    points: tuple[SplitPoint, ...] | None = None
    layout: int = 0
    """The space's layout (schedule and V) the seed runs on."""


def _best_chunks(profile: Profile, cuts: list[int], chunks: list[int]) -> int:
    """The chunk count the cost model predicts fastest for these cuts: a baseline gets tuned chunks too."""
    return min((m for m in chunks if profile.batch_size % m == 0), key=lambda m: simulate(profile, cuts, m).makespan_s)


def seeds(profile: Profile, cands: Candidates, stages: int, chunks: list[int], *, policies: bool = True,
          rules: RememberedRules = RememberedRules(folder=None)) -> list[Seed]:
    """PiPPy equal-size first (the lab's baseline), then the cost model's best two, then each training
    framework's default rule (torchtitan, Megatron-Core, DeepSpeed: what its user gets) where it applies and
    is installed, then (``policies``) the other reference policies: a sweep reports every policy; a search
    leaves the rest to its sampler.

    Every reference runs at the chunk count that the cost model predicts best for its own cuts, as the
    lab tuned PiPPy's chunks by hand: a baseline at a chunk count that suits another split would flatter
    the winner. PiPPy may cut mid-block; its chunk count is chosen for the block cuts nearest to its cuts
    by parameter share. ``rules``: where the frameworks' answers are remembered (``pipeline.peers.remembered``).
    """
    best = ranked(profile, stages, chunks)
    m = best[0].chunks
    inputs = cands.policy_inputs(segment_times=[s.latency(profile.batch_size // m) for s in profile.segments],
                                 segment_flops=[s.flops for s in profile.segments])
    out: list[Seed] = []
    n = len(profile.segments)
    try:
        eq = POLICIES[PIPPY].cuts(inputs, stages)
        sizes = inputs.unit_elements
        total = float(sum(sizes)) or 1.0
        params = inputs.segment_elements
        before = [sum(params[:k]) / (sum(params) or 1.0) for k in range(n)]
        proxy = nearest_boundaries([sum(sizes[:i]) / total for i in eq], before)
        out.append(Seed(source=PIPPY, chunks=_best_chunks(profile, proxy, chunks), points=cands.unit_points(eq)))
    except ValueError:
        pass  # PiPPy's rule cannot make that many stages here; the summary says so
    out.append(Seed(source="costmodel-optimum", chunks=m, cuts=best[0].cuts))
    if len(best) > 1:
        out.append(Seed(source="costmodel-next", chunks=best[1].chunks, cuts=best[1].cuts))
    for name, pol in POLICIES.items():
        if pol.on_units or not (policies or pol.default_rule):
            continue
        try:
            cuts = rules.cuts(pol, inputs, stages)
        except ValueError:  # a framework's rule that does not apply to this model, or refuses this many stages
            continue
        out.append(Seed(source=name, chunks=_best_chunks(profile, cuts, chunks), cuts=tuple(cuts)))
    merged: dict[tuple[object, ...], Seed] = {}
    for s in out:
        key = (s.cuts, s.points, s.chunks, s.layout)
        prev = merged.get(key)
        merged[key] = s if prev is None else Seed(source=f"{prev.source}+{s.source}", chunks=prev.chunks,
                                                  cuts=prev.cuts, points=prev.points)
    return list(merged.values())


def unseeded_frameworks(cands: Candidates, stages: int,
                        rules: RememberedRules = RememberedRules(folder=None)) -> dict[str, str]:
    """Why a framework's default rule gives the search no seed here (not installed, no single stack of layers,
    a stage count the framework refuses), by rule name: the search prints it in one line."""
    inputs = cands.policy_inputs()
    out = {}
    for name in DEFAULT_RULES:
        try:
            rules.cuts(POLICIES[name], inputs, stages)
        except ValueError as e:
            out[name] = str(e)
    return out


def frameworks_line(missing: dict[str, str]) -> str:
    """One line for the rules ``unseeded_frameworks`` left out, those with the same reason together."""
    by: dict[str, list[str]] = {}
    for name, why in missing.items():
        by.setdefault(why, []).append(name)
    return "not measured: " + "; ".join(f"{', '.join(names)} ({why})" for why, names in by.items())


def forward_starts(profile: Profile, space: PlanSpace, layout: int) -> list[PlanPoint]:
    """The forward model's balanced cuts into ranks x V stages at each of the layout's chunk counts (exact,
    by ``costmodel.partition``): where a schedule's own optimum is searched from."""
    lay = space.layouts[layout]
    return [PlanPoint(cuts=p.cuts, chunks=p.chunks, layout=layout)
            for p in ranked(profile, space.stages * lay.per_rank, list(space.layout_chunks(layout)))]


def layout_seeds(profile: Profile, space: PlanSpace,
                 optimum: Callable[[int], PlanPoint | None] | None = None) -> list[Seed]:
    """The cost model's optimum on each layout: ``optimum(layout)`` where the schedule is priced by its own
    action order (every layout it returns a plan for, the first too; none where every plan is predicted
    over the memory limit), else, on the layouts after the first (which ``seeds`` covers), the forward
    model's best cuts into ranks x V stages (balanced stages, the schedule not priced)."""
    out = []
    for k, lay in enumerate(space.layouts):
        best = optimum(k) if optimum is not None else None
        if best is None and k:
            best = forward_starts(profile, space, k)[0]
        if best is not None:
            out.append(Seed(source=f"costmodel-optimum@{lay.label}", chunks=best.chunks, cuts=best.cuts, layout=k))
    return out
