"""Predict a split's pipeline time by simulating its schedule over measured per-segment numbers.

Forward-only inference; GPipe and 1F1B run the same forward order, so they predict alike. Without a
machine model, each stage runs at its measured speed whatever the others do (below); with one (a CPU
whose cores the stages share), ``costmodel.sharing`` simulates the same order under processor sharing. Each
microbatch goes through the stages in order; a stage starts microbatch j when it has finished j-1 and
j has arrived; a cut is a link that carries one microbatch at a time, without holding up the sender:

    stage 0 |F0|F1|F2|F3|
    link 0       |c0|c1|c2|c3|
    stage 1         |F0|F1|F2|F3|

For identical microbatches this is a flow shop, whose makespan has the closed form
``sum(all stage and link times) + (M - 1) * max(all stage and link times)``; the event loop below is the
specification, ``closed_form_makespan`` the fast path that ``partition`` optimises, and the tests check
that they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from costmodel.sharing import simulate_shared
from costmodel.types import Machine, Prediction, Profile

__all__ = ["closed_form_makespan", "segment_costs", "simulate", "simulate_times", "stage_times"]


def _bounds(cuts: Sequence[int], n: int) -> list[tuple[int, int]]:
    b = [0, *cuts, n]
    for x, y in zip(b, b[1:]):
        if not x < y:
            raise ValueError(f"cuts {list(cuts)} must be increasing and inside 1..{n - 1}")
    return list(zip(b, b[1:]))


def segment_costs(profile: Profile, chunks: int) -> tuple[list[float], list[float]]:
    """(seconds per microbatch of each segment, seconds per microbatch of a cut before segment i + 1)."""
    if chunks < 1 or profile.batch_size % chunks:
        raise ValueError(f"chunks {chunks} must divide batch size {profile.batch_size}")
    m = profile.batch_size // chunks
    seg = [s.latency(m) for s in profile.segments]
    link = [profile.link.time(s.out_bytes * m) for s in profile.segments[:-1]]
    return seg, link


def stage_times(profile: Profile, cuts: Sequence[int], chunks: int) -> tuple[list[float], list[float]]:
    """(seconds per microbatch of each stage, seconds per microbatch across each cut)."""
    seg, link = segment_costs(profile, chunks)
    stages = [sum(seg[a:b]) + profile.step_overhead_s for a, b in _bounds(cuts, len(seg))]
    return stages, [link[c - 1] for c in cuts]


def simulate_times(stages: Sequence[float], links: Sequence[float], chunks: int) -> tuple[float, float]:
    """Event simulation: (makespan, bubble fraction of the stages' time)."""
    n = len(stages)
    if len(links) != n - 1:
        raise ValueError(f"{n} stages need {n - 1} links, got {len(links)}")
    stage_free = [0.0] * n
    link_free = [0.0] * (n - 1)
    for _ in range(chunks):
        ready = 0.0
        for s in range(n):
            start = max(ready, stage_free[s])
            stage_free[s] = start + stages[s]
            if s < n - 1:
                send = max(stage_free[s], link_free[s])
                link_free[s] = send + links[s]
                ready = link_free[s]
    makespan = stage_free[-1]
    busy = chunks * sum(stages)
    bubble = 1.0 - busy / (n * makespan) if makespan > 0 else 0.0
    return makespan, bubble


def closed_form_makespan(stages: Sequence[float], links: Sequence[float], chunks: int) -> float:
    """The flow-shop makespan for ``chunks`` identical microbatches."""
    all_t = [*stages, *links]
    return sum(all_t) + (chunks - 1) * max(all_t)


def simulate(profile: Profile, cuts: Sequence[int], chunks: int, schedule: str = "GPipe",
             machine: Machine | None = None) -> Prediction:
    """Predict the plan that cuts before segments ``cuts`` with ``chunks`` microbatches.

    With a machine model (the profile's, or ``machine``: a calibrated one) the stages share the device
    as ``costmodel.sharing`` simulates, the serial model runs alone, and no prediction exceeds the
    machine's ceiling: the makespan is at least the serial time over the ceiling (a floor that binds only
    where small microbatches would be cheaper per sample than the whole batch). Without one, the flow shop.
    """
    if schedule not in ("GPipe", "1F1B"):
        raise ValueError(f"schedule {schedule!r} is not simulated: use GPipe or 1F1B")
    stages, links = stage_times(profile, cuts, chunks)
    serial = sum(s.latency(profile.batch_size) for s in profile.segments)
    machine = machine or profile.machine
    if machine is None:
        makespan, bubble = simulate_times(stages, links, chunks)
        return Prediction(cuts=tuple(cuts), chunks=chunks, stage_s=tuple(stages), transfer_s=tuple(links),
                          makespan_s=makespan, serial_s=serial, bubble_fraction=bubble)
    run = simulate_shared(stages, links, chunks, machine)
    ceiling = machine.ceiling(len(stages))
    return Prediction(cuts=tuple(cuts), chunks=chunks, stage_s=tuple(stages), transfer_s=tuple(links),
                      makespan_s=max(run.makespan, serial / ceiling), serial_s=serial,
                      bubble_fraction=run.bubble_fraction, ceiling=ceiling)
