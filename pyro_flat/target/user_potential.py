"""A user's ``potential_fn`` as a target's potential: the kernels' ``potential_fn=`` route, for
a potential written by hand instead of a Pyro model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["UserPotential", "per_chain_shapes"]


class UserPotential:
    """Adapts a user's ``potential_fn(params) -> U`` to the kernels' ``(params, batch)`` call
    (with ``num_chains``, a batched ``potential_fn`` that returns one energy per chain)."""

    #: A user's potential holds its whole prior.
    flat_prior = None

    def __init__(self, potential_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                 num_chains: int | None = None):
        self.potential_fn = potential_fn
        self.num_chains = num_chains

    def __call__(self, params: dict[str, torch.Tensor], batch: Any = None) -> torch.Tensor:
        u = self.potential_fn(params)
        if self.num_chains is not None and torch.as_tensor(u).shape != (self.num_chains,):
            raise ValueError(
                f"vectorized_chains={self.num_chains}: the potential_fn must return one energy "
                f"per chain, shape ({self.num_chains},), got {tuple(torch.as_tensor(u).shape)}")
        return u


def per_chain_shapes(shapes: dict[str, torch.Size], k: int) -> dict[str, torch.Size]:
    """Site shapes without the leading chain dimension of a vectorised ``potential_fn``."""
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 0 or shape[0] != k:
            raise ValueError(f"vectorized_chains={k}: every site needs a leading dimension of "
                             f"size {k} (one row per chain), site {name!r} has shape "
                             f"{tuple(shape)}")
        out[name] = shape[1:]
    return out
