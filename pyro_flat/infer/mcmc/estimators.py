r"""Gradient estimators: what an SG-MCMC step moves with, apart from how it moves.

An update rule (:mod:`~pyro_flat.infer.mcmc.integrators`) takes a gradient; an estimator says
which gradient, the way BlackJAX keeps ``gradients.py`` apart from ``diffusions.py``. Each
estimator is called once per SG step with the kernel's minibatch and returns an
:class:`Estimate`: the minibatch potential :math:`\hat U(\theta)` and its gradient at the
chain's position (which the per-draw statistics ``lp`` and ``grad_norm`` report for every
kernel) and the gradient the update uses.

* :class:`MinibatchGradient`: :math:`\nabla\hat U(\theta)` itself (SGLD, SGHMC, ...).
* :class:`SharpnessAwareGradient`: :math:`\nabla\hat U(\theta + e)` at the ascent point
  :math:`e` of :func:`pyro_flat.optim.ascent.ascent_perturbation` (SAM's; SASGLD), a second pass on
  the same minibatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pyro_flat.models.batchnorm import kept_running_stats
from pyro_flat.optim.ascent import ASAM_OFFSET, asam_metric, ascent_direction

#: ``evaluate(batch) -> (U, grad U)`` at the current contents of the position, the gradient in
#: a flat buffer that the next evaluation overwrites.
Evaluate = Callable[[torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Estimate:
    """One SG step's evaluation of the potential. An update reads it and never writes to it:
    a rule that changes the gradient it moves with (a multiplier, a coupling force) writes the
    result into a buffer of its own state (``init="scratch"``), since ``grad`` is the
    target's gradient buffer.

    Attributes
    ----------
    energy : torch.Tensor
        :math:`\\hat U(\\theta)`, detached (the statistic ``lp`` is its negative).
    grad : torch.Tensor
        :math:`\\nabla\\hat U(\\theta)`, flat (its norm is the statistic ``grad_norm``).
    step_grad : torch.Tensor
        The gradient the update moves with (``grad`` itself for a plain estimator). An
        estimator that needs a second pass returns the second pass as ``energy`` and ``grad``
        when it is not finite, so that a step is finite exactly when ``energy`` and the norm
        of ``grad`` are.
    stats : dict
        The estimator's own per-step statistics, one value per chain (e.g. ``sharpness``),
        as tensors on the chains' device.
    """

    energy: torch.Tensor
    grad: torch.Tensor
    step_grad: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


class MinibatchGradient:
    r"""The plain minibatch gradient :math:`\nabla\hat U(\theta)`: one pass per step."""

    stat_names: tuple[str, ...] = ()

    def __call__(self, position: torch.Tensor, evaluate: Evaluate,
                 batch: torch.Tensor | None) -> Estimate:
        u, grad = evaluate(batch)
        return Estimate(u, grad, grad)


class SharpnessAwareGradient:
    r"""The gradient at the ascent point of a ball of radius :math:`\rho`, on one minibatch.

    .. math:: g = \nabla\hat U(\theta), \qquad e = \rho\,\frac{D g}{\sqrt{g^\top D g}},
        \qquad \text{step gradient} = \nabla\hat U(\theta + e)

    with :math:`D = I` (the Euclidean ball, SAM's) or :math:`D = (|\theta| + \eta)^2` with
    ``geometry=True`` (ASAM's ellipsoid, :math:`\eta` = :data:`pyro_flat.optim.ascent.ASAM_OFFSET`);
    see :func:`pyro_flat.optim.ascent.ascent_perturbation`. A zero gradient gives
    :math:`e = 0` (its second pass is at :math:`\theta`); ``rho = 0`` runs none. The running
    statistics of ``batchnorm_modules`` are kept through the second pass, so they move once per
    step, as under the plain gradient. The per-step statistic ``sharpness`` is
    :math:`\hat U(\theta + e) - \hat U(\theta)`. Two passes per step.

    Parameters
    ----------
    rho : float
        :math:`\rho \ge 0`.
    geometry : bool
        The geometry-aware ellipsoid instead of the Euclidean ball.
    batchnorm_modules : sequence of torch.nn.Module
        BatchNorm modules whose running statistics the second pass must not move.

    References
    ----------
    Foret, P., Kleiner, A., Mobahi, H. & Neyshabur, B. (2021). Sharpness-aware minimization for
    efficiently improving generalization. ICLR.
    """

    stat_names: tuple[str, ...] = ("sharpness",)

    def __init__(self, rho: float, geometry: bool = False,
                 batchnorm_modules: Sequence[nn.Module] = ()):
        self.rho = rho
        self.geometry = geometry
        self.batchnorm_modules = list(batchnorm_modules)
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _work_buffers(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._buffers is None or self._buffers[0].shape != like.shape:
            self._buffers = (torch.empty_like(like), torch.empty_like(like), torch.empty_like(like))
        return self._buffers

    def __call__(self, position: torch.Tensor, evaluate: Evaluate,
                 batch: torch.Tensor | None) -> Estimate:
        """The estimate at ``position``, ``(K, d)`` (a single chain is one row): each row's
        ascent step as a single chain's, with one second pass for all rows (at
        :math:`\theta` for rows that take none). Nothing is read back to the host: the rows
        that take no ascent step are chosen on the device, and ``sharpness`` is a tensor."""
        u, g = evaluate(batch)
        k = position.shape[0]
        if self.rho == 0.0:
            return Estimate(u, g, g, {"sharpness": torch.zeros_like(u)})
        grad_at_theta, e, theta = self._work_buffers(position)
        grad_at_theta.copy_(g)
        took = torch.empty(k, dtype=torch.bool, device=u.device)
        finite = torch.isfinite(u)
        for c in range(k):
            e_c, grad_c = e[c], grad_at_theta[c]
            metric = (asam_metric([position[c]], ASAM_OFFSET, out=[e_c]) if self.geometry
                      else None)
            dg, norm = ascent_direction([grad_c], metric, [e_c], [0])
            if dg[0] is not e_c:
                e_c.copy_(dg[0])
            # rho / n in float64, rounded once, as ascent_perturbation's Python float
            scale = (self.rho / norm.double()).to(e_c.dtype)
            took[c] = finite[c] & (norm > 0) & torch.isfinite(norm)
            # a zero or non-finite gradient, or a non-finite potential: no ascent step
            e_c.mul_(scale).masked_fill_(~took[c], 0.0)
        u_e, g_e = self._perturbed_pass(position, e, theta, evaluate, batch)
        # a row whose second pass is not finite reports it: its sites are the culprits
        second_finite = (torch.isfinite(u_e) & torch.isfinite(g_e).all(-1)) | ~took
        energy = torch.where(second_finite, u, u_e)
        grad = torch.where(second_finite.unsqueeze(-1), grad_at_theta, g_e)
        step_grad = torch.where(took.unsqueeze(-1), g_e, grad_at_theta)
        sharpness = torch.where(took, u_e - u, torch.where(finite, 0.0, math.nan))
        return Estimate(energy, grad, step_grad, {"sharpness": sharpness})

    def _perturbed_pass(self, position: torch.Tensor, e: torch.Tensor, theta: torch.Tensor,
                        evaluate: Evaluate, batch: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, grad U)`` at ``position + e``, BatchNorm statistics kept, ``position`` restored
        exactly (from the copy ``theta``, not as ``theta + e - e``)."""
        theta.copy_(position)
        try:
            with kept_running_stats(self.batchnorm_modules):
                position.add_(e)
                return evaluate(batch)
        finally:
            position.copy_(theta)
