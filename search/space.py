"""The search space, pure: a plan is S-1 strictly increasing cut indices and a chunk count.

Optuna sees each cut as the *name* of the module its stage starts at (``cut_1 = blocks.4``), one fixed
categorical choice list per cut, so a trial's parameters read as the plan; the order is kept by
construction, by the search's own sampler (``search.sampler``), never by a constraint that a proposal
may violate. ``neighbours`` and ``random_point`` make only valid plans, at any stage and segment count.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PlanPoint", "PlanSpace", "best_first"]


@dataclass(frozen=True, kw_only=True, order=True)
class PlanPoint:
    """One plan of the space: cut before each segment index in ``cuts`` (strictly increasing), ``chunks``."""

    cuts: tuple[int, ...]
    chunks: int

    def to_dict(self) -> dict[str, Any]:
        return {"cuts": list(self.cuts), "chunks": self.chunks}


@dataclass(frozen=True, kw_only=True)
class PlanSpace:
    """Every block (or layer) cut x chunk count plan of ``stages`` stages over the segments ``names``."""

    names: tuple[str, ...]
    """The candidate segments in order (their first module's name); a cut before segment i starts a stage at names[i]."""
    stages: int
    chunks: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.stages < 2:
            raise ValueError(f"a pipeline needs at least 2 stages (got {self.stages})")
        if self.stages > len(self.names):
            raise ValueError(f"{self.stages} stages need at least {self.stages} segments, the model has "
                             f"{len(self.names)}: use fewer stages or --granularity layer")
        if not self.chunks:
            raise ValueError("the space needs at least one chunk count")

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def size(self) -> int:
        """How many distinct plans the space holds."""
        return math.comb(self.n - 1, self.stages - 1) * len(self.chunks)

    def param_names(self) -> list[str]:
        return [f"cut_{i}" for i in range(1, self.stages)] + ["chunks"]

    def choices(self) -> dict[str, tuple[Any, ...]]:
        """Each parameter's fixed choice list (the same in every trial, as Optuna's storage requires)."""
        out: dict[str, tuple[Any, ...]] = {f"cut_{i}": self.names[1:] for i in range(1, self.stages)}
        out["chunks"] = tuple(self.chunks)
        return out

    def valid(self, p: PlanPoint) -> bool:
        b = [0, *p.cuts, self.n]
        return len(p.cuts) == self.stages - 1 and all(x < y for x, y in zip(b, b[1:])) and p.chunks in self.chunks

    def encode(self, p: PlanPoint) -> dict[str, Any]:
        """Trial parameters of a plan: module names and the chunk count."""
        if not self.valid(p):
            raise ValueError(f"cuts {list(p.cuts)} x {p.chunks} chunks are not a plan of this space "
                             f"({self.stages} stages over {self.n} segments, chunks {list(self.chunks)})")
        return {**{f"cut_{i}": self.names[c] for i, c in enumerate(p.cuts, 1)}, "chunks": int(p.chunks)}

    def decode(self, params: Mapping[str, Any]) -> PlanPoint:
        """The plan that trial parameters name; ValueError names what is missing or out of order."""
        index = {name: i for i, name in enumerate(self.names)}
        try:
            cuts = tuple(index[str(params[f"cut_{i}"])] for i in range(1, self.stages))
            p = PlanPoint(cuts=cuts, chunks=int(params["chunks"]))
        except KeyError as e:
            raise ValueError(f"trial parameters {dict(params)} lack or misname {e}: expected "
                             f"{', '.join(self.param_names())}") from None
        if not self.valid(p):
            raise ValueError(f"cuts {[self.names[c] for c in cuts]} x {p.chunks} chunks are not a plan: "
                             "cuts must start strictly later stages, chunks one of " + str(list(self.chunks)))
        return p

    def stage_blocks(self, p: PlanPoint) -> list[int]:
        b = [0, *p.cuts, self.n]
        return [y - x for x, y in zip(b, b[1:])]

    def neighbours(self, p: PlanPoint, radius: int = 1) -> Iterator[PlanPoint]:
        """Plans one move away: one cut shifted by 1..``radius`` segments (staying between its
        neighbours), or the chunk count one step along its list; all valid by construction."""
        b = [0, *p.cuts, self.n]
        for i in range(1, self.stages):
            for d in [s * r for r in range(1, radius + 1) for s in (-1, 1)]:
                c = b[i] + d
                if b[i - 1] < c < b[i + 1]:
                    yield PlanPoint(cuts=tuple(b[1:i] + [c] + b[i + 1:-1]), chunks=p.chunks)
        order = list(self.chunks)
        k = order.index(p.chunks) if p.chunks in order else -1
        for j in (k - 1, k + 1):
            if k >= 0 and 0 <= j < len(order):
                yield PlanPoint(cuts=p.cuts, chunks=order[j])

    def random_point(self, rng: random.Random) -> PlanPoint:
        """A uniformly random plan of the space."""
        cuts = tuple(sorted(rng.sample(range(1, self.n), self.stages - 1)))
        return PlanPoint(cuts=cuts, chunks=rng.choice(self.chunks))

    def from_cuts(self, cuts: Sequence[int], chunks: int) -> PlanPoint:
        p = PlanPoint(cuts=tuple(int(c) for c in cuts), chunks=int(chunks))
        if not self.valid(p):
            raise ValueError(f"cuts {list(cuts)} x {chunks} chunks are not a plan of this space")
        return p


def best_first(space: PlanSpace, starts: Iterable[PlanPoint], score: Callable[[PlanPoint], float],
               limit: int | None = None) -> Iterator[PlanPoint]:
    """Plans in (roughly) descending ``score``: a best-first walk over one-move neighbours from ``starts``
    (exact when the score has no local optima besides the starts; the cost model's ranking this way)."""
    first = sorted(set(starts))
    heap = [(-score(p), p) for p in first if space.valid(p)]
    heapq.heapify(heap)
    seen = {p for _, p in heap}
    count = 0
    while heap and (limit is None or count < limit):
        _, p = heapq.heappop(heap)
        yield p
        count += 1
        for q in space.neighbours(p, 1):
            if q not in seen:
                seen.add(q)
                heapq.heappush(heap, (-score(q), q))
