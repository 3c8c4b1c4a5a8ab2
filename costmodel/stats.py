"""Agreement between predictions and measurements: MAPE and Kendall's tau (pure)."""

from __future__ import annotations

from collections.abc import Sequence


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error of ``predicted`` against ``measured``, in percent."""
    pairs = [(p, m) for p, m in zip(predicted, measured) if m]
    if not pairs:
        raise ValueError("no measured values to compare against")
    return 100.0 * sum(abs(p - m) / abs(m) for p, m in pairs) / len(pairs)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b: +1 when both orderings agree on every pair, -1 when they disagree on every pair."""
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(f"need two sequences of equal length >= 2 (got {len(a)} and {len(b)})")
    concordant = discordant = ties_a = ties_b = 0
    for i in range(n):
        for j in range(i + 1, n):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    denom = ((concordant + discordant + ties_a) * (concordant + discordant + ties_b)) ** 0.5
    return (concordant - discordant) / denom if denom else 0.0
