"""The confirmation round: the top plans and PiPPy's plan re-measured side by side before one is declared best.

Plans are compared by their own pipeline seconds, paired within each round (``search.judging.ties``): the fastest
by median is the candidate, every plan the tie rule cannot separate from it is tied with it, and while a
tie stands and the budget allows (as many extra rounds as the round had), the tied plans run again. A tie
that remains is broken by the lower largest-stage peak memory, then the fewer chunks, and said. A plan's
reported speedup divides the pooled serial seconds of its round (every plan's serial runs in that round)
by its pipeline seconds, so that one slow serial repeat does not crown a plan.

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
from search.judging.ties import CONFIDENCE, MIN_PAIRS, Comparison, Contender, break_tie, compare
from search.trials.coordination import is_seed, measured_trials, value_of
from search.trials.metric import Metric

__all__ = ["Confirmation", "Confirmed", "confirm", "decide"]


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
    round_s: tuple[tuple[float, ...], ...] = ()
    """Pipeline seconds of each repeat, per round (empty for a round it did not run or finish)."""
    peak_bytes: int | None = None
    """The largest stage's peak memory over the round's runs."""

    @property
    def pipeline_s(self) -> float:
        """Median pipeline seconds over every repeat of every round."""
        flat = [x for r in self.round_s for x in r]
        return statistics.median(flat) if flat else math.nan

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
                "predicted_bubble": self.predicted_bubble, "detail": self.detail,
                "round_s": [list(r) for r in self.round_s], "peak_bytes": self.peak_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Confirmed:
        """A kept row (one kept before the metric was named has ``speedups`` and ``search_speedup``)."""
        return cls(trial=int(d["trial"]), source=str(d.get("source")), split_points=tuple(d["split_points"]),
                   chunks=int(d["chunks"]), search_value=float(d.get("search_value", d.get("search_speedup", math.nan))),
                   values=tuple(float(x) for x in d.get("values", d.get("speedups", ()))),
                   predicted=d.get("predicted", d.get("predicted_speedup")), predicted_bubble=d.get("predicted_bubble"),
                   detail=d.get("detail"), round_s=tuple(tuple(float(x) for x in r) for r in d.get("round_s", ())),
                   peak_bytes=d.get("peak_bytes"))


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
    declared: int | None = None
    """The trial declared best by the tie rule (None: a round kept before it, whose best is the highest median)."""
    tied_with: tuple[int, ...] = ()
    """The trials the rule could not separate from the declared best."""
    tie_reason: str | None = None
    """How a tie was broken (peak memory, then chunks), in one sentence."""
    comparisons: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Each other plan against the fastest: ``search.judging.ties.Comparison.to_dict``, by trial."""
    extra_rounds: int = 0
    """Rounds run for the tied plans only, after the round's own."""

    @property
    def best(self) -> Confirmed | None:
        if self.declared is not None:
            return self.row(self.declared)
        finite = [p for p in self.plans if not math.isnan(p.median)]
        return max(finite, key=lambda p: p.median) if finite else None

    @property
    def tied(self) -> list[Confirmed]:
        return [p for t in self.tied_with if (p := self.row(t)) is not None]

    def verdict(self) -> str:
        """What the round decided and by which rule, in a sentence or two (summary, dashboard note)."""
        if self.declared is None:
            return ""
        rule = (f"paired pipeline seconds, {CONFIDENCE:.0%} bootstrap interval of their ratio over the pairs of "
                "each round's repeats")
        comps = {t: Comparison(**c) for t, c in self.comparisons.items()}
        if not self.tied_with:
            if not comps:
                return f"Trial {self.declared} is the only plan the round measured."
            t, c = min(comps.items(), key=lambda kv: kv[1].ratio)
            return (f"Trial {self.declared} is the fastest, separated from every other plan ({rule}): the nearest, "
                    f"trial {t}, takes {c.ratio:.3f}x its pipeline seconds ({c.low:.3f}-{c.high:.3f}, {c.pairs} pairs).")
        group = sorted((self.declared, *self.tied_with))
        shown = "; ".join(f"trial {t} {c.ratio:.3f}x ({c.low:.3f}-{c.high:.3f}, {c.pairs} pairs)"
                          for t, c in comps.items() if t in group)
        extra = f" after {self.extra_rounds} more round{'s' if self.extra_rounds != 1 else ''} of them" \
            if self.extra_rounds else ""
        pairs = min((c.pairs for t, c in comps.items() if t in group), default=0)
        runs = f"{pairs} pair{'s' if pairs != 1 else ''} of runs separate{'s' if pairs == 1 else ''}"
        few = (f" {runs} no two plans (the rule needs {MIN_PAIRS}): more --confirm-rounds or --repeats give it more."
               if pairs < MIN_PAIRS else "")
        return (f"Tied: trials {', '.join(map(str, group))} cannot be separated{extra} ({rule}; against the fastest: "
                f"{shown}). The {self.tie_reason}.{few}")

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
                "plans": [p.to_dict() for p in self.plans], "best_trial": self.best_trial, "declared": self.declared,
                "tied_with": list(self.tied_with), "tie_reason": self.tie_reason, "extra_rounds": self.extra_rounds,
                "comparisons": {str(k): v for k, v in self.comparisons.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Confirmation | None:
        if not d:
            return None
        return cls(rounds=int(d.get("rounds", 0)), repeats_per_run=int(d.get("repeats_per_run", 0)),
                   plans=tuple(Confirmed.from_dict(p) for p in d.get("plans", [])),
                   metric=str(d.get("metric", "speedup")), declared=d.get("declared"),
                   tied_with=tuple(int(t) for t in d.get("tied_with", ())), tie_reason=d.get("tie_reason"),
                   extra_rounds=int(d.get("extra_rounds", 0)),
                   comparisons={int(k): v for k, v in (d.get("comparisons") or {}).items()})

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


def _rounds(pool: Pool, plans: list[SplitPlan], indices: list[int], rounds: int, first: int, data: list[dict[int, TrialResult]],
            *, repeats: int, timeout_s: float, serial: bool, tick: Any) -> None:
    """Run the plans ``indices`` for ``rounds`` interleaved rounds numbered from ``first``, into ``data``."""
    runs = interleaved(pool, [plans[i] for i in indices], rounds, repeats=repeats, serial_all=serial,
                       timeout_s=timeout_s, tick=tick, serial=serial)
    for j, i in enumerate(indices):
        for r, res in zip(runs.round_of[j], runs.results[j]):
            data[i][first + r] = res


def _row(t: FrozenTrial, runs: dict[int, TrialResult], total: int, serial_of: dict[int, float],
         metric: Metric) -> Confirmed:
    """A plan's row: its pipeline seconds per round, and its figure per repeat (a speedup over the pooled
    serial seconds of the repeat's round, or a throughput)."""
    if metric.speedup:
        values = [serial_of[r] / p for r, res in sorted(runs.items()) for p in res.pipeline_s if p > 0 and r in serial_of]
    else:
        values = [x for _, res in sorted(runs.items()) for x in res.throughputs]
    peaks = [max(res.peak_mem_bytes) for res in runs.values() if res.peak_mem_bytes]
    last = runs[max(runs)] if runs else None
    return Confirmed(trial=t.number, source=str(t.user_attrs.get("source")),
                     split_points=tuple(t.user_attrs["split_points"]), chunks=int(t.user_attrs["chunks"]),
                     search_value=float(value_of(t) or math.nan), values=tuple(values),
                     predicted=t.user_attrs.get("predicted_value", t.user_attrs.get("predicted_speedup")),
                     predicted_bubble=t.user_attrs.get("predicted_bubble"), detail=_detail(last, metric),
                     round_s=tuple(tuple(runs[r].pipeline_s) if r in runs else () for r in range(total)),
                     peak_bytes=max(peaks) if peaks else None)


def decide(rows: tuple[Confirmed, ...]) -> tuple[int | None, tuple[int, ...], dict[int, Comparison]]:
    """The fastest plan by median pipeline seconds, the plans the tie rule cannot separate from it, and each
    plan's comparison with it (``search.judging.ties.compare``)."""
    timed = [r for r in rows if not math.isnan(r.pipeline_s)]
    if not timed:
        return None, (), {}
    fastest = min(timed, key=lambda r: r.pipeline_s)
    comps = {r.trial: compare(r.round_s, fastest.round_s) for r in timed if r is not fastest}
    return fastest.trial, tuple(t for t, c in comps.items() if c.verdict != "b"), comps


def confirm(study: optuna.Study, pool: Pool, *, top: int, rounds: int, repeats: int, timeout_s: float,
            references: bool = False, progress: bool = True, metric: Metric | None = None,
            extra_rounds: int | None = None) -> Confirmation:
    """Re-measure the top plans, PiPPy's equal-size plan and each framework's default rule (with
    ``references``, every seeded reference policy too), interleaved round by round, compare them by their
    paired pipeline seconds, run the tied plans again while a tie stands (up to ``extra_rounds``, default
    ``rounds``), and keep the round in the study; ``metric`` (default speedup) is the figure reported."""
    from tqdm import tqdm

    metric = metric or Metric(name="speedup", batch=1)
    extra_rounds = rounds if extra_rounds is None else extra_rounds
    if (rounds + extra_rounds) * repeats < MIN_PAIRS:
        extra_rounds = 0  # too few pairs even after them to separate two plans: rounds that cannot change a tie
    chosen = _chosen(study, top, references)
    plans = [SplitPlan.from_dict(t.user_attrs["plan"]) for t in chosen]
    data: list[dict[int, TrialResult]] = [{} for _ in chosen]
    kw: dict[str, Any] = {"repeats": repeats, "timeout_s": timeout_s, "serial": metric.speedup}
    with tqdm(total=rounds * len(chosen), desc="confirming", unit="run", disable=not progress or not chosen) as bar:
        _rounds(pool, plans, list(range(len(chosen))), rounds, 0, data, tick=lambda i, r: bar.update(), **kw)
        total, extra = rounds, 0
        while True:
            serial_of = {r: statistics.median(s) for r in range(total)
                         if (s := [x for d in data if r in d for x in d[r].serial_s])}
            rows = tuple(_row(t, data[i], total, serial_of, metric) for i, t in enumerate(chosen))
            fastest, tied, comps = decide(rows)
            if not tied or extra >= extra_rounds:
                break
            group = [i for i, t in enumerate(chosen) if t.number == fastest or t.number in tied]
            bar.total += len(group)
            _rounds(pool, plans, group, 1, total, data, tick=lambda i, r: bar.update(), **kw)
            total, extra = total + 1, extra + 1
    declared, reason = fastest, None
    if fastest is not None and tied:
        group_rows = [r for r in rows if r.trial == fastest or r.trial in tied]
        win, reason = break_tie([Contender(trial=r.trial, largest_peak_bytes=r.peak_bytes, chunks=r.chunks,
                                           median_s=r.pipeline_s) for r in group_rows])
        declared = win.trial
    out = Confirmation(rounds=rounds, repeats_per_run=repeats, plans=rows, metric=metric.name, declared=declared,
                       tied_with=tuple(t for t in ((fastest, *tied) if fastest is not None else ()) if t != declared),
                       tie_reason=reason, comparisons={t: c.to_dict() for t, c in comps.items()}, extra_rounds=extra)
    if declared is not None:
        i = next(i for i, t in enumerate(chosen) if t.number == declared)
        out = replace(out, best_result=data[i][max(data[i])] if data[i] else None)
    study.set_user_attr("confirmation", out.to_dict())
    return out
