"""The memory budget of a run (``--device-memory``), pure: each rank's predicted peak, checked before
anything is built, and whether the whole model fits one device (a serial baseline can be timed).

A rank holds its stages' weights; in training their gradients and the optimizer's state (AdamW two
moments, SGD one momentum); the activations of the microbatches its schedule keeps in flight; and its
runtime (the process itself: torch, the tracing stack; on CPU its resident memory before any model). The last
rank also keeps the batch's output twice (per microbatch and merged) and the output check's reference.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.errors import PipesplitError
from pipeline.core.plan import SplitPlan

__all__ = ["UNITS", "MemoryPrediction", "RankMemory", "format_size", "in_flight", "parse_size", "predict_memory"]

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

    @property
    def total(self) -> int:
        return self.weights + self.train_state + self.activations + self.runtime

    def describe(self) -> str:
        parts = [f"weights {format_size(self.weights)}"]
        if self.train_state:
            parts.append(f"gradients and optimizer state {format_size(self.train_state)}")
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

    def check(self, plan: SplitPlan) -> None:
        """One line naming the rank over the budget, its predicted bytes and what to change."""
        w = self.worst
        if w.total <= self.budget:
            return
        fixes = ["more stages (--stages)"]
        if plan.model.dtype == "float32":
            fixes.append("--dtype bfloat16")
        if w.activations > w.weights / 4 and plan.chunks > 1:
            fixes.append("fewer microbatches in flight (--schedule 1F1B" + (", or more --chunks)" if plan.mode == "train"
                                                                           else ", or a smaller --batch-size)"))
        raise PipesplitError(f"{w.describe()}, over --device-memory {format_size(self.budget)}: nothing was built; "
                             f"use {', '.join(fixes)}")

    def to_dict(self) -> dict[str, object]:
        return {"budget": self.budget, "whole": self.whole,
                "ranks": [{"rank": r.rank, "weights": r.weights, "train_state": r.train_state,
                           "activations": r.activations, "runtime": r.runtime, "total": r.total} for r in self.ranks]}


def predict_memory(plan: SplitPlan, *, weights: Sequence[int], leaf_out_sum: Sequence[int], leaf_out_max: Sequence[int],
                   runtime: int, budget: int) -> MemoryPrediction:
    """Each rank's peak from its stages' bytes (per stage: weights, per-sample leaf outputs summed and largest)."""
    train = plan.mode == "train"
    state = 1 + OPTIMIZER_STATES.get(plan.optimizer, 2) if train else 0
    micro = max(1, plan.model.batch_size // plan.chunks)
    ranks = []
    for r in range(plan.ranks):
        held = plan.rank_stages(r)
        w = sum(weights[s] for s in held)
        if train:
            act = sum(leaf_out_sum[s] for s in held) * micro * in_flight(plan, r)
        else:  # a stage's input and output per microbatch
            act = sum(3 * leaf_out_max[s] * micro for s in held)
        if plan.stages - 1 in held:  # the batch's output twice (per microbatch, merged) and the check's reference
            act += 3 * leaf_out_max[plan.stages - 1] * plan.model.batch_size
        ranks.append(RankMemory(rank=r, weights=w, train_state=w * state, activations=act, runtime=runtime))
    total_w = sum(weights)
    whole_act = (sum(leaf_out_sum) if train else 3 * max(leaf_out_max, default=0)) * plan.model.batch_size
    return MemoryPrediction(ranks=tuple(ranks), whole=total_w * (1 + state) + whole_act + runtime, budget=budget)
