r"""Constant Normal priors summed in closed form on the flat parameter vector.

A BNN's prior is usually an isotropic Normal on every weight, built once (``PyroSample`` with a
distribution object). For such sites

.. math:: -\log p(\theta) = \tfrac12 \sum_j p_j (\theta_j - m_j)^2 + c,
    \qquad \nabla = p \odot (\theta - m),

with precisions :math:`p_j = 1/\sigma_j^2`, so the prior and its gradient take two vectorised
operations on the kernel's flat vector instead of a ``log_prob`` and its backward per site.
A site qualifies when, in the setup trace, its prior is a Normal (or an ``Independent`` Normal)
with parameters that do not require grad, its transform is the identity and it is neither scaled
nor masked. At every evaluation the model's messenger checks that the site still receives the
*same distribution object*; a site whose prior object changes is handed back to the model run
(:meth:`FlatNormalPrior.drop`).
"""

from __future__ import annotations

from typing import Any

import torch

from pyro_flat.target.layout import FlatLayout
from pyro_flat.target.normal import HALF_LOG_2PI, normal_parts


def _constant_normal_parts(fn: Any, value: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(loc, scale)`` of a closed-form Normal (:func:`.normal.normal_parts`) whose
    parameters do not require grad, else None."""
    parts = normal_parts(fn, value)
    if parts is None or parts[0].requires_grad or parts[1].requires_grad:
        return None
    return parts


class FlatNormalPrior:
    """The closed-form Normal prior of some sites of a :class:`FlatLayout`."""

    def __init__(self, layout: FlatLayout, fns: dict[str, Any], like: torch.Tensor):
        self.layout = layout
        self.fns = dict(fns)
        self.precision = torch.zeros(layout.size, dtype=like.dtype, device=like.device)
        self.loc = torch.zeros_like(self.precision)
        self._log_norm = {}
        sites = {s.name: s for s in layout.sites}
        for name, fn in self.fns.items():
            site = sites[name]
            loc, scale = _constant_normal_parts(fn, torch.empty(site.shape))
            sl = slice(site.offset, site.stop)
            self.precision[sl] = scale.expand(site.shape).reshape(-1).pow(-2)
            self.loc[sl] = loc.expand(site.shape).reshape(-1)
            self._log_norm[name] = float(
                scale.log().expand(site.shape).sum() + site.numel * HALF_LOG_2PI
            )
        self._buffer = torch.empty_like(self.precision)
        self._const = sum(self._log_norm.values())
        self._summarise()

    def _summarise(self) -> None:
        """Note the common cases: no site centred away from 0, one precision for every entry."""
        self._centered = bool((self.loc != 0).any())
        p0 = self.precision[:1]
        uniform = self.precision.numel() > 0 and bool((self.precision == p0).all()) and p0 > 0
        self._uniform = float(p0) if uniform else None

    @classmethod
    def from_trace(cls, layout: FlatLayout, trace_sites: dict[str, dict]) -> FlatNormalPrior | None:
        """Pick the qualifying sites from the setup trace; None when there are none."""
        fns = {}
        for site in layout.sites:
            msg = trace_sites[site.name]
            if site.transform is not None or msg["mask"] is not None:
                continue
            if not (isinstance(msg["scale"], float) and msg["scale"] == 1.0):
                continue
            if _constant_normal_parts(msg["fn"], msg["value"]) is not None:
                fns[site.name] = msg["fn"]
        if not fns:
            return None
        like = trace_sites[next(iter(fns))]["value"]
        return cls(layout, fns, like)

    def value_and_grad_(self, z: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Add the prior's gradient of ``U`` to ``grad`` in place; return the prior's ``U``
        (one per row for vectorised chains, ``z`` of shape ``(K, d)``: each row exactly as a
        single chain's)."""
        if z.dim() > 1:
            return torch.stack([self.value_and_grad_(row, g) for row, g in zip(z, grad,
                                                                                strict=True)])
        if self._uniform is not None and not self._centered:  # the usual isotropic BNN prior
            grad.add_(z, alpha=self._uniform)
            return 0.5 * self._uniform * torch.dot(z, z) + self._const
        if self._centered:
            torch.sub(z, self.loc, out=self._buffer)
            d = self._buffer.clone()
            self._buffer.mul_(self.precision)
        else:
            d = z
            torch.mul(z, self.precision, out=self._buffer)
        grad.add_(self._buffer)
        return 0.5 * torch.dot(self._buffer, d) + self._const

    def log_density(self, z: torch.Tensor) -> torch.Tensor:
        """The prior's log-density of these sites at the flat vector ``z``, differentiable
        (for the variational fits of :class:`~pyro_flat.infer.LeanELBO`)."""
        if self._uniform is not None and not self._centered:
            return -(0.5 * self._uniform * torch.dot(z, z) + self._const)
        d = z - self.loc if self._centered else z
        return -(0.5 * torch.dot(d * self.precision, d) + self._const)

    def drop(self, names: list[str]) -> None:
        """Hand ``names`` back to the model run: their prior object is no longer the one traced."""
        sites = {s.name: s for s in self.layout.sites}
        for name in names:
            if self.fns.pop(name, None) is not None:
                site = sites[name]
                self.precision[site.offset : site.stop] = 0.0
                self.loc[site.offset : site.stop] = 0.0
                self._const -= self._log_norm.pop(name)
        self._summarise()
