"""Plans re-measured side by side: interleaved rounds on one pool, so a drifting machine slows all alike.

The machine drifts by 10-20 % over tens of minutes; measuring plan A for five minutes and then plan B
would compare two machines. Every round runs each plan once, in order, and the figures are pooled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline.core.plan import SplitPlan
from pipeline.core.result import TrialResult
from pipeline.ranks.pooling import Pool

__all__ = ["Interleaved", "interleaved"]


@dataclass(frozen=True, kw_only=True)
class Interleaved:
    """Each plan's results over the rounds (failed runs left out) and the reason of its first failure."""

    results: tuple[tuple[TrialResult, ...], ...]
    failures: dict[int, str] = field(default_factory=dict)
    round_of: tuple[tuple[int, ...], ...] = ()
    """The round each of ``results[i]`` was measured in (a failed run leaves its round out)."""

    def speedups(self, i: int) -> list[float]:
        return [s for r in self.results[i] for s in r.speedups]

    def throughputs(self, i: int) -> list[float]:
        return [s for r in self.results[i] for s in r.throughputs]

    def last(self, i: int) -> TrialResult | None:
        return self.results[i][-1] if self.results[i] else None


def interleaved(pool: Pool, plans: Sequence[SplitPlan], rounds: int, *, repeats: int, serial_all: bool = False,
                timeout_s: float = 900.0, drop_failed: bool = False, serial: bool = True,
                tick: Callable[[int, TrialResult | None], None] | None = None) -> Interleaved:
    """Run every plan once per round, ``rounds`` times; ``drop_failed`` stops running a plan that failed.

    ``warmup=0``: the output check runs each freshly built pipeline once first, which warms it up; the
    serial model is timed beside every repeat, so each speedup cancels the machine's drift (``serial=False``:
    none, for a model that does not fit one device; throughput is then the figure).
    ``tick(i, result)`` is called after each step (``None`` for a skipped plan), for a progress bar.
    """
    out: list[list[TrialResult]] = [[] for _ in plans]
    where: list[list[int]] = [[] for _ in plans]
    failures: dict[int, str] = {}
    for r in range(rounds):
        for i, plan in enumerate(plans):
            if drop_failed and i in failures:
                if tick:
                    tick(i, None)
                continue
            res = pool.run(plan, repeats=repeats, warmup=0, timeout_s=timeout_s, serial=serial,
                           serial_all=serial and serial_all)
            if res.ok:
                out[i].append(res)
                where[i].append(r)
            else:
                failures.setdefault(i, res.reason)
            if tick:
                tick(i, res)
    return Interleaved(results=tuple(tuple(r) for r in out), failures=failures,
                       round_of=tuple(tuple(w) for w in where))
