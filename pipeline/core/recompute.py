"""Activation recomputation per stage (``--recompute``), pure: what a plan says, and the least that fits.

A stage's *blocks* are the layers of the model's one stack (``model.layers.<i>``, ``blocks.<i>``) that begin
in it (``pipeline.core.stack.Stack.stage_layers``). Stage i recomputes its first Ni blocks: such a block keeps
only its input per microbatch in flight, and runs its forward again inside its backward (Megatron's
``--recompute-method block --recompute-num-layers N``, with one N per stage rather than one for all).
``none`` and ``full`` (every block of every stage, torchtitan's ``activation_checkpoint.mode = "full"``)
are the uniform settings the frameworks offer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.core.errors import PipesplitError

__all__ = ["NAMES", "Recompute", "counts_for", "describe", "least_counts", "parse_recompute", "to_json"]

NAMES = ("none", "full")
Recompute = str | tuple[int, ...]
"""``none``, ``full``, or one count per stage in stage order."""


def parse_recompute(value: Any, *, flag: str = "--recompute") -> Recompute:
    """``none``, ``full``, ``1,0,2,0`` (a list in a plan file): the plan's form, or one line on how to write it."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in NAMES:
            return text
        parts = [t.strip() for t in text.split(",") if t.strip()]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = None
    try:
        counts = tuple(int(p) for p in parts) if parts else None
        ok = counts is not None and all(c >= 0 and str(c) == str(p).strip() for c, p in zip(counts, parts or ()))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise PipesplitError(f"{flag} {value!r} is not a recomputation: use none, full, or one count of blocks per "
                             "stage in stage order, e.g. 2,1,0,0")
    return counts  # type: ignore[return-value]


def to_json(rc: Recompute) -> str | list[int]:
    return rc if isinstance(rc, str) else list(rc)


def check_stages(rc: Recompute, stages: int) -> None:
    """One line where a per-stage list does not have one count per stage."""
    if not isinstance(rc, str) and len(rc) != stages:
        raise PipesplitError(f"--recompute {','.join(map(str, rc))} gives {len(rc)} counts for {stages} stages: give "
                             f"one per stage (stages x stages-per-rank of them) in stage order, e.g. "
                             f"{','.join(['1'] * stages)}")


def counts_for(rc: Recompute, blocks: Sequence[int]) -> tuple[int, ...]:
    """Per stage, how many of its first blocks are recomputed, given how many blocks each stage holds; one
    line where a count asks for more blocks than its stage has."""
    if rc == "none":
        return tuple(0 for _ in blocks)
    if isinstance(rc, str):  # full
        return tuple(blocks)
    check_stages(rc, len(blocks))
    for s, (n, have) in enumerate(zip(rc, blocks)):
        if n > have:
            raise PipesplitError(f"--recompute asks stage {s} to recompute {n} blocks, but it holds {have}: give at "
                                 f"most {','.join(map(str, blocks))} (each stage's blocks)")
    return tuple(rc)


def describe(rc: Recompute) -> str:
    """The setting as a user types it."""
    return rc if isinstance(rc, str) else ",".join(map(str, rc))


def normal(counts: Sequence[int], blocks: Sequence[int]) -> Recompute:
    """The shortest way to write ``counts``: ``none``, ``full`` (where every stage has blocks), or the list."""
    if not any(counts):
        return "none"
    if tuple(counts) == tuple(blocks) and all(blocks):
        return "full"
    return tuple(int(c) for c in counts)


def least_counts(blocks: Sequence[int], rank_stages: Sequence[Sequence[int]], fits: Callable[[int, dict[int, int]], bool],
                 cost: Callable[[int, int], float] | None = None) -> tuple[int, ...] | None:
    """The per-stage counts that fit with the least recomputation, or None where even ``full`` does not.

    Ranks hold their stages apart in memory, so each rank is solved alone: among the counts of its stages
    (``rank_stages[r]``; at most ``blocks[s]`` each) for which ``fits(r, {stage: count})`` holds, the one of
    least ``cost`` (the sum of ``cost(stage, count)``, by default the count: each recomputed block costs its
    forward again), ties broken toward fewer blocks, then earlier stages' counts. Exact: every combination
    of a rank's counts is tried (a rank holds one or two stages, each of a few blocks).
    """
    price = cost or (lambda s, n: float(n))
    out = [0] * len(blocks)
    for r, stages in enumerate(rank_stages):
        best: tuple[float, int, tuple[int, ...]] | None = None
        for combo in itertools.product(*(range(blocks[s] + 1) for s in stages)):
            key = (sum(price(s, n) for s, n in zip(stages, combo)), sum(combo), combo)
            if best is not None and key >= best:
                continue
            if fits(r, dict(zip(stages, combo))):
                best = key
        if best is None:
            return None
        for s, n in zip(stages, best[2]):
            out[s] = n
    return tuple(out)
