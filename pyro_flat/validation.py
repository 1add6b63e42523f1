"""Argument checks shared by every kernel, loss and tool: one clear ``ValueError`` per bad input."""

from __future__ import annotations

import math
import os
from numbers import Integral, Real
from pathlib import Path
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


def flag(name: str, value: Any) -> bool:
    """Return ``value`` if it is ``True`` or ``False``, else raise ``ValueError`` (a string such
    as ``"no"`` would otherwise count as true)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def names(name: str, value: Any, what: str = "site names") -> list[str]:
    """Return ``value`` as a list of strings if it is a sequence of them (not one string)."""
    if isinstance(value, str):
        raise ValueError(f"{name} must be a list of {what}, got the string {value!r}")
    try:
        out = list(value)
    except TypeError:
        raise ValueError(f"{name} must be a list of {what}, got {value!r}") from None
    wrong = [v for v in out if not isinstance(v, str)]
    if wrong:
        raise ValueError(f"{name} must be a list of {what}, got {wrong[0]!r} in it")
    return out


def directory_path(name: str, value: Any) -> Path:
    """Return ``value`` as a :class:`~pathlib.Path` if it is a non-empty ``str`` or path."""
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ValueError(f"{name} must be a directory path (str or os.PathLike), got {value!r}")
    return Path(value)


def mcmc_kernel(name: str, value: Any) -> Any:
    """Return ``value`` if it is a :class:`pyro.infer.mcmc.mcmc_kernel.MCMCKernel`."""
    from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

    if not isinstance(value, MCMCKernel):
        raise ValueError(f"{name} must be a pyro MCMCKernel (e.g. pyro_flat.infer.SGLD(model) "
                         f"or pyro.infer.NUTS(model)), got {type(value).__name__}")
    return value


def optional_callable(name: str, value: Any, signature: str) -> Any:
    """Return ``value`` if it is ``None`` or callable (as ``signature`` says), else raise."""
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be callable as {signature}, got {value!r}")
    return value
