"""Calibration from a search's own trials: how fast busy stages really run beside each other here.

The machine model says a busy stage runs at ``rate(k)`` of its alone speed with ``k`` stages busy. A
measured trial's timeline says how long each microbatch took on each stage and how many stages were busy
meanwhile; with the profile's alone seconds ``w`` of that stage's work, each span gives one equation

    w = sum over k of  rho_k * rate(k) * (seconds of the span during which k stages were busy)

linear in one factor ``rho_k`` per busy count k = 1..S. Why these factors: what the profile cannot see
is how much stages slow each other down (shared caches, memory bandwidth, the scheduler), and that
depends on how many are busy, not on where the cuts are. A factor per microbatch size as well would
need S x sizes trials to fit and, on the grids measured here, fitted noise. Each trial is kept as its
least-squares sums (an S x S matrix and a vector), so a resumed study refits from the study alone, and
a fit needs at least as many trials as it has factors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.types import Machine

__all__ = ["Calibration", "TrialRows", "fit", "trial_rows"]

_CLIP = (0.2, 5.0)


@dataclass(frozen=True, kw_only=True)
class TrialRows:
    """One trial's least-squares sums for the factors rho_1..rho_S."""

    xtx: tuple[tuple[float, ...], ...]
    xty: tuple[float, ...]
    spans: int

    def to_dict(self) -> dict[str, Any]:
        return {"xtx": [list(r) for r in self.xtx], "xty": list(self.xty), "spans": self.spans}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialRows:
        return cls(xtx=tuple(tuple(float(x) for x in r) for r in d["xtx"]), xty=tuple(float(x) for x in d["xty"]),
                   spans=int(d.get("spans", 0)))


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Fitted factors on the machine model's rate, one per busy-stage count, and how many trials made them."""

    factors: dict[int, float]
    trials: int

    def apply(self, machine: Machine) -> Machine:
        """The machine with each busy count's rate multiplied by its factor (as extra contention)."""
        stages = max(self.factors, default=1)
        contention = {k: machine.contention_at(k) / self.factors.get(k, 1.0) for k in range(1, stages + 1)}
        return Machine(device=machine.device, cores=machine.cores, threads=machine.threads, contention=contention)

    def to_dict(self) -> dict[str, Any]:
        return {"factors": {str(k): v for k, v in self.factors.items()}, "trials": self.trials}


def _busy_seconds(span: tuple[float, float], everyone: Sequence[tuple[float, float]], stages: int) -> list[float]:
    """Seconds of ``span`` during which k = 1..stages spans of ``everyone`` (itself included) were running."""
    a, b = span
    cuts = sorted({a, b, *(x for s in everyone for x in s if a < x < b)})
    out = [0.0] * stages
    for lo, hi in zip(cuts, cuts[1:]):
        mid = (lo + hi) / 2
        k = sum(1 for s, e in everyone if s <= mid < e)
        out[min(max(k, 1), stages) - 1] += hi - lo
    return out


def trial_rows(work: Sequence[float], spans: Sequence[Sequence[tuple[float, float]]], machine: Machine) -> TrialRows:
    """The sums of one trial: ``work[r]`` alone seconds per microbatch of stage r, ``spans[r]`` its measured
    compute spans (start, end) on one clock."""
    stages = len(work)
    everyone = [s for rank in spans for s in rank]
    rate = [machine.rate(k) for k in range(1, stages + 1)]
    xtx = np.zeros((stages, stages))
    xty = np.zeros(stages)
    n = 0
    for r, rank in enumerate(spans):
        for span in rank:
            x = np.array(_busy_seconds(span, everyone, stages)) * np.array(rate)
            xtx += np.outer(x, x)
            xty += x * work[r]
            n += 1
    return TrialRows(xtx=tuple(tuple(float(v) for v in row) for row in xtx), xty=tuple(float(v) for v in xty), spans=n)


def fit(trials: Sequence[TrialRows]) -> Calibration:
    """The factors that best explain every trial's spans; a ValueError for fewer trials than factors."""
    if not trials:
        raise ValueError("no measured trials to calibrate on")
    xtx = sum((np.array(t.xtx) for t in trials), np.zeros((len(trials[0].xty),) * 2))
    xty = sum((np.array(t.xty) for t in trials), np.zeros(len(trials[0].xty)))
    seen = [k for k in range(len(xty)) if xtx[k, k] > 1e-12]
    if len(trials) < len(seen):
        raise ValueError(f"{len(trials)} trial(s) cannot fit {len(seen)} factors (one per busy-stage count seen): "
                         "measure more plans first")
    sub = xtx[np.ix_(seen, seen)]
    rho, *_ = np.linalg.lstsq(sub, xty[seen], rcond=None)
    factors = {k + 1: float(np.clip(v, *_CLIP)) for k, v in zip(seen, rho)}
    return Calibration(factors=factors, trials=len(trials))
