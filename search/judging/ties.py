"""When is one plan faster than another? The tie rule, pure: paired pipeline seconds, a bootstrap, a stated confidence.

Plans of one model are compared by their own pipeline seconds, never by speedups (each a ratio over its own
serial run, which carries that run's noise too). Two plans measured in the same interleaved rounds are
paired: repeat ``k`` of round ``r`` of one with repeat ``k`` of round ``r`` of the other, so that the machine's
drift, which slows both alike, cancels in their ratio. The rule (``compare``): the median of the paired
log-ratios, with a percentile bootstrap interval at ``CONFIDENCE``; the plans are separated when the
interval excludes 0 (no difference), and tied otherwise, or with fewer than ``MIN_PAIRS`` pairs. A tie is
broken by what a user also cares about (``break_tie``): the lower largest-stage peak memory, then the fewer
chunks (fewer, larger microbatches), then the faster median.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CONFIDENCE", "MEMORY_MARGIN", "MIN_PAIRS", "Comparison", "Contender", "break_tie", "compare", "paired_log_ratios"]

CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_PAIRS = 6
"""Fewer pairs separate nothing: with 4 (2 rounds x 2 repeats) a DeiT-S search declared a plan 5 % faster
(interval 1.024-1.132) that a later side-by-side run measured 2 % slower; below 6 the tied plans run again."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Plan A against plan B: the median paired ratio of their pipeline seconds, its interval, the verdict."""

    ratio: float
    """Median of A's seconds / B's over the pairs (below 1: A faster)."""
    low: float
    high: float
    """The ratio's bootstrap interval at ``CONFIDENCE``."""
    pairs: int
    verdict: str
    """``a`` (A faster), ``b`` (B faster) or ``tie``."""

    def to_dict(self) -> dict[str, float | int | str]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "pairs": self.pairs, "verdict": self.verdict}


def paired_log_ratios(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> list[float]:
    """log(A/B) of the pipeline seconds of each repeat, paired within each round (``a[r][k]`` with ``b[r][k]``);
    a round either plan did not finish is left out."""
    return [math.log(x / y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if x > 0 and y > 0]


def compare(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, confidence: float = CONFIDENCE,
            resamples: int = RESAMPLES, seed: int = 0) -> Comparison:
    """A against B by the rule above (``a``, ``b``: each round's pipeline seconds per repeat)."""
    logs = paired_log_ratios(a, b)
    if not logs:
        return Comparison(ratio=math.nan, low=math.nan, high=math.nan, pairs=0, verdict="tie")
    mid = statistics.median(logs)
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(logs, k=len(logs))) for _ in range(resamples))
    tail = (1 - confidence) / 2
    lo, hi = meds[int(tail * (resamples - 1))], meds[int(math.ceil((1 - tail) * (resamples - 1)))]
    if len(logs) < MIN_PAIRS or lo <= 0 <= hi:
        verdict = "tie"
    else:
        verdict = "a" if hi < 0 else "b"
    return Comparison(ratio=math.exp(mid), low=math.exp(lo), high=math.exp(hi), pairs=len(logs), verdict=verdict)


@dataclass(frozen=True, kw_only=True)
class Contender:
    """A plan tied for the best: what breaks the tie."""

    trial: int
    largest_peak_bytes: int | None
    chunks: int
    median_s: float


MEMORY_MARGIN = 0.02
"""Peaks closer than this share are the same peak: a process's resident memory varies by tens of MiB between
runs of one plan, so a tie is not broken by 12 MiB of it (as one of issue 30's searches first did)."""


def break_tie(tied: Sequence[Contender]) -> tuple[Contender, str]:
    """The plan a tie goes to (the lower largest-stage peak memory, by more than ``MEMORY_MARGIN``, then fewer
    chunks, then the faster median) and one sentence saying why."""
    inf = float("inf")

    def peak(c: Contender) -> float:
        return inf if c.largest_peak_bytes is None else float(c.largest_peak_bytes)

    low = min(peak(c) for c in tied)
    lean = [c for c in tied if peak(c) <= low * (1 + MEMORY_MARGIN)]
    ranked = sorted(lean, key=lambda c: (c.chunks, c.median_s, c.trial))
    win = ranked[0]
    if len(tied) == 1:
        return win, "no tie"
    heavier = [c for c in tied if c not in lean]
    if heavier and len(lean) == 1:
        other = min(heavier, key=peak)
        why = (f"the lower largest-stage peak memory ({peak(win) / 2**20:.0f} MiB against "
               f"{peak(other) / 2**20:.0f} MiB of trial {other.trial})")
    elif ranked[1:] and win.chunks < ranked[1].chunks:
        why = (f"peak memory within {MEMORY_MARGIN:.0%} and fewer chunks ({win.chunks} against {ranked[1].chunks} of "
               f"trial {ranked[1].trial})")
    else:
        other = ranked[1] if ranked[1:] else min(heavier, key=peak)
        why = (f"peak memory within {MEMORY_MARGIN:.0%}, the same chunks, and the faster median ({win.median_s:.4g} s "
               f"against {other.median_s:.4g} s of trial {other.trial})")
    return win, f"tie broken in favour of trial {win.trial} by {why}"
