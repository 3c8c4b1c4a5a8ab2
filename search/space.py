"""The search space, pure: S-1 ordered cut indices, each in its own fixed range, plus a chunk count.

Fixed ranges (``cut_i`` in ``[i+1, n-S+i+1]``) keep every parameter's distribution the same in every
trial, which TPE's multivariate model needs (it silently drops parameters whose ranges change); a cut
order that is not increasing is infeasible and reported as a constraint violation, not run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["cut_ranges", "decode", "encode", "violation"]


def cut_ranges(n_segments: int, stages: int) -> list[tuple[int, int]]:
    """Inclusive (low, high) of each ``cut_i``; a cut ``c`` starts a new stage at segment ``c``."""
    if stages < 2:
        raise ValueError(f"a pipeline needs at least 2 stages (got {stages})")
    if stages > n_segments:
        raise ValueError(f"{stages} stages need at least {stages} segments, the model has {n_segments}")
    return [(i + 1, n_segments - stages + i + 1) for i in range(stages - 1)]


def violation(cuts: Sequence[int]) -> float:
    """How far the cuts are from strictly increasing (0 when feasible): the sum of the missing gaps."""
    return float(sum(max(0, a - b + 1) for a, b in zip(cuts, cuts[1:])))


def decode(params: Mapping[str, Any], stages: int) -> tuple[list[int], int]:
    """(cuts, chunks) from a trial's parameters."""
    return [int(params[f"cut_{i}"]) for i in range(stages - 1)], int(params["chunks"])


def encode(cuts: Sequence[int], chunks: int) -> dict[str, int]:
    """Trial parameters for (cuts, chunks), e.g. to enqueue a known plan."""
    return {**{f"cut_{i}": int(c) for i, c in enumerate(cuts)}, "chunks": int(chunks)}
