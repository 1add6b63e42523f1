r"""Update rules on flat parameter tensors, shared by the kernels. All updates are in place.

``noise`` is a preallocated buffer the size of the parameters; each rule refills it with one
``normal_()`` call, so a step allocates nothing. ``generator`` (default: torch's global one)
lets a kernel draw the noise of a second set of variables from a stream of its own. The rules
are elementwise, so they apply unchanged to the ``(K, d)`` parameters of vectorised chains.
``metric``
(a fixed diagonal inverse mass :math:`P`, see :mod:`pyro_flat.infer.mcmc.adaptation`) runs the
rule in the coordinates :math:`\phi = P^{-1/2}\theta`, where the metric is the identity;
``None`` is the identity itself, and the arithmetic is then exactly the unpreconditioned one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pyro_flat.infer.mcmc.adaptation import DiagonalMetric


def langevin_step_(
    theta: torch.Tensor,
    grad: torch.Tensor,
    step_size: float,
    temperature: float,
    noise: torch.Tensor,
    generator: torch.Generator | None = None,
    metric: DiagonalMetric | None = None,
) -> None:
    r"""Overdamped Langevin (SGLD) step :math:`\theta \leftarrow \theta - \epsilon P \nabla U +
    \sqrt{2 \epsilon T}\,P^{1/2}\xi`, :math:`\xi \sim \mathcal{N}(0, I)` (:math:`P = I`
    without a ``metric``).

    Welling & Teh (2011), "Bayesian learning via stochastic gradient Langevin dynamics".
    With ``temperature = 0`` it is a gradient-descent step and draws no noise.
    """
    if metric is None:
        theta.add_(grad, alpha=-step_size)
    else:
        theta.addcmul_(grad, metric.inverse_mass, value=-step_size)
    if temperature > 0:
        noise.normal_(generator=generator)
        if metric is not None:
            noise.mul_(metric.scale)
        theta.add_(noise, alpha=math.sqrt(2.0 * step_size * temperature))


def underdamped_step_(
    theta: torch.Tensor,
    momentum: torch.Tensor,
    grad: torch.Tensor,
    step_size: float,
    friction: float,
    mass: float,
    temperature: float,
    noise: torch.Tensor,
    noise_estimate: float = 0.0,
    generator: torch.Generator | None = None,
    draw_noise: bool = True,
    metric: DiagonalMetric | None = None,
) -> None:
    r"""SGHMC step of Chen, Fox & Guestrin (2014), Eq. (13), Euler-discretised:

    .. math::

        r &\leftarrow r - \epsilon \nabla U(\theta) - \epsilon C M^{-1} r
              + \mathcal{N}\big(0,\ 2 (C - \hat B)\,\epsilon T\big) \\
        \theta &\leftarrow \theta + \epsilon M^{-1} r

    with friction :math:`C`, scalar mass :math:`M` and gradient-noise estimate :math:`\hat B`.
    The stationary law is :math:`\exp(-U(\theta)/T)\,\mathcal{N}(r; 0, M T)`.
    With ``draw_noise=False`` ``noise`` already holds the standard-normal draw to use. With a
    ``metric`` :math:`P` the momentum lives in the coordinates :math:`P^{-1/2}\theta`: its
    gradient is :math:`P^{1/2}\nabla U` and :math:`\theta` moves by
    :math:`\epsilon M^{-1} P^{1/2} r` (the mass matrix is :math:`M P^{-1}`).
    """
    momentum.mul_(1.0 - step_size * friction / mass)
    if metric is None:
        momentum.add_(grad, alpha=-step_size)
    else:
        momentum.addcmul_(grad, metric.scale, value=-step_size)
    variance = 2.0 * (friction - noise_estimate) * step_size * temperature
    if variance > 0:
        if draw_noise:
            noise.normal_(generator=generator)
        momentum.add_(noise, alpha=math.sqrt(variance))
    if metric is None:
        theta.add_(momentum, alpha=step_size / mass)
    else:
        theta.addcmul_(momentum, metric.scale, value=step_size / mass)
