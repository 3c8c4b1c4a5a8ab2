"""Typed reads of hand-editable JSON: a wrong type is one line naming the field, the value and the type.

Plan files are written by pipesplit but also by hand and by other tools; ``int("two")`` deep inside a
constructor is a traceback, ``read(d, "chunks", int)`` is "chunks 'two' must be an integer".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pipeline.core.errors import PipesplitError

__all__ = ["int_list", "read"]

T = TypeVar("T")
_NAMES = {int: "an integer", str: "a string", dict: "a JSON object", list: "a list", float: "a number", bool: "true or false"}
_MISSING = object()


def _is(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def read(d: Mapping[str, Any], key: str, kind: type[T], default: Any = _MISSING, *, where: str = "",
          optional: bool = False) -> T:
    """``d[key]`` if it is of ``kind`` (``default`` when absent; None allowed when ``optional``)."""
    name = f"{where}{key}"
    if key not in d:
        if default is _MISSING:
            raise PipesplitError(f"{name} is missing: the plan needs it ({_NAMES.get(kind, kind.__name__)})")
        return default  # type: ignore[no-any-return]
    value = d[key]
    if optional and value is None:
        return None  # type: ignore[return-value]
    if not _is(value, kind):
        raise PipesplitError(f"{name} {value!r} must be {_NAMES.get(kind, kind.__name__)}"
                             + (" or null" if optional else ""))
    return value  # type: ignore[no-any-return]


def int_list(value: Any, name: str) -> tuple[int, ...]:
    """``value`` as a tuple of integers, from a JSON list."""
    if not isinstance(value, (list, tuple)) or not all(_is(v, int) for v in value):
        raise PipesplitError(f"{name} {value!r} must be a list of integers, e.g. [3, 224, 224]")
    return tuple(int(v) for v in value)
