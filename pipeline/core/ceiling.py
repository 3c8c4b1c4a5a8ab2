"""The flag a speedup above the machine's ceiling carries wherever it is printed: one wording, one rule."""

from __future__ import annotations

__all__ = ["above_ceiling"]


def above_ceiling(value: object, ceiling: object) -> str:
    """``above the 2.00x ceiling: noise`` where ``value`` (a speedup) passes ``ceiling`` (cores / threads per
    stage: the most this machine can give), else ``""``: such a figure is a slow serial repeat, not speed."""
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (value, ceiling))
    if not numbers or not ceiling or value <= ceiling:  # type: ignore[operator]
        return ""
    return f"above the {ceiling:.2f}x ceiling: noise"
