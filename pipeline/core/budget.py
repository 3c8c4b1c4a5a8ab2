"""The memory budget of a run (``--device-memory``), pure: each rank's predicted peak, checked before
anything is built, and whether the whole model fits one device (a serial baseline can be timed).

A rank holds its stages' weights; in training their gradients and the optimizer's state (AdamW two
moments, SGD one momentum); the activations of the microbatches its schedule keeps in flight; and its
runtime (the process itself: torch, the tracing stack; on CPU its resident memory before any model). The last
rank also keeps the batch's output twice (per microbatch and merged) and the output check's reference.
In mixed precision (``--mixed-precision bf16``) the weights count twice: float32, and the bfloat16 copy that
computes (autocast's cast cache for the step; FSDP2's gathered stage in place of a float32 one).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan

__all__ = ["UNITS", "BlockBytes", "MemoryPrediction", "RankMemory", "format_size", "in_flight", "leanest_cuts", "parse_size",
           "predict_memory", "recomputed"]

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "tb": 1000**4}
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}
"""Tensors of a parameter's size the optimizer keeps."""


def parse_size(text: str, flag: str = "--device-memory") -> int:
    """``4GiB``, ``512MiB``, ``1.5GB`` or a byte count: bytes; one line naming the flag and value otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in UNITS or float(m.group(1)) <= 0:
        raise PipesplitError(f"{flag} {text!r} is not a positive size: write it like 4GiB, 512MiB or 2GB")
    return int(float(m.group(1)) * UNITS[unit])


def format_size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True, kw_only=True)
class BlockBytes:
    """One block of the model's stack, per sample: what it saves for backward, and what it keeps recomputed."""

    saved: int
    """Its leaves' outputs (what autograd keeps of it per microbatch in flight)."""
    kept: int
    """Its input (all a recomputed block keeps per microbatch in flight)."""


def recomputed(out_sum: int, blocks: Sequence[BlockBytes], count: int) -> tuple[int, int]:
    """A stage's per-sample bytes per microbatch in flight when its first ``count`` blocks are recomputed, and
    what it holds once more while it recomputes one (the largest of them, for one microbatch)."""
    done = blocks[:count]
    return (max(0, out_sum - sum(b.saved for b in done) + sum(b.kept for b in done)),
            max((b.saved for b in done), default=0))


def in_flight(plan: SplitPlan, rank: int) -> int:
    """Microbatches whose activations a rank may hold at once: every one in GPipe (and whenever it only runs
    forwards, its outputs kept until the batch is merged), as many as the ranks after it and itself in 1F1B,
    every one for the interleaved and zero-bubble schedules (an upper bound)."""
    if plan.mode != "train" or plan.schedule == "GPipe":
        return plan.chunks
    if plan.schedule == "1F1B":
        return min(plan.chunks, plan.ranks - rank)
    return plan.chunks


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """One rank's predicted peak, part by part, in bytes."""

    rank: int
    weights: int
    train_state: int
    """Gradients and optimizer state (training)."""
    activations: int
    runtime: int
    serial: int = 0
    """The whole model (and its step's activations) that rank 0 also holds to time the serial baseline."""

    @property
    def total(self) -> int:
        return self.weights + self.train_state + self.activations + self.runtime + self.serial

    def describe(self) -> str:
        parts = [f"weights {format_size(self.weights)}"]
        if self.train_state:
            parts.append(f"gradients and optimizer state {format_size(self.train_state)}")
        if self.serial:
            parts.append(f"the serial baseline's whole model {format_size(self.serial)}")
        parts += [f"activations {format_size(self.activations)}", f"runtime {format_size(self.runtime)}"]
        return f"rank {self.rank} needs about {format_size(self.total)} ({', '.join(parts)})"


@dataclass(frozen=True, kw_only=True)
class MemoryPrediction:
    """Each rank's predicted peak against the budget, and what the whole model would need on one device."""

    ranks: tuple[RankMemory, ...]
    whole: int
    """The whole model on one device: weights (and training state), activations of the batch, runtime."""
    budget: int

    @property
    def worst(self) -> RankMemory:
        return max(self.ranks, key=lambda r: r.total)

    @property
    def serial_fits(self) -> bool:
        return self.whole <= self.budget

    def check(self, plan: SplitPlan, first: Sequence[str] = ()) -> None:
        """One line naming the rank over the budget, its predicted bytes and what to change (``first``: fixes
        found by the caller, such as the least ``--recompute`` that fits)."""
        w = self.worst
        if w.total <= self.budget:
            return
        fixes = [*first, "more stages (--stages)"]
        if plan.model.dtype == "float32":
            fixes.append("--dtype bfloat16")
        if w.activations > w.weights / 4 and plan.chunks > 1:
            if plan.mode != "train":
                fixes.append("fewer microbatches in flight (--schedule 1F1B, or a smaller --batch-size)")
            elif plan.schedule == "1F1B":
                fixes.append("smaller microbatches (more --chunks)")
            else:
                fixes.append("fewer microbatches in flight (--schedule 1F1B, or more --chunks)")
        raise PipesplitError(f"{w.describe()}, over --device-memory {format_size(self.budget)}: nothing was built; "
                             f"use {', '.join(fixes)}")

    def to_dict(self) -> dict[str, object]:
        return {"budget": self.budget, "whole": self.whole,
                "ranks": [{"rank": r.rank, "weights": r.weights, "train_state": r.train_state,
                           "activations": r.activations, "runtime": r.runtime, "serial": r.serial, "total": r.total}
                          for r in self.ranks]}


def _rank(plan: SplitPlan, r: int, *, w: int, out_sum: int, out_max: Sequence[int], last_out_max: int | None,
          runtime: int, transient: int = 0) -> RankMemory:
    """Rank ``r``'s peak from its stages' weights, summed per-sample leaf outputs and each stage's largest one;
    ``last_out_max`` is the last stage's largest output where the rank holds it; ``transient``: per sample,
    what a recomputed block holds once more while its forward runs again."""
    train = plan.mode == "train"
    state = 1 + OPTIMIZER_STATES.get(plan.optimizer, 2) if train else 0
    d = plan.dp_shard
    micro = max(1, plan.model.batch_size // (plan.chunks * d))
    low = w // 2 if plan.model.mixed_precision else 0  # the weights' bfloat16 copy (FSDP2's gathered, autocast's cast)
    if d > 1:  # FSDP2: a D-th of the weights, gradients and optimizer state; the stage gathered while it computes
        act = out_sum * micro * in_flight(plan, r) + transient * micro  # (and its gradients before reduce-scatter,
        return RankMemory(rank=r, weights=w // d + (low or w), train_state=(w // d) * state + w,  # float32 anyway)
                          activations=act, runtime=runtime)
    if train:
        act = out_sum * micro * in_flight(plan, r) + transient * micro
    else:  # a stage's input and output per microbatch
        act = sum(3 * m * micro for m in out_max)
    if last_out_max is not None:  # the batch's output twice (per microbatch, merged) and the check's reference
        act += 3 * last_out_max * plan.model.batch_size
    return RankMemory(rank=r, weights=w + low, train_state=w * state, activations=act, runtime=runtime)


def predict_memory(plan: SplitPlan, *, weights: Sequence[int], leaf_out_sum: Sequence[int], leaf_out_max: Sequence[int],
                   runtime: int, budget: int, serial: bool = False, blocks: Sequence[Sequence[BlockBytes]] = (),
                   counts: Sequence[int] | None = None) -> MemoryPrediction:
    """Each rank's peak from its stages' bytes (per stage: weights, per-sample leaf outputs summed and largest);
    ``serial``: rank 0 also holds the whole model, to time the serial baseline beside the pipeline; ``counts``
    of each stage's ``blocks`` recomputed (training)."""
    train = plan.mode == "train"
    state = 1 + OPTIMIZER_STATES.get(plan.optimizer, 2) if train else 0
    sums, extra = list(leaf_out_sum), [0] * len(leaf_out_sum)
    if train and counts is not None and blocks:
        for s, n in enumerate(counts):
            sums[s], extra[s] = recomputed(leaf_out_sum[s], blocks[s], n)
    ranks = []
    for r in range(plan.ranks):
        held = plan.rank_stages(r)
        last = plan.stages - 1
        ranks.append(_rank(plan, r, w=sum(weights[s] for s in held), out_sum=sum(sums[s] for s in held),
                           out_max=[leaf_out_max[s] for s in held],
                           last_out_max=leaf_out_max[last] if last in held else None, runtime=runtime,
                           transient=max(extra[s] for s in held)))
    total_w = sum(weights)
    whole_act = (sum(leaf_out_sum) if train else 3 * max(leaf_out_max, default=0)) * plan.model.batch_size
    alone = total_w * (1 + state) + whole_act + (total_w // 2 if plan.model.mixed_precision else 0)
    if serial and ranks:
        ranks[0] = replace(ranks[0], serial=alone)
    return MemoryPrediction(ranks=tuple(ranks), whole=alone + runtime, budget=budget)


def leanest_cuts(plan: SplitPlan, *, weights: Sequence[int], leaf_out_sum: Sequence[int],
                 leaf_out_max: Sequence[int], runtime: int, serial: int = 0) -> tuple[tuple[int, ...], RankMemory]:
    """The cuts of ``len(weights)`` segments into ``plan.ranks`` contiguous stages (one per rank) whose largest
    rank is predicted smallest, and that rank: the least memory any plan of this shape can need (exact, by
    dynamic programming over where each stage ends; the plan's chunks, mode and schedule as given; ``serial``
    bytes of the serial baseline's whole model on rank 0)."""
    n, ranks = len(weights), plan.ranks
    if not 1 <= ranks <= n:
        raise ValueError(f"cannot cut {n} segments into {ranks} stages")
    pw = [0]
    ps = [0]
    for w, o in zip(weights, leaf_out_sum):
        pw.append(pw[-1] + w)
        ps.append(ps[-1] + o)

    def cost(r: int, a: int, b: int) -> RankMemory:
        top = max(leaf_out_max[a:b])
        last = top if b == n else None  # the last stage's output, counted as predict_memory counts it
        got = _rank(plan, r, w=pw[b] - pw[a], out_sum=ps[b] - ps[a], out_max=[top],
                    last_out_max=last, runtime=runtime)
        return replace(got, serial=serial) if r == 0 and serial else got

    inf = float("inf")
    # best[r][b]: the least largest rank over the first r stages covering segments [0, b)
    best: list[list[float]] = [[inf] * (n + 1) for _ in range(ranks + 1)]
    back: list[list[int]] = [[0] * (n + 1) for _ in range(ranks + 1)]
    best[0][0] = 0
    for r in range(1, ranks + 1):
        for b in range(r, n - (ranks - r) + 1):
            for a in range(r - 1, b):
                if best[r - 1][a] == inf:
                    continue
                v = max(best[r - 1][a], cost(r - 1, a, b).total)
                if v < best[r][b]:
                    best[r][b], back[r][b] = v, a
    cuts: list[int] = []
    b = n
    for r in range(ranks, 0, -1):
        b = back[r][b]
        cuts.append(b)
    bounds = [*reversed(cuts[:-1]), n]
    starts = [0, *bounds[:-1]]
    worst = max((cost(r, a, e) for r, (a, e) in enumerate(zip(starts, bounds))), key=lambda m: m.total)
    return tuple(bounds[:-1]), worst
