r"""The potential a chain moves on, on its flat position: one place that evaluates it.

.. math:: \hat U(z) = U_{\text{model}}(z, \text{batch}) + \tfrac12 (z - m)^\top P (z - m)

The model's part comes from a potential callable (:class:`~.potential.ModelPotential`, its
vectorised or data-parallel wrappers, or a user's ``potential_fn``); the closed-form Normal
prior (:class:`~.flat_prior.FlatNormalPrior`) is added on the flat vector, here and nowhere
else, both on the hot path (:meth:`Target.value_and_grad`, the gradient into one flat buffer)
and where a differentiable value is needed (:meth:`Target.value`, e.g. warmup's curvature).
A kernel's ``compile=`` may install a compiled potential of the whole of :math:`\hat U`
(:attr:`Target.compiled`, :mod:`.compiled`), which the hot path then evaluates instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from pyro_flat.target.flat_prior import FlatNormalPrior
from pyro_flat.target.layout import FlatLayout
from pyro_flat.target.tracing import DataPlate

__all__ = ["Potential", "Target", "as_scalar_energy"]


class Potential(Protocol):
    """What :class:`Target` evaluates: ``U(params, batch)`` of the sites' unconstrained values
    (one energy per chain for vectorised chains), and the sites whose closed-form prior it
    leaves to the target (``flat_prior``, ``None`` for none; it may change between calls, as
    a data-parallel rank's does)."""

    flat_prior: FlatNormalPrior | None

    def __call__(self, params: dict[str, torch.Tensor], batch: torch.Tensor | None
                 ) -> torch.Tensor: ...


def as_scalar_energy(u: torch.Tensor) -> torch.Tensor:
    """``u`` as a 0-d tensor, or a ``ValueError`` saying that a potential must be one number."""
    if u.numel() != 1:
        raise ValueError(
            f"the potential must be a scalar (one number, U of all parameters), got a tensor "
            f"of shape {tuple(u.shape)}; sum the terms of a potential_fn before returning them"
        )
    return u.reshape(())


class Target:
    r"""The potential :math:`\hat U` of a chain's flat position (``(d,)``, or ``(K, d)`` for
    ``K`` vectorised chains), with its gradient.

    Parameters
    ----------
    potential : Potential
        The model's part, called with per-site views of the position.
    layout : FlatLayout
        Where each site lives in the position.
    plate : DataPlate, optional
        The plate subsampled at every step (``None``: full batch, or a ``potential_fn``).
    reduce : callable, optional
        ``reduce(u, grad) -> u`` after each evaluation on the hot path, e.g. a data-parallel
        chain's sum over ranks (which adds the other ranks' gradients into ``grad`` in place).
    num_data : int, optional
        ``N``, the number of data points the likelihood sums over, where the model says it
        (:attr:`TracedModel.num_data <pyro_flat.target.TracedModel.num_data>`); ``None``:
        unknown (a ``potential_fn``, or observed sites in no plate).

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.target import FlatLayout
    >>> layout = FlatLayout.from_shapes({"w": torch.Size([2])})
    >>> class Quadratic:
    ...     flat_prior = None
    ...     def __call__(self, params, batch):
    ...         return 0.5 * params["w"].square().sum()
    >>> target = Target(Quadratic(), layout)
    >>> z = torch.tensor([1.0, -2.0])
    >>> target.bind(z)
    >>> u, grad = target.value_and_grad(z, None)
    >>> float(u), grad.tolist()
    (2.5, [1.0, -2.0])
    """

    def __init__(self, potential: Potential, layout: FlatLayout, plate: DataPlate | None = None,
                 reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 num_data: int | None = None):
        self.potential = potential
        self.layout = layout
        self.plate = plate
        self.num_data = int(plate.size) if plate is not None else num_data
        self.reduce = reduce
        self._position: torch.Tensor | None = None
        #: The compiled potential the hot path evaluates instead of ``potential`` (set by a
        #: kernel's ``compile=``; :class:`~pyro_flat.target.compiled.CompiledPotential`), or
        #: ``None``.
        self.compiled: Callable[[torch.Tensor, torch.Tensor | None],
                                tuple[torch.Tensor, torch.Tensor]] | None = None

    def bind(self, position: torch.Tensor) -> None:
        """Evaluate at ``position`` (updated in place by the chain) from now on: the sites
        become views of it that autograd differentiates, and the gradient has a buffer of the
        same shape."""
        self._position = position
        lead = position.shape[:-1]
        self._leaves = [position[..., s.offset : s.stop].view((*lead, *s.shape)).detach()
                        .requires_grad_() for s in self.layout.sites]
        self._params = {s.name: leaf for s, leaf in zip(self.layout.sites, self._leaves,
                                                         strict=True)}
        self._grad = torch.empty_like(position)

    @property
    def position(self) -> torch.Tensor | None:
        """The position given to :meth:`bind` (``None`` before)."""
        return self._position

    @property
    def grad_buffer(self) -> torch.Tensor:
        """The flat buffer :meth:`value_and_grad` writes the gradient into (shaped like the
        bound position)."""
        return self._grad

    @property
    def flat_prior(self) -> FlatNormalPrior | None:
        """The closed-form prior added on the flat vector (after the last evaluation)."""
        return self.potential.flat_prior

    def site_views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The sites as views of a flat tensor shaped like the position."""
        lead = flat.shape[:-1]
        return {s.name: flat[..., s.offset : s.stop].view((*lead, *s.shape))
                for s in self.layout.sites}

    def value_and_grad(self, position: torch.Tensor, batch: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, grad U)`` at the bound position (one energy and one gradient row per chain);
        the gradient is the target's buffer, overwritten by the next call."""
        if position is not self._position:
            raise ValueError("Target.value_and_grad evaluates at the position given to bind()")
        if self.compiled is not None:  # the closed-form prior included
            u, grad = self.compiled(position, batch)
            self._grad.copy_(grad)
            return u, self._grad
        chains = position.shape[:-1]
        leaves = self._leaves
        with torch.enable_grad():
            u = torch.as_tensor(self.potential(self._params, batch))
            if u.dim() and not chains:
                u = as_scalar_energy(u)
            total = u.sum() if chains else u
            if u.requires_grad:
                grads = torch.autograd.grad(total, leaves, allow_unused=True)
            else:
                grads = [None] * len(leaves)
        if any(g is None for g in grads):
            grads = [torch.zeros_like(x) if g is None else g
                     for g, x in zip(grads, leaves, strict=True)]
        torch.cat([g.reshape(*chains, -1) for g in grads], dim=-1, out=self._grad)
        u = u.detach()
        flat_prior = self.potential.flat_prior
        if flat_prior is not None:
            u = u + flat_prior.value_and_grad_(position, self._grad)
        if self.reduce is not None:
            u = self.reduce(u, self._grad)
        return u, self._grad

    def value(self, params: dict[str, torch.Tensor], batch: torch.Tensor | None
              ) -> torch.Tensor:
        r""":math:`\hat U` of ``params`` (per-site unconstrained values, with a leading chain
        dimension for vectorised chains) on ``batch``, differentiable (twice): the chains'
        energies summed, since they are independent. The prior's constant is left out."""
        lead = self._position.shape[:-1] if self._position is not None else ()
        u = torch.as_tensor(self.potential(params, batch))
        if u.dim():
            u = u.sum() if lead else as_scalar_energy(u)
        flat_prior = self.potential.flat_prior
        if flat_prior is not None:
            z = torch.cat([params[s.name].reshape(*lead, -1) for s in self.layout.sites],
                          dim=-1)
            d = z - flat_prior.loc
            u = u + 0.5 * (d * flat_prior.precision * d).sum()
        return u
