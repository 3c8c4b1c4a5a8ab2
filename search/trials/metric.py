"""The figure a search ranks plans by, pure: speedup over a serial model timed beside each run, or throughput.

``speedup`` needs the whole model on one device (the serial baseline); ``throughput`` (samples per second for
the whole batch, the batch over the median pipeline seconds) needs nothing but the pipeline, so it is the
figure of a model bigger than one device, and it carries no serial run's noise into a comparison of plans.
The cost model predicts either from one plan's predicted step time: serial / step, or batch / step.
Every figure is "higher is better", so racing, pruning, the sampler and the confirmation round are the
same code for both; only the numbers and their words differ.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.errors import PipesplitError
from pipeline.core.result import TrialResult

__all__ = ["METRICS", "Metric", "choose_metric"]

METRICS = ("speedup", "throughput")


def choose_metric(asked: str | None, *, serial_fits: bool) -> str:
    """The figure a study ranks by: what the user asked for, else speedup where a serial baseline can be
    timed (the whole model fits one device) and throughput otherwise; one line for speedup without one."""
    if asked is not None and asked not in METRICS:
        raise PipesplitError(f"--objective {asked!r} is not one this search knows: give speedup or throughput")
    if asked == "speedup" and not serial_fits:
        raise PipesplitError("--objective speedup needs a serial baseline, but the whole model does not fit "
                             "--device-memory on one device: use --objective throughput (the default here)")
    return asked or ("speedup" if serial_fits else "throughput")


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One study's ranked figure, and how a result, a prediction and a number are read in it."""

    name: str
    batch: int
    """Samples per batch: throughput is the batch over a step's seconds."""

    def __post_init__(self) -> None:
        if self.name not in METRICS:
            raise PipesplitError(f"unknown objective {self.name!r}: give speedup or throughput")

    @property
    def speedup(self) -> bool:
        return self.name == "speedup"

    @property
    def label(self) -> str:
        """The dashboard's metric name and the tables' column heading."""
        return "speedup" if self.speedup else "throughput_samples_per_s"

    @property
    def words(self) -> str:
        """What the figure is, in a sentence's words."""
        return ("speedup (serial model on one stage's threads / pipeline, median over repeats)" if self.speedup
                else "throughput (samples per second for the whole batch: the batch / the median pipeline seconds)")

    def fmt(self, value: float | None) -> str:
        """``1.72x`` or ``12.3/s``; ``-`` for nothing."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return f"{value:.2f}x" if self.speedup else f"{value:.3g}/s"

    def repeats(self, result: TrialResult, serial_s: float | None = None) -> list[float]:
        """The figure of each timed repeat of a result; a speedup over ``serial_s`` (the pooled serial seconds
        of a time window, ``pooled_serial``) where given, so that plans differ by their pipeline seconds only."""
        if self.speedup and serial_s:
            return [serial_s / p for p in result.pipeline_s if p > 0]
        return list(result.speedups) if self.speedup else list(result.throughputs)

    def of(self, result: TrialResult, serial_s: float | None = None) -> float:
        """The result's figure: the median over its repeats (a speedup over ``serial_s`` where given)."""
        if self.speedup and serial_s:
            return statistics.median(self.repeats(result, serial_s))
        return result.speedup if self.speedup else result.throughput

    def spread(self, result: TrialResult) -> tuple[float, float]:
        return result.speedup_spread if self.speedup else result.throughput_spread

    def predicted(self, speedup: float, step_s: float) -> float:
        """A plan's predicted figure from its predicted speedup and step (makespan) seconds."""
        if self.speedup:
            return speedup
        return self.batch / step_s if step_s > 0 else 0.0


WINDOW = 3
"""Measured trials before a trial whose serial runs are pooled with its own (``pooled_serial``)."""


def pooled_serial(own: Sequence[float], earlier: Sequence[Sequence[float]], window: int = WINDOW) -> float | None:
    """The median serial seconds of a trial's own repeats and those of the ``window`` measured trials before it:
    a search trial's speedup divides this by its pipeline seconds, so that two plans compare by their own
    pipeline seconds and one slow serial repeat does not crown a plan (None: no serial run to pool)."""
    samples = [*own, *(x for runs in list(earlier)[-window:] if window > 0 for x in runs)]
    return statistics.median(samples) if samples else None
