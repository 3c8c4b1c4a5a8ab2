"""Reference split policies as pure functions over numbers: what other tools would have chosen.

Each returns cut indices: ``i`` means "a new stage starts at item ``i``", increasing, ``0 < i < n``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["balanced_cuts", "equal_size_cuts", "uniform_cuts", "POLICIES"]

POLICIES = ("equal-size", "uniform", "params")


def _check(n: int, stages: int) -> None:
    if stages < 1:
        raise ValueError(f"stages must be a positive integer (got {stages})")
    if stages > n:
        raise ValueError(f"cannot make {stages} stages from {n} items: use at most {n} stages")


def equal_size_cuts(sizes: Sequence[int], stages: int) -> list[int]:
    """PiPPy's ``split_into_equal_size``: fill a stage up to total // stages elements, greedily, in order.

    This mirrors ``pippy.ModelSplit._split_on_size_threshold_with_max_stages`` over the units it sees
    (a parameter-using op each): a unit that would overflow the stage starts the next one, a unit larger
    than the threshold on its own becomes a stage, and no more than ``stages - 1`` cuts are made. Like
    PiPPy it may make fewer stages than asked; that raises here, naming what it made.
    """
    n = len(sizes)
    _check(n, stages)
    threshold = sum(sizes) // stages
    cuts: list[int] = []
    acc = 0
    for i, s in enumerate(sizes):
        if acc + s <= threshold:
            acc += s
        elif acc == 0 and s > threshold:
            cuts.append(i + 1)
        else:
            cuts.append(i)
            acc = s
    cuts = [c for c in cuts if 0 < c < n][: stages - 1]
    if len(cuts) != stages - 1:
        raise ValueError(f"PiPPy's equal-size rule makes only {len(cuts) + 1} stages here, not {stages}")
    return cuts


def uniform_cuts(n: int, stages: int) -> list[int]:
    """The same number of items per stage, the remainder spread over the first stages (GPipe/Megatron)."""
    _check(n, stages)
    base, extra = divmod(n, stages)
    cuts, at = [], 0
    for s in range(stages - 1):
        at += base + (1 if s < extra else 0)
        cuts.append(at)
    return cuts


def balanced_cuts(weights: Sequence[float], stages: int) -> list[int]:
    """Contiguous partition minimising the heaviest stage (exact DP; ties go to the earliest cuts).

    With parameter counts it is DeepSpeed's ``partition_method='parameters'``; with measured times,
    torchgpipe's ``balance_by_time``; with FLOPs, a FLOP-balanced split.
    """
    n = len(weights)
    _check(n, stages)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    inf = float("inf")
    # best[k][j]: minimal max-stage weight for items[:j] in k stages; arg[k][j]: start of the last stage.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    arg = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j] - 1e-12:
                    best[k][j], arg[k][j] = cost, i
    cuts, j = [], n
    for k in range(stages, 1, -1):
        j = arg[k][j]
        cuts.append(j)
    return sorted(cuts)


def nearest_boundaries(points: Sequence[float], boundaries: Sequence[float]) -> list[int]:
    """For cuts at cumulative fractions ``points``, the nearest block boundaries (indices 1..n-1), increasing.

    A mid-block cut (PiPPy's) cannot be predicted from per-block segments; the block cut nearest to it
    in the same measure (its share of the parameters) stands in for it when a chunk count is chosen.
    ``boundaries[k]`` is the fraction before block ``k``; a collision moves the later cut on, and a cut
    leaves room for the ones after it.
    """
    n = len(boundaries)
    if len(points) > n - 1:
        raise ValueError(f"{len(points)} cuts do not fit between {n} blocks")
    out: list[int] = []
    for i, f in enumerate(points):
        lo = out[-1] + 1 if out else 1
        hi = n - (len(points) - i - 1)  # leave room for the cuts still to place
        out.append(min(range(lo, hi), key=lambda j: (abs(boundaries[j] - f), j)))
    return out
