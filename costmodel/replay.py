"""Replay a schedule's own per-rank action order over per-stage times, pure: the makespan it implies.

A schedule is what torch's schedule object ran, as the pipeline package records it (``TrialResult.extra
["actions"]``: each rank's ``0F1``, ``1B0``, ``0I2``, ``0W2`` in order); no schedule is written out here.
Each rank runs its actions in that order, one at a time; an action starts when its rank is free and
what it needs is done:

- ``sFm`` (stage s's forward of microbatch m) needs ``(s-1)Fm``, plus the link forward when stage s-1 is
  on another rank;
- ``sBm`` / ``sIm`` (whole backward / input grad) need ``sFm`` and ``(s+1)Bm`` or ``(s+1)Im`` (the last
  stage's need only its forward: the loss is computed there), plus the link backward across ranks;
- ``sWm`` (weight grad) needs ``sIm``.

Links carry one tensor at a time per direction and cut, without holding up the sender (as in
``costmodel.simulate``). Hand-checkable: GPipe's order at equal stage times gives ``(M + S - 1) x
(F + B)``-style fill and drain, 1F1B's the same makespan with fewer microbatches in flight.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Action", "Replay", "StageTimes", "parse_action", "replay"]

_ACTION = re.compile(r"(\d+)([FBIW])(\d+)")


@dataclass(frozen=True, kw_only=True, order=True)
class Action:
    """One stage's forward (F), whole backward (B), input grad (I) or weight grad (W) of one microbatch."""

    stage: int
    kind: str
    microbatch: int


def parse_action(text: str) -> Action:
    """``1B0`` -> stage 1's backward of microbatch 0; ValueError names anything else."""
    m = _ACTION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"action {text!r} is not <stage><F|B|I|W><microbatch>, like 1B0")
    return Action(stage=int(m.group(1)), kind=m.group(2), microbatch=int(m.group(3)))


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Seconds per microbatch of one stage's work, and of the link after it (to stage + 1) each way."""

    forward: float
    backward: float = 0.0
    """A whole backward (``B``); a split one is ``input_grad`` + ``weight_grad``."""
    input_grad: float = 0.0
    weight_grad: float = 0.0
    link_forward: float = 0.0
    link_backward: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Replay:
    """When each action ran, the makespan, and each rank's busy share."""

    start: Mapping[Action, float]
    end: Mapping[Action, float]
    makespan: float
    busy: tuple[float, ...]
    """Per rank, seconds of its own work."""

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the ranks' time over the makespan."""
        if self.makespan <= 0 or not self.busy:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def _duration(a: Action, t: StageTimes) -> float:
    return {"F": t.forward, "B": t.backward, "I": t.input_grad, "W": t.weight_grad}[a.kind]


def replay(actions: Sequence[Sequence[str]], times: Sequence[StageTimes]) -> Replay:
    """The makespan of running each rank's ``actions`` in order over ``times`` (one per stage, in stage
    order); ValueError when an action names a stage that has no times, or the orders deadlock."""
    orders = [[parse_action(a) for a in rank] for rank in actions]
    rank_of: dict[int, int] = {}
    for r, order in enumerate(orders):
        for a in order:
            if a.stage >= len(times):
                raise ValueError(f"action {a.stage}{a.kind}{a.microbatch} names stage {a.stage}; "
                                 f"times are given for {len(times)} stages")
            rank_of.setdefault(a.stage, r)
    last = len(times) - 1
    end: dict[Action, float] = {}
    start: dict[Action, float] = {}
    link_free: dict[tuple[int, str], float] = {}
    arrive: dict[tuple[Action, str], float] = {}
    pos = [0] * len(orders)
    free = [0.0] * len(orders)
    busy = [0.0] * len(orders)

    def ready(a: Action) -> float | None:
        """When ``a``'s inputs are on its rank, or None while something it needs has not run."""
        needs: list[tuple[Action, str | None]] = []
        if a.kind == "F" and a.stage > 0:
            needs.append((Action(stage=a.stage - 1, kind="F", microbatch=a.microbatch), "fwd"))
        elif a.kind in "BI":
            needs.append((Action(stage=a.stage, kind="F", microbatch=a.microbatch), None))
            if a.stage < last:
                nxt = next((k for k in "BI" if Action(stage=a.stage + 1, kind=k, microbatch=a.microbatch) in end),
                           None)
                if nxt is None:
                    return None
                needs.append((Action(stage=a.stage + 1, kind=nxt, microbatch=a.microbatch), "bwd"))
        elif a.kind == "W":
            needs.append((Action(stage=a.stage, kind="I", microbatch=a.microbatch), None))
        t = 0.0
        for need, direction in needs:
            if need not in end:
                return None
            if direction is None or rank_of.get(need.stage) == rank_of.get(a.stage):
                t = max(t, end[need])
                continue
            key = (need, direction)
            if key not in arrive:  # the link between the two stages carries one tensor at a time per direction
                cut = min(need.stage, a.stage)
                cost = times[cut].link_forward if direction == "fwd" else times[cut].link_backward
                go = max(end[need], link_free.get((cut, direction), 0.0))
                link_free[(cut, direction)] = go + cost
                arrive[key] = go + cost
            t = max(t, arrive[key])
        return t

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                a = order[pos[r]]
                t = ready(a)
                if t is None:
                    break
                start[a] = max(t, free[r])
                d = _duration(a, times[a.stage])
                end[a] = start[a] + d
                free[r] = end[a]
                busy[r] += d
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [f"rank {r}: {order[pos[r]].stage}{order[pos[r]].kind}{order[pos[r]].microbatch}"
                     for r, order in enumerate(orders) if pos[r] < len(order)]
            raise ValueError("the action orders deadlock: " + ", ".join(stuck) + " wait on each other")
    return Replay(start=start, end=end, makespan=max(end.values(), default=0.0), busy=tuple(busy))
