"""The cost model's best plan of one layout under any score, pure: every plan where there are few, else
a descent over the cuts from given starts.

``costmodel.partition`` finds the exact optimum of the forward flow shop by dynamic programming; a
schedule replayed from its action order (training, virtual stages, zero bubble) has no such structure,
so its optimum is searched: all plans while the layout holds at most ``EXHAUSTIVE`` of them (DeiT-S at
block granularity, 2 ranks x 2 stages: 286 cut sets x 5 chunk counts), else from each start (the forward
optimum at each chunk count) each cut in turn moves to the best place between its neighbours until no
move helps. ``score`` returns None for a plan that may not run (over the memory limit).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from search.plans.space import PlanPoint, PlanSpace

__all__ = ["EXHAUSTIVE", "layout_optimum"]

EXHAUSTIVE = 3000
"""Plans of a layout up to which every one is scored."""

Score = Callable[[PlanPoint], float | None]


def _descend(score: Score, start: PlanPoint, n: int) -> tuple[float, PlanPoint] | None:
    cuts = list(start.cuts)
    best = score(start)
    if best is None:
        return None
    moved = True
    while moved:
        moved = False
        for i in range(len(cuts)):
            lo = cuts[i - 1] + 1 if i else 1
            hi = cuts[i + 1] - 1 if i + 1 < len(cuts) else n - 1
            for c in range(lo, hi + 1):
                if c == cuts[i]:
                    continue
                trial = PlanPoint(cuts=tuple(cuts[:i] + [c] + cuts[i + 1:]), chunks=start.chunks, layout=start.layout)
                s = score(trial)
                if s is not None and s > best:
                    best, cuts, moved = s, list(trial.cuts), True
    return best, PlanPoint(cuts=tuple(cuts), chunks=start.chunks, layout=start.layout)


def layout_optimum(score: Score, space: PlanSpace, layout: int, starts: Sequence[PlanPoint] = (),
                   *, exhaustive: int = EXHAUSTIVE) -> PlanPoint | None:
    """The plan of ``layout`` with the highest ``score`` (None when no plan may run)."""
    k = space.cut_count(layout)
    chunks = space.layout_chunks(layout)
    found: list[tuple[float, PlanPoint]] = []
    if math.comb(space.n - 1, k) * len(chunks) <= exhaustive:
        for cuts in itertools.combinations(range(1, space.n), k):
            for m in chunks:
                p = PlanPoint(cuts=cuts, chunks=m, layout=layout)
                s = score(p)
                if s is not None:
                    found.append((s, p))
    else:
        for start in starts:
            got = _descend(score, start, space.n)
            if got is not None:
                found.append(got)
    return max(found, key=lambda x: x[0])[1] if found else None
