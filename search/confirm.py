"""The confirmation round: the top plans and PiPPy's plan re-measured side by side before one is declared best.

The round is kept in the study (``study.user_attrs["confirmation"]``, ``Confirmation.to_dict``) so that
exports and the sweep's report can be rebuilt from the study alone.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from pipeline.core.plan import SplitPlan
from pipeline.core.policies import PIPPY
from pipeline.core.result import TrialResult
from pipeline.peers.registry import DEFAULT_RULES
from pipeline.ranks.pooling import Pool
from pipeline.rounds import interleaved
from pipeline.stage.timeline import Timeline
from search.coordination import is_seed, measured_trials, value_of
from search.metric import Metric

__all__ = ["Confirmation", "Confirmed", "confirm"]


@dataclass(frozen=True, kw_only=True)
class Confirmed:
    """One plan of the round: where it came from, what the search measured, what the round measured."""

    trial: int
    source: str
    split_points: tuple[str, ...]
    chunks: int
    search_value: float
    """What the search measured, in the study's metric (speedup or throughput)."""
    values: tuple[float, ...]
    """The round's figure of every repeat, in the study's metric."""
    predicted: float | None = None
    """The cost model's prediction, in the study's metric."""
    predicted_bubble: float | None = None
    detail: dict[str, Any] | None = None
    """Of the round's last run: per-stage compute, serial seconds, the figure, plan and measured timeline."""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.values), max(self.values)) if self.values else (math.nan, math.nan)

    @property
    def timeline(self) -> Timeline | None:
        tl = (self.detail or {}).get("timeline")
        return Timeline.from_dict(tl) if tl else None

    @property
    def plan(self) -> SplitPlan | None:
        d = (self.detail or {}).get("plan")
        return SplitPlan.from_dict(d) if d else None

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.trial, "source": self.source, "split_points": list(self.split_points),
                "chunks": self.chunks, "search_value": self.search_value, "values": list(self.values),
                "median": self.median, "spread": list(self.spread), "predicted": self.predicted,
                "predicted_bubble": self.predicted_bubble, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Confirmed:
        """A kept row (one kept before the metric was named has ``speedups`` and ``search_speedup``)."""
        return cls(trial=int(d["trial"]), source=str(d.get("source")), split_points=tuple(d["split_points"]),
                   chunks=int(d["chunks"]), search_value=float(d.get("search_value", d.get("search_speedup", math.nan))),
                   values=tuple(float(x) for x in d.get("values", d.get("speedups", ()))),
                   predicted=d.get("predicted", d.get("predicted_speedup")), predicted_bubble=d.get("predicted_bubble"),
                   detail=d.get("detail"))


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    """A whole round: its plans, and the trial declared best (the highest median)."""

    rounds: int
    repeats_per_run: int
    plans: tuple[Confirmed, ...]
    metric: str = "speedup"
    """What the plans' figures are: ``speedup`` or ``throughput`` (samples/s)."""
    best_result: TrialResult | None = field(default=None, compare=False)
    """The round's last run of the best plan (in memory only: the study keeps ``detail``)."""

    @property
    def best(self) -> Confirmed | None:
        finite = [p for p in self.plans if not math.isnan(p.median)]
        return max(finite, key=lambda p: p.median) if finite else None

    @property
    def best_trial(self) -> int | None:
        return self.best.trial if self.best else None

    def row(self, trial: int | None) -> Confirmed | None:
        return next((p for p in self.plans if p.trial == trial), None)

    @property
    def pippy(self) -> Confirmed | None:
        return next((p for p in self.plans if PIPPY in p.source.split("+")), None)

    @property
    def frameworks(self) -> dict[str, Confirmed]:
        """Each framework default rule's row (torchtitan, megatron, deepspeed-parameters) that the round measured."""
        return {r: p for r in DEFAULT_RULES for p in self.plans if r in p.source.split("+")}

    def to_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "repeats_per_run": self.repeats_per_run, "metric": self.metric,
                "plans": [p.to_dict() for p in self.plans], "best_trial": self.best_trial}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Confirmation | None:
        if not d:
            return None
        return cls(rounds=int(d.get("rounds", 0)), repeats_per_run=int(d.get("repeats_per_run", 0)),
                   plans=tuple(Confirmed.from_dict(p) for p in d.get("plans", [])),
                   metric=str(d.get("metric", "speedup")))

    @classmethod
    def of(cls, study: optuna.Study) -> Confirmation | None:
        """The round kept in ``study``, if it has one."""
        return cls.from_dict(study.user_attrs.get("confirmation"))


def _detail(result: TrialResult | None, metric: Metric) -> dict[str, Any] | None:
    if result is None:
        return None
    return {"stage_compute_s": list(result.stage_compute_s),
            "serial_s": statistics.median(result.serial_s) if result.serial_s else math.nan,
            "speedup": result.speedup if result.serial_s else math.nan, "throughput": result.throughput,
            "value": metric.of(result), "label": metric.fmt(metric.of(result)), "plan": result.plan.to_dict(),
            "timeline": Timeline.from_result(result).to_dict()}


def _chosen(study: optuna.Study, top: int, references: bool) -> list[FrozenTrial]:
    """The top ``top`` distinct plans, PiPPy's plan, each framework's default rule, and with ``references``
    every seeded reference."""
    ok = sorted((t for t in measured_trials(study) if t.state == TrialState.COMPLETE),
                key=lambda t: float(value_of(t) or 0.0), reverse=True)
    chosen: list[FrozenTrial] = []
    seen: set[str] = set()

    def take(t: FrozenTrial) -> None:
        if t.user_attrs["plan_key"] not in seen:
            chosen.append(t)
            seen.add(t.user_attrs["plan_key"])

    for t in ok:
        if len(chosen) < top:
            take(t)
    pippy = next((t for t in ok if PIPPY in str(t.user_attrs.get("source"))), None)
    if pippy is not None:
        take(pippy)
    for rule in DEFAULT_RULES:  # what each framework's user gets by default, re-measured beside the best
        peer = next((t for t in ok if rule in str(t.user_attrs.get("source")).split("+")), None)
        if peer is not None:
            take(peer)
    if references:
        for t in ok:
            if is_seed(t):
                take(t)
    return chosen


def confirm(study: optuna.Study, pool: Pool, *, top: int, rounds: int, repeats: int, timeout_s: float,
            references: bool = False, progress: bool = True, metric: Metric | None = None) -> Confirmation:
    """Re-measure the top plans, PiPPy's equal-size plan and each framework's default rule (with
    ``references``, every seeded reference policy too), interleaved round by round, and keep the round in the
    study; ``metric`` (default speedup) is the figure they are compared by (throughput times no serial model)."""
    from tqdm import tqdm

    metric = metric or Metric(name="speedup", batch=1)
    chosen = _chosen(study, top, references)
    plans = [SplitPlan.from_dict(t.user_attrs["plan"]) for t in chosen]
    with tqdm(total=rounds * len(chosen), desc="confirming", unit="run", disable=not progress or not chosen) as bar:
        runs = interleaved(pool, plans, rounds, repeats=repeats, serial_all=True, timeout_s=timeout_s,
                           tick=lambda i, r: bar.update(), serial=metric.speedup)
    rows = tuple(Confirmed(trial=t.number, source=str(t.user_attrs.get("source")),
                           split_points=tuple(t.user_attrs["split_points"]), chunks=int(t.user_attrs["chunks"]),
                           search_value=float(value_of(t) or math.nan),
                           values=tuple(runs.speedups(i) if metric.speedup else runs.throughputs(i)),
                           predicted=t.user_attrs.get("predicted_value", t.user_attrs.get("predicted_speedup")),
                           predicted_bubble=t.user_attrs.get("predicted_bubble"), detail=_detail(runs.last(i), metric))
                 for i, t in enumerate(chosen))
    out = Confirmation(rounds=rounds, repeats_per_run=repeats, plans=rows, metric=metric.name)
    best = out.best
    if best is not None:
        out = replace(out, best_result=runs.last(next(i for i, t in enumerate(chosen) if t.number == best.trial)))
    study.set_user_attr("confirmation", out.to_dict())
    return out
