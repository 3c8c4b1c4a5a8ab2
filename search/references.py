"""The plans a search starts from: the cost model's best and every reference policy, deduplicated."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.partition import ranked
from costmodel.policies import balanced_cuts, equal_size_cuts, nearest_boundaries, uniform_cuts
from costmodel.simulate import simulate
from costmodel.types import Profile
from pipeline.candidates import Candidates
from pipeline.plan import SplitPoint


@dataclass(frozen=True)
class Seed:
    """A plan to measure early: block cuts (searchable), or fixed split points (PiPPy's may cut mid-block)."""

    source: str
    chunks: int
    cuts: tuple[int, ...] | None = None
    points: tuple[SplitPoint, ...] | None = None


def _best_chunks(profile: Profile, cuts: list[int], chunks: list[int]) -> int:
    """The chunk count the cost model predicts fastest for these cuts: a baseline gets tuned chunks too."""
    return min((m for m in chunks if profile.batch_size % m == 0), key=lambda m: simulate(profile, cuts, m).makespan_s)


def seeds(profile: Profile, cands: Candidates, stages: int, chunks: list[int]) -> list[Seed]:
    """PiPPy equal-size first (the lab's baseline), then the cost model's best two, then the policies.

    Every reference runs at the chunk count that the cost model predicts best for its own cuts, as the
    lab tuned PiPPy's chunks by hand: a baseline at a chunk count that suits another split would flatter
    the winner. PiPPy may cut mid-block; its chunk count is chosen for the block cuts nearest to its cuts
    by parameter share.
    """
    best = ranked(profile, stages, chunks)
    m = best[0].chunks
    out: list[Seed] = []
    n = len(profile.segments)
    try:
        sizes = [k for _, k in cands.units]
        eq = equal_size_cuts(sizes, stages)
        total = float(sum(sizes)) or 1.0
        params = [s.param_bytes for s in profile.segments]
        before = [sum(params[:k]) / (sum(params) or 1.0) for k in range(n)]
        proxy = nearest_boundaries([sum(sizes[:i]) / total for i in eq], before)
        out.append(Seed("pippy-equal-size", _best_chunks(profile, proxy, chunks),
                        points=tuple(SplitPoint(cands.units[i][0]) for i in eq)))
    except ValueError:
        pass  # PiPPy's rule cannot make that many stages here; the summary says so
    out.append(Seed("costmodel-optimum", m, cuts=best[0].cuts))
    runner_up = next((p for p in best[1:]), None)
    if runner_up is not None:
        out.append(Seed("costmodel-next", runner_up.chunks, cuts=runner_up.cuts))
    policies = {
        "uniform": uniform_cuts(n, stages),
        "params-balanced": balanced_cuts([s.param_bytes for s in profile.segments], stages),
        "time-balanced": balanced_cuts([s.latency(profile.batch_size // m) for s in profile.segments], stages),
        "flops-balanced": balanced_cuts([s.flops for s in profile.segments], stages),
    }
    for name, cuts in policies.items():
        out.append(Seed(name, _best_chunks(profile, cuts, chunks), cuts=tuple(cuts)))
    merged: dict[tuple, Seed] = {}
    for s in out:
        key = (s.cuts, s.points, s.chunks)
        if key in merged:
            prev = merged[key]
            merged[key] = Seed(f"{prev.source}+{s.source}", prev.chunks, prev.cuts, prev.points)
        else:
            merged[key] = s
    return list(merged.values())
