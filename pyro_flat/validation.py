"""Argument checks shared by every kernel, loss and tool: one clear ``ValueError`` per bad input."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a real number, got {value!r}") from None
    return float(value)


def positive(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is finite and > 0, else raise ``ValueError``."""
    x = _as_float(name, value)
    if not (math.isfinite(x) and x > 0.0):
        raise ValueError(f"{name} must be a finite number in (0, inf), got {value!r}")
    return x


def nonnegative(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is finite and >= 0, else raise ``ValueError``."""
    x = _as_float(name, value)
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be a finite number in [0, inf), got {value!r}")
    return x


def in_range(name: str, value: Any, low: float, high: float, *, closed: str = "[]") -> float:
    """Return ``value`` as a float if it lies in the interval ``low``..``high``.

    ``closed`` is a two-character string, each ``[`` / ``]`` (closed) or ``(`` / ``)`` (open).
    """
    x = _as_float(name, value)
    lo_ok = x >= low if closed[0] == "[" else x > low
    hi_ok = x <= high if closed[1] == "]" else x < high
    if not (math.isfinite(x) and lo_ok and hi_ok):
        raise ValueError(
            f"{name} must be a number in {closed[0]}{low}, {high}{closed[1]}, got {value!r}"
        )
    return x


def integer_at_least(name: str, value: Any, low: int) -> int:
    """Return ``value`` as an int if it is an integer >= ``low``, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)
