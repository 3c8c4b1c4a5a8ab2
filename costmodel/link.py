"""Fit point-to-point transfer time to latency + bytes / bandwidth (pure least squares)."""

from __future__ import annotations

from collections.abc import Sequence

from costmodel.types import Link


def fit_link(samples: Sequence[tuple[int, float]], backend: str = "gloo") -> Link:
    """Least-squares line through (bytes, seconds); latency and bandwidth kept physical (>= 0, > 0)."""
    if len(samples) < 2:
        raise ValueError(f"need at least 2 (bytes, seconds) samples to fit a link, got {len(samples)}")
    xs = [float(b) for b, _ in samples]
    ys = [float(t) for _, t in samples]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        slope = max(my / mx, 1e-15) if mx > 0 else 1e-15
    intercept = max(0.0, my - slope * mx)
    return Link(latency_s=intercept, bandwidth_Bps=1.0 / slope, backend=backend,
                samples=tuple((int(b), float(t)) for b, t in samples))
