"""The search's proposal rule, pure: which unmeasured plan to measure next.

The calibrated cost model's ranking, best first (each layout's scores scaled by its own measured /
predicted median, so that layouts the model prices alike or not at all compete on what was measured):
the best-scored plan not yet tried among the model's
next-best plans (a best-first walk of its ranking; the model is refitted to every measured trial's
timeline, so the ranking learns from the measurements); with probability ``explore`` (2 %) a random
one of those candidates instead (or, a quarter of those times, a uniformly random plan), so that a
region the model misjudges is still visited.

A local search is available (``anchors`` > 0): neighbours of the best measured plans, each scored by the
model's prediction times how far the model was off *near* it (the anchor's measured / predicted speedup,
shrunk towards the study's median ratio by ``k / (k + SHRINK)`` after k repeats). It is off by default:
on the simulated benchmark it cost more trials than it saved (8 stages x layer, 9 searches: 74 measured
trials at the median to reach 97 % of the true best with 3 anchors, 45 with anchors measured 4+ times
only, 27 without; 4 x layer 67 vs 51; 4 x block and 8 x block alike), because the luckiest measured
plans' neighbourhoods soak up the proposals while the model rates them no better.

Every proposal is a valid plan (``search.plans.space``) and none repeats a plan already tried, until the
space is exhausted (then None).

Why not Optuna's TPE over the cut indices: it cannot keep cuts ordered (out-of-order proposals are
wasted), it does not use the cost model between seeds, and on 8 stages at layer granularity it found
nothing feasible in its first 60 asks; ``benchmarks/search_efficiency.py --simulated`` has the figures.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from search.plans.space import PlanPoint, PlanSpace

__all__ = ["ANCHORS", "EXPLORE", "Measured", "propose"]

ANCHORS = 0  # measured plans whose neighbourhoods are searched (the local search: off, see above)
EXPLORE = 0.02  # share of proposals that explore instead of taking the best-scored plan
SHRINK = 30.0  # repeats at which a plan's own measured/predicted ratio weighs as much as the study's median
# (with the local search on, EXPLORE 0.1 / SHRINK 3 spent 115 repeats at the median to reach 97 % of the
# best on 4 x block in the simulated benchmark, 0.05 / 10 spent 67, 0.02 / 30 spent 60: on this machine
# one repeat's noise, ~5 %, is larger than the model's error near a plan)
RANDOM_TRIES = 2000  # random draws before a nearly exhausted space is enumerated


@dataclass(frozen=True, kw_only=True)
class Measured:
    """A measured plan and its speedup (the median of its repeats)."""

    point: PlanPoint
    speedup: float
    repeats: int = 1


def _unseen_random(space: PlanSpace, seen: Collection[PlanPoint], rng: random.Random,
                   fits: Callable[[PlanPoint], bool]) -> PlanPoint | None:
    for _ in range(RANDOM_TRIES):
        p = space.random_point(rng)
        if p not in seen and fits(p):
            return p
    if space.size > 200_000:
        return None  # a huge space with this many seen plans: stop here rather than enumerate it
    from itertools import combinations

    for k in range(len(space.layouts)):
        for cuts in combinations(range(1, space.n), space.cut_count(k)):
            for m in space.layout_chunks(k):
                p = PlanPoint(cuts=cuts, chunks=m, layout=k)
                if p not in seen and fits(p):
                    return p
    return None


def propose(space: PlanSpace, measured: Sequence[Measured], seen: Collection[PlanPoint],
            predict: Callable[[PlanPoint], float], model_best: Sequence[PlanPoint], rng: random.Random, *,
            explore: float = EXPLORE, anchors: int = ANCHORS,
            fits: Callable[[PlanPoint], bool] = lambda p: True) -> PlanPoint | None:
    """The next plan to measure (see the module's rule), or None when every plan has been tried; ``fits``
    (the memory limit) leaves out plans predicted not to fit, wherever they would come from."""
    if len(seen) >= space.size:
        return None
    ok = [m for m in measured if m.speedup == m.speedup and m.speedup > 0]
    ratios = {m.point: m.speedup / predict(m.point) for m in ok if predict(m.point) > 0}
    overall = statistics.median(ratios.values()) if ratios else 1.0
    by_layout: dict[int, list[float]] = {}
    for q, r in ratios.items():
        by_layout.setdefault(q.layout, []).append(r)
    # each layout's own measured / predicted: the model prices schedules unlike each other (or not at all)
    level = {k: statistics.median(v) for k, v in by_layout.items()}
    weight = {m.point: m.repeats / (m.repeats + SHRINK) for m in ok}
    scored: dict[PlanPoint, float] = {}
    for p in model_best:
        if space.valid(p) and p not in seen and fits(p):
            scored[p] = predict(p) * level.get(p.layout, overall)
    top = sorted(ok, key=lambda m: -m.speedup)[:anchors]
    for radius in range(1, space.n + 1 if top else 1):
        for m in top:
            w = weight.get(m.point, 0.0)
            local = overall ** (1 - w) * ratios.get(m.point, overall) ** w
            for q in space.neighbours(m.point, radius):
                if q not in seen and q not in scored and fits(q):
                    scored[q] = predict(q) * local
        if len(scored) >= 2 * space.stages or radius >= space.n:
            break
    roll = rng.random()
    if roll < explore / 4 or not scored:
        far = _unseen_random(space, seen, rng, fits)
        if far is not None:
            return far
    if not scored:
        return None
    if roll < explore:
        return rng.choice(sorted(scored))
    return max(sorted(scored), key=lambda q: scored[q])
