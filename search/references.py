"""The plans a search starts from: the cost model's best and every reference policy, deduplicated."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.partition import ranked
from costmodel.policies import balanced_cuts, equal_size_cuts, uniform_cuts
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


def seeds(profile: Profile, cands: Candidates, stages: int, chunks: list[int]) -> list[Seed]:
    """PiPPy equal-size first (the lab's baseline), then the cost model's best two, then the policies.

    Reference policies run at the chunk count that the cost model predicts best, so that a comparison
    between them is a comparison of where they cut.
    """
    best = ranked(profile, stages, chunks)
    m = best[0].chunks
    out: list[Seed] = []
    try:
        eq = equal_size_cuts([n for _, n in cands.units], stages)
        out.append(Seed("pippy-equal-size", m, points=tuple(SplitPoint(cands.units[i][0]) for i in eq)))
    except ValueError:
        pass  # PiPPy's rule cannot make that many stages here; the summary says so
    out.append(Seed("costmodel-optimum", m, cuts=best[0].cuts))
    runner_up = next((p for p in best[1:]), None)
    if runner_up is not None:
        out.append(Seed("costmodel-next", runner_up.chunks, cuts=runner_up.cuts))
    n = len(profile.segments)
    policies = {
        "uniform": uniform_cuts(n, stages),
        "params-balanced": balanced_cuts([s.param_bytes for s in profile.segments], stages),
        "time-balanced": balanced_cuts([s.latency(profile.batch_size // m) for s in profile.segments], stages),
        "flops-balanced": balanced_cuts([s.flops for s in profile.segments], stages),
    }
    for name, cuts in policies.items():
        out.append(Seed(name, m, cuts=tuple(cuts)))
    merged: dict[tuple, Seed] = {}
    for s in out:
        key = (s.cuts, s.points, s.chunks)
        if key in merged:
            prev = merged[key]
            merged[key] = Seed(f"{prev.source}+{s.source}", prev.chunks, prev.cuts, prev.points)
        else:
            merged[key] = s
    return list(merged.values())
