"""Reference split policies as pure functions over numbers, and the one registry that names them.

Each rule returns cut indices: ``i`` means "a new stage starts at item ``i``", increasing, ``0 < i < n``.
The registry (``POLICIES``) holds the pure rules; ``pipeline.peers.registry.POLICIES`` adds the training
frameworks' rules (run by their own code) and is the one set of names that ``pipeline.run --policy``, the
search's seeds and the sweep's report read. A policy cuts either PiPPy's units (``pippy-equal-size``: a
unit is a parameter-using leaf module, so it may cut inside a block) or the candidate block segments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["POLICIES", "PIPPY", "Policy", "PolicyInputs", "balanced_cuts", "equal_size_cuts", "nearest_boundaries",
           "policy", "uniform_cuts"]


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

    This is the min-max balance that DeepSpeed's ``partition_balanced`` (which minimises max-min) and
    torchgpipe's ``blockpartition.solve`` (a heuristic) aim at; neither computes it exactly, so a result
    here is not "what a DeepSpeed or torchgpipe user gets": run their code for that.
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


@dataclass(frozen=True, kw_only=True)
class PolicyInputs:
    """What the reference policies weigh; the per-segment lists follow the candidate block segments."""

    unit_elements: tuple[int, ...]
    """Parameter+buffer elements of each PiPPy unit, in order of first use (``Candidates.units``)."""
    segment_elements: tuple[int, ...]
    """Parameter+buffer elements of each block segment (``Candidates.segment_params``)."""
    segment_times: tuple[float, ...] | None = None
    """Measured seconds of each segment at the plan's microbatch size (from a profile), if known."""
    segment_flops: tuple[int, ...] | None = None
    """Multiply-accumulates per sample of each segment (from a profile), if known."""
    segment_names: tuple[str, ...] = ()
    """The block segments' module names (``Candidates.blocks``): where the frameworks' rules find the stack."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A named reference rule: what another tool (or a textbook balance) would have cut."""

    name: str
    summary: str
    """One line for ``--help`` and reports: what it balances and whose rule it is."""
    on_units: bool
    """Cuts index ``PolicyInputs.unit_elements`` (PiPPy's units) rather than the block segments."""
    needs_profile: bool
    rule: Callable[[PolicyInputs, int], list[int]]
    framework: str | None = None
    """The training framework whose rule this is (``pipeline.peers``), run by that framework's own code."""
    default_rule: bool = False
    """What that framework does when its user sets nothing: the reference a split is measured against."""

    def cuts(self, inputs: PolicyInputs, stages: int) -> list[int]:
        """Cut indices for ``stages`` stages; a ValueError says why the rule cannot make that many."""
        return self.rule(inputs, stages)


def _need(values: Sequence[float] | None, what: str) -> Sequence[float]:
    if values is None:
        raise ValueError(f"this policy balances {what}, which only a profile measures")
    return values


PIPPY = "pippy-equal-size"
POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy(name=PIPPY, summary="PiPPy's split_into_equal_size: parameters, greedy, may cut inside a block",
           on_units=True, needs_profile=False, rule=lambda i, s: equal_size_cuts(i.unit_elements, s)),
    Policy(name="uniform", summary="the same number of blocks per stage (GPipe, Megatron)",
           on_units=False, needs_profile=False, rule=lambda i, s: uniform_cuts(len(i.segment_elements), s)),
    Policy(name="params-balanced", summary="exact min-max balance of parameter elements per stage (the goal of "
           "DeepSpeed's partition_method='parameters', which minimises max-min instead)",
           on_units=False, needs_profile=False, rule=lambda i, s: balanced_cuts(i.segment_elements, s)),
    Policy(name="time-balanced", summary="exact min-max balance of measured segment times (the goal of "
           "torchgpipe's balance_by_time, whose blockpartition.solve is a heuristic)",
           on_units=False, needs_profile=True,
           rule=lambda i, s: balanced_cuts(_need(i.segment_times, "measured times"), s)),
    Policy(name="flops-balanced", summary="exact min-max balance of FLOPs per stage",
           on_units=False, needs_profile=True,
           rule=lambda i, s: balanced_cuts(_need(i.segment_flops, "FLOPs"), s)),
)}
ALIASES = {"equal-size": PIPPY, "params": "params-balanced"}
"""Older ``pipeline.run --policy`` names, still accepted."""


def policy(name: str) -> Policy:
    """The policy called ``name`` (or an older alias of it); a ValueError lists the names there are."""
    found = POLICIES.get(ALIASES.get(name, name))
    if found is None:
        raise ValueError(f"policy {name!r} is unknown: use one of {', '.join(POLICIES)}")
    return found
