"""The search space, pure: a plan is a layout, strictly increasing cut indices and a chunk count.

A layout is a schedule and its stages per rank (V): over R ranks it cuts the model into R x V stages,
so its plans have R x V - 1 cuts and the chunk counts its schedule's rules allow (the caller filters
them with ``pipeline.core.plan.schedule_chunks``). One layout (the default) is today's space.

Optuna sees each cut as the *name* of the module its stage starts at (``cut_1 = blocks.4``), one fixed
categorical choice list per cut, so a trial's parameters read as the plan; the layout is a parameter
of its own (``layout = Interleaved1F1B/V2``) only when the space has several, and a layout asks only for
the cuts it has (Optuna's conditional parameters). The order is kept by construction, by the search's
own sampler (``search.plans.sampler``), never by a constraint that a proposal may violate. ``neighbours`` and
``random_point`` make only valid plans, at any stage and segment count.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Layout", "PlanPoint", "PlanSpace", "best_first"]


@dataclass(frozen=True, kw_only=True, order=True)
class Layout:
    """A schedule, its stages per rank, and the chunk counts its rules allow at the space's rank count."""

    schedule: str = "GPipe"
    per_rank: int = 1
    chunks: tuple[int, ...] = ()
    """Empty: the space's chunk counts."""

    @property
    def label(self) -> str:
        """The layout parameter's value: ``1F1B``, ``Interleaved1F1B/V2``."""
        return self.schedule if self.per_rank == 1 else f"{self.schedule}/V{self.per_rank}"


@dataclass(frozen=True, kw_only=True, order=True)
class PlanPoint:
    """One plan of the space: cut before each segment index in ``cuts`` (strictly increasing), ``chunks``,
    on the space's layout number ``layout``."""

    cuts: tuple[int, ...]
    chunks: int
    layout: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"cuts": list(self.cuts), "chunks": self.chunks, **({"layout": self.layout} if self.layout else {})}


@dataclass(frozen=True, kw_only=True)
class PlanSpace:
    """Every block (or layer) cut x chunk count plan of ``stages`` ranks over the segments ``names``, on
    each of ``layouts`` (default: one stage per rank, the space's chunk counts)."""

    names: tuple[str, ...]
    """The candidate segments in order (their first module's name); a cut before segment i starts a stage at names[i]."""
    stages: int
    """Ranks: a layout with V stages per rank cuts the model into ``stages * V`` stages."""
    chunks: tuple[int, ...]
    layouts: tuple[Layout, ...] = (Layout(),)

    def __post_init__(self) -> None:
        if self.stages < 2:
            raise ValueError(f"a pipeline needs at least 2 stages (got {self.stages})")
        if not self.layouts:
            raise ValueError("the space needs at least one layout")
        for lay in self.layouts:
            need = self.stages * lay.per_rank
            if need > len(self.names):
                raise ValueError(f"{need} stages need at least {need} segments, the model has "
                                 f"{len(self.names)}: use fewer stages or --granularity layer")
        if not self.chunks:
            raise ValueError("the space needs at least one chunk count")
        if len({lay.label for lay in self.layouts}) != len(self.layouts):
            raise ValueError(f"layouts {[lay.label for lay in self.layouts]} repeat one")

    @property
    def n(self) -> int:
        return len(self.names)

    def layout_chunks(self, layout: int) -> tuple[int, ...]:
        return self.layouts[layout].chunks or self.chunks

    def cut_count(self, layout: int) -> int:
        return self.stages * self.layouts[layout].per_rank - 1

    @property
    def size(self) -> int:
        """How many distinct plans the space holds."""
        return sum(math.comb(self.n - 1, self.cut_count(k)) * len(self.layout_chunks(k))
                   for k in range(len(self.layouts)))

    @property
    def multi(self) -> bool:
        """Whether the layout is a parameter (the space has several)."""
        return len(self.layouts) > 1

    def param_names(self) -> list[str]:
        most = max(self.cut_count(k) for k in range(len(self.layouts)))
        return (["layout"] if self.multi else []) + [f"cut_{i}" for i in range(1, most + 1)] + ["chunks"]

    def choices(self) -> dict[str, tuple[Any, ...]]:
        """Each parameter's fixed choice list (the same in every trial, as Optuna's storage requires)."""
        out: dict[str, tuple[Any, ...]] = {}
        if self.multi:
            out["layout"] = tuple(lay.label for lay in self.layouts)
        for name in self.param_names():
            if name.startswith("cut_"):
                out[name] = self.names[1:]
        out["chunks"] = tuple(sorted({c for k in range(len(self.layouts)) for c in self.layout_chunks(k)}))
        return out

    def ask(self, suggest: Callable[[str, tuple[Any, ...]], Any]) -> dict[str, Any]:
        """The parameters of one trial, asked in order: the layout first, then only the cuts it has."""
        choices = self.choices()
        params: dict[str, Any] = {}
        layout = 0
        if self.multi:
            params["layout"] = suggest("layout", choices["layout"])
            layout = self._layout_index(params["layout"])
        for i in range(1, self.cut_count(layout) + 1):
            params[f"cut_{i}"] = suggest(f"cut_{i}", choices[f"cut_{i}"])
        params["chunks"] = suggest("chunks", choices["chunks"])
        return params

    def _layout_index(self, label: Any) -> int:
        for k, lay in enumerate(self.layouts):
            if lay.label == label:
                return k
        raise ValueError(f"layout {label!r} is not one of {[lay.label for lay in self.layouts]}")

    def valid(self, p: PlanPoint) -> bool:
        if not 0 <= p.layout < len(self.layouts):
            return False
        b = [0, *p.cuts, self.n]
        return (len(p.cuts) == self.cut_count(p.layout) and all(x < y for x, y in zip(b, b[1:]))
                and p.chunks in self.layout_chunks(p.layout))

    def encode(self, p: PlanPoint) -> dict[str, Any]:
        """Trial parameters of a plan: its layout (when the space has several), module names, the chunk count."""
        if not self.valid(p):
            raise ValueError(f"cuts {list(p.cuts)} x {p.chunks} chunks are not a plan of this space "
                             f"({self.stages} stages over {self.n} segments, chunks {list(self.chunks)})")
        head = {"layout": self.layouts[p.layout].label} if self.multi else {}
        return {**head, **{f"cut_{i}": self.names[c] for i, c in enumerate(p.cuts, 1)}, "chunks": int(p.chunks)}

    def decode(self, params: Mapping[str, Any]) -> PlanPoint:
        """The plan that trial parameters name; ValueError names what is missing or out of order."""
        index = {name: i for i, name in enumerate(self.names)}
        try:
            layout = self._layout_index(params["layout"]) if self.multi else 0
            cuts = tuple(index[str(params[f"cut_{i}"])] for i in range(1, self.cut_count(layout) + 1))
            p = PlanPoint(cuts=cuts, chunks=int(params["chunks"]), layout=layout)
        except KeyError as e:
            raise ValueError(f"trial parameters {dict(params)} lack or misname {e}: expected "
                             f"{', '.join(self.param_names())}") from None
        if not self.valid(p):
            raise ValueError(f"cuts {[self.names[c] for c in cuts]} x {p.chunks} chunks are not a plan: "
                             "cuts must start strictly later stages, chunks one of "
                             + str(list(self.layout_chunks(layout))))
        return p

    def stage_blocks(self, p: PlanPoint) -> list[int]:
        b = [0, *p.cuts, self.n]
        return [y - x for x, y in zip(b, b[1:])]

    def neighbours(self, p: PlanPoint, radius: int = 1) -> Iterator[PlanPoint]:
        """Plans one move away: one cut shifted by 1..``radius`` segments (staying between its
        neighbours), the chunk count one step along its list, or the same cuts and chunks on another
        layout with as many stages per rank; all valid by construction."""
        b = [0, *p.cuts, self.n]
        for i in range(1, len(b) - 1):
            for d in [s * r for r in range(1, radius + 1) for s in (-1, 1)]:
                c = b[i] + d
                if b[i - 1] < c < b[i + 1]:
                    yield PlanPoint(cuts=tuple(b[1:i] + [c] + b[i + 1:-1]), chunks=p.chunks, layout=p.layout)
        order = list(self.layout_chunks(p.layout))
        k = order.index(p.chunks) if p.chunks in order else -1
        for j in (k - 1, k + 1):
            if k >= 0 and 0 <= j < len(order):
                yield PlanPoint(cuts=p.cuts, chunks=order[j], layout=p.layout)
        for other in range(len(self.layouts)):
            q = PlanPoint(cuts=p.cuts, chunks=p.chunks, layout=other)
            if other != p.layout and self.valid(q):
                yield q

    def random_point(self, rng: random.Random, layout: int | None = None) -> PlanPoint:
        """A uniformly random plan of a layout (of a uniformly random one when ``layout`` is None)."""
        k = rng.randrange(len(self.layouts)) if layout is None else layout
        cuts = tuple(sorted(rng.sample(range(1, self.n), self.cut_count(k))))
        return PlanPoint(cuts=cuts, chunks=rng.choice(self.layout_chunks(k)), layout=k)

    def from_cuts(self, cuts: Sequence[int], chunks: int, layout: int = 0) -> PlanPoint:
        p = PlanPoint(cuts=tuple(int(c) for c in cuts), chunks=int(chunks), layout=layout)
        if not self.valid(p):
            raise ValueError(f"cuts {list(cuts)} x {chunks} chunks are not a plan of this space")
        return p


def best_first(space: PlanSpace, starts: Iterable[PlanPoint], score: Callable[[PlanPoint], float],
               limit: int | None = None) -> Iterator[PlanPoint]:
    """Plans in (roughly) descending ``score``: a best-first walk over one-move neighbours from ``starts``
    (exact when the score has no local optima besides the starts; the cost model's ranking this way),
    staying on each start's layout."""
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
            if q not in seen and q.layout == p.layout:
                seen.add(q)
                heapq.heappush(heap, (-score(q), q))
