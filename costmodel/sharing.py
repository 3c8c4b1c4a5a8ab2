"""A pipeline's forward schedule on stages that share a device: a fluid simulation, pure Python.

Each stage runs its microbatches in order; a stage starts microbatch j when it has finished j-1 and j
has arrived; a cut is a link that carries one microbatch at a time without holding up the sender. The
stages that are computing share the machine: with k busy, each progresses at ``machine.rate(k)`` of its
alone speed (``Machine``: cores over busy threads, over measured contention). A stage that waits (fill,
drain, a slow neighbour) leaves its cores to the others, which a fixed "busy" latency cannot see.

    2 stages on 1 core, 2 microbatches of 1 s alone each:
    stage 0 |F0......|F1..............|
    stage 1          |F0..............|F1......|
            0        1                3        4   (F1 and F0 share the core between t=1 and t=3)

With a machine that does not share (a GPU per stage) this is the flow shop of ``costmodel.simulate``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.types import Machine

__all__ = ["SharedRun", "simulate_shared"]

_EPS = 1e-12


@dataclass(frozen=True, kw_only=True)
class SharedRun:
    """The simulated run: its makespan, each stage's compute spans, and the busy share of the stages' time."""

    makespan: float
    spans: tuple[tuple[tuple[float, float], ...], ...]
    """Per stage, (start, end) of each microbatch's compute."""

    @property
    def bubble_fraction(self) -> float:
        if self.makespan <= 0 or not self.spans:
            return 0.0
        busy = sum(b - a for stage in self.spans for a, b in stage)
        return max(0.0, 1.0 - busy / (len(self.spans) * self.makespan))


def simulate_shared(work: Sequence[float], links: Sequence[float], chunks: int, machine: Machine) -> SharedRun:
    """Simulate ``chunks`` microbatches through stages of ``work`` seconds each (alone), cut by ``links``."""
    n = len(work)
    if len(links) != n - 1:
        raise ValueError(f"{n} stages need {n - 1} links, got {len(links)}")
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1 (got {chunks})")
    if any(w < 0 for w in work) or any(x < 0 for x in links):
        raise ValueError("stage and link times must be non-negative")
    arrived = [[s == 0] * chunks for s in range(n)]
    next_mb = [0] * n
    running: dict[int, float] = {}  # stage -> alone-seconds of work left on its current microbatch
    started: dict[int, float] = {}
    spans: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    queue: list[list[int]] = [[] for _ in range(n - 1)]  # microbatches waiting for each link
    flight: list[tuple[int, float] | None] = [None] * (n - 1)  # (microbatch, arrival time) on each link
    t = 0.0
    done = 0
    while done < n * chunks:
        for s in range(n):
            if s not in running and next_mb[s] < chunks and arrived[s][next_mb[s]]:
                running[s], started[s] = work[s], t
        for s in range(n - 1):
            if flight[s] is None and queue[s]:
                flight[s] = (queue[s].pop(0), t + links[s])
        rate = machine.rate(len(running))
        dt = min([left / rate for left in running.values()] + [f[1] - t for f in flight if f is not None],
                 default=math.inf)
        if math.isinf(dt):
            raise RuntimeError("the simulated pipeline stalled: no stage can run and nothing is in flight")
        dt = max(dt, 0.0)
        t += dt
        for s in list(running):
            running[s] -= rate * dt
            if running[s] <= _EPS * max(1.0, work[s]):
                del running[s]
                spans[s].append((started.pop(s), t))
                j = next_mb[s]
                next_mb[s] += 1
                done += 1
                if s < n - 1:
                    queue[s].append(j)
        for s in range(n - 1):
            f = flight[s]
            if f is not None and f[1] <= t + _EPS:
                arrived[s + 1][f[0]] = True
                flight[s] = None
    return SharedRun(makespan=t, spans=tuple(tuple(x) for x in spans))
