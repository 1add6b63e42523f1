r"""Warmup that chooses the step size (and, optionally, a diagonal metric) of an SG-MCMC kernel.

When a kernel is built without ``step_size`` (and without ``step_size_schedule``), warmup
estimates the largest curvature of the minibatch potential by power iteration on
Hessian-vector products and sets

.. math:: \epsilon = f \cdot \epsilon_{\max}(\lambda_{\max}),

a fraction :math:`f` (``stability_fraction``) of the step at which the kernel's update stops
being stable on a quadratic of that curvature (:math:`2/\lambda` for a Langevin step; each
kernel states its own limit in ``stability_limit``). The estimate is repeated at the warmup
draws :data:`ESTIMATE_AT` (fractions of the warmup), so it follows the chain from its start
into the typical set; the last quarter of warmup runs with the final values.

With ``preconditioner="diag"`` the kernel also learns a diagonal metric :math:`P` (an inverse
mass) from the second moments :math:`v = \mathrm{E}[\hat g^2]` of the minibatch gradients:
:math:`P = 1/v`. At stationarity :math:`\mathrm{E}[\nabla U \nabla U^\top] =
T\,\mathrm{E}[\nabla^2 U]`, so :math:`1/v` approximates the inverse of the diagonal curvature
(plus the minibatch noise, which damps the noisiest coordinates). The second estimate builds
:math:`P` from the first quarter of warmup; the later ones from the steps after it (the start's
transient left out). The curvature is then that of :math:`P^{1/2} H P^{1/2}`. :math:`P` is
**frozen** with the last estimate: after warmup the sampler is the preconditioned one for a
fixed metric, :math:`\theta \leftarrow \theta - \epsilon P \nabla\hat U +
\sqrt{2\epsilon T} P^{1/2}\xi`, which leaves :math:`\pi_T` invariant without the correction
term :math:`\Gamma(\theta)` a metric that moves with :math:`\theta` would need (Li et al.
2016).

Examples
--------
>>> import torch, pyro, pyro.distributions as dist
>>> pyro.set_rng_seed(0)
>>> from pyro.infer import MCMC
>>> from pyro_flat.infer import SGLD
>>> def model(x, y):
...     w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
...     with pyro.plate("data", len(x), subsample_size=50) as i:
...         pyro.sample("y", dist.Normal(x[i] @ w, 0.5), obs=y[i])
>>> x = torch.randn(500, 2) * torch.tensor([10.0, 0.1]); y = x @ torch.tensor([1.0, -1.0])
>>> kernel = SGLD(model, preconditioner="diag")  # no step_size: warmup chooses it
>>> mcmc = MCMC(kernel, num_samples=100, warmup_steps=100, disable_progbar=True)
>>> mcmc.run(x, y)
>>> record = mcmc.diagnostics()["step_size_adaptation"]["chain 0"][-1]
>>> sorted(record)
['curvature', 'draw', 'noise_limited', 'num_sg_steps', 'stability_limit', 'step_size']
>>> bool(record["step_size"] <= 0.2 * record["stability_limit"])  # less where the noise is large
True
>>> noise = mcmc.diagnostics()["gradient_noise"]["chain 0"]
>>> bool(noise["temperature_excess"] <= 0.1)
True

References
----------
Li, C., Chen, C., Carlson, D. & Carin, L. (2016). Preconditioned stochastic gradient Langevin
dynamics for deep neural networks. AAAI.
Roberts, G. O. & Tweedie, R. L. (1996). Exponential convergence of Langevin distributions and
their discrete approximations. Bernoulli (the step-size limit of the Langevin discretisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: The warmup draws (as fractions of ``warmup_steps``) at which the curvature is estimated.
ESTIMATE_AT = (0.0, 0.25, 0.5, 0.75)
#: From this fraction of warmup on, a Langevin step also keeps the minibatch gradient noise
#: small beside the injected noise (:mod:`pyro_flat.infer.mcmc.gradient_noise`); before it,
#: while the chain travels from its start to the typical set, only stability counts (a
#: kernel's ``noise_fit_from``: kernels with a ``noise_fit``, the underdamped ones, correct
#: the noise from the start).
NOISE_FROM = 0.5
#: Power iterations per estimate (:func:`pyro_flat.evaluation.flatness.hessian_top_eigenvalue`), at
#: most; they stop early once the estimate changes by less than :data:`POWER_TOLERANCE` (relative).
POWER_ITERATIONS = 30
#: The relative change of the estimate below which the power iterations stop.
POWER_TOLERANCE = 1e-3
#: A coordinate's gradient second moment is raised to at least this fraction of their median,
#: so that a coordinate whose gradient stayed near zero does not get an unbounded step.
MOMENT_FLOOR = 1e-4
PRECONDITIONERS = (None, "diag")


@dataclass
class DiagonalMetric:
    r"""A fixed diagonal inverse mass :math:`P`, kept with its square root for the noise."""

    inverse_mass: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def from_moments(cls, second_moment: torch.Tensor) -> DiagonalMetric:
        """:math:`P = 1/\\max(v, 10^{-4}\\,\\mathrm{median}(v))`, normalised to mean 1 (row by row
        for vectorised chains, ``v`` of shape ``(K, d)``)."""
        if second_moment.dim() > 1:
            rows = [cls.from_moments(v) for v in second_moment]
            return cls(torch.stack([r.inverse_mass for r in rows]),
                       torch.stack([r.scale for r in rows]))
        floor = MOMENT_FLOOR * float(second_moment.median())
        v = second_moment.clamp(min=floor if floor > 0 else torch.finfo(second_moment.dtype).tiny)
        inverse_mass = v.reciprocal()
        inverse_mass /= inverse_mass.mean()
        return cls(inverse_mass, inverse_mass.sqrt())


def langevin_limit(curvature: float) -> float:
    r"""The largest stable step :math:`2/\lambda` of :math:`\theta \leftarrow \theta -
    \epsilon\lambda\theta` (the Langevin step on a quadratic)."""
    return 2.0 / curvature


def underdamped_limit(curvature: float, friction: float, mass: float) -> float:
    r"""The largest stable step of the SGHMC update on a quadratic of curvature :math:`\lambda`.

    With :math:`k = \lambda/M`, :math:`c = C/M`, the update's characteristic polynomial
    :math:`\mu^2 - (2 - \epsilon c - \epsilon^2 k)\mu + (1 - \epsilon c)` has its roots in the
    unit disc iff :math:`\epsilon c \le 1` (the check of the kernels) and
    :math:`k\epsilon^2 + 2c\epsilon < 4`, i.e. :math:`\epsilon < (\sqrt{c^2 + 4k} - c)/k`.
    """
    k, c = curvature / mass, friction / mass
    return min((math.sqrt(c * c + 4.0 * k) - c) / k, 1.0 / c)


def estimate_points(warmup_steps: int) -> list[int]:
    """The warmup draws at which the curvature is estimated (:data:`ESTIMATE_AT`)."""
    return sorted({int(f * warmup_steps) for f in ESTIMATE_AT})
