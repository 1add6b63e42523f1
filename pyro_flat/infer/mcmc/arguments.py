"""Checks of a kernel's arguments and of the model arguments a run is given, with errors that
name the argument and what is accepted."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_finite_arguments", "check_initial_params", "check_schedule", "device_of",
           "has_chain_rows"]


def check_initial_params(params: Any) -> Any:
    """``initial_params`` must map site names to values (tensors or what torch makes one of)."""
    if params is not None and not (isinstance(params, Mapping)
                                   and all(isinstance(k, str) for k in params)):
        raise ValueError("initial_params must be a dict of site name -> initial value (in the "
                         f"unconstrained space), got {params!r}")
    return params


def has_chain_rows(value: Any, num_chains: int) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == num_chains


def check_schedule(schedule: Any) -> None:
    """A step-size schedule must be a callable of one argument, the SG step index."""
    if not callable(schedule):
        raise ValueError(
            f"step_size_schedule must be a callable of the step index, got {schedule!r}"
        )
    try:
        inspect.signature(schedule).bind(0)
    except TypeError:
        raise TypeError(
            "step_size_schedule must take one argument, the SG step index t = 0, 1, ..., and "
            f"return the step size; {schedule!r} cannot be called as step_size_schedule(t)"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): trust it
        pass


def check_finite_arguments(args: tuple, kwargs: dict) -> None:
    """Raise ``ValueError`` naming the first model argument that holds a NaN or an infinity."""
    named = [(f"model argument {i} (positional)", a) for i, a in enumerate(args)]
    named += [(f"model argument {k!r}", a) for k, a in kwargs.items()]
    for name, a in named:
        if torch.is_tensor(a) and a.is_floating_point() and not bool(torch.isfinite(a).all()):
            bad = int((~torch.isfinite(a)).sum())
            raise ValueError(
                f"{name} holds {bad} non-finite value(s) (NaN or inf); the potential would be "
                "non-finite at every step. Remove or impute them before mcmc.run(...)"
            )


def device_of(args: tuple, kwargs: dict) -> torch.device:
    for a in (*args, *kwargs.values()):
        if torch.is_tensor(a):
            return a.device
    return torch.device("cpu")
