r"""The regression predictive of ``pyro-flat compare``: a Gaussian mixture over the draws.

Every draw :math:`s` of a regression network predicts :math:`\mathcal N(m_s(x), s_s(x)^2)`
(:func:`pyro_flat.compare.task.gaussian_head`); the Bayesian model average is the mixture

.. math:: p(y \mid x) = \sum_s w_s\, \mathcal N\big(y;\, m_s(x), s_s(x)^2\big),

with equal weights :math:`w_s = 1/S`, or a fit's importance weights (ContourSGLD). Its density,
distribution function, moments, quantiles and continuous ranked probability score are exact
(no sampling): :class:`GaussianMixture`. From its distribution function at the observed
:math:`y` (the probability integral transform, PIT) come the coverage of central intervals
(:func:`central_coverage`) and the calibration error (:func:`calibration_error`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: The nominal levels of the central intervals of :func:`calibration_error`.
CALIBRATION_LEVELS = tuple(i / 10 for i in range(1, 10))


def _normal_pdf(z: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * z.square()) / math.sqrt(2 * math.pi)


def _normal_cdf(z: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.erfc(-z / math.sqrt(2))


def _crps_kernel(mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    r""":math:`A(\mu, \sigma^2) = \mathbb E|X|` for :math:`X \sim \mathcal N(\mu, \sigma^2)`:
    :math:`2\sigma\varphi(\mu/\sigma) + \mu(2\Phi(\mu/\sigma) - 1)`."""
    sd = var.sqrt()
    z = mu / sd
    return 2 * sd * _normal_pdf(z) + mu * (2 * _normal_cdf(z) - 1)


@dataclass
class GaussianMixture:
    """Per data point, the mixture ``sum_s weights[s] N(loc[s], scale[s]^2)`` (float64).

    Attributes
    ----------
    loc, scale : torch.Tensor
        ``(num_draws, num_data)`` means and standard deviations (``> 0``) of the components.
    weights : torch.Tensor
        ``(num_draws,)`` non-negative component weights summing to one.
    """

    loc: torch.Tensor
    scale: torch.Tensor
    weights: torch.Tensor

    def __post_init__(self) -> None:
        self.loc, self.scale = self.loc.double(), self.scale.double()
        self.weights = self.weights.double().to(self.loc.device)
        if self.loc.dim() != 2 or self.loc.shape != self.scale.shape:
            raise ValueError(f"loc and scale must both be (num_draws, num_data), got "
                             f"{tuple(self.loc.shape)} and {tuple(self.scale.shape)}")
        if self.weights.shape != self.loc.shape[:1]:
            raise ValueError(f"weights must hold one weight per draw, ({self.loc.shape[0]},), "
                             f"got {tuple(self.weights.shape)}")
        if not bool((self.scale > 0).all()):
            raise ValueError("every component scale must be positive")

    @classmethod
    def equal(cls, loc: torch.Tensor, scale: torch.Tensor,
              weights: torch.Tensor | None = None) -> GaussianMixture:
        """The mixture of the components with ``weights``, equal weights by default."""
        if weights is None:
            weights = torch.full(loc.shape[:1], 1.0 / loc.shape[0], dtype=torch.float64)
        return cls(loc, scale, weights)

    @property
    def _w(self) -> torch.Tensor:
        return self.weights[:, None]

    def mean(self) -> torch.Tensor:
        """``(num_data,)`` means ``sum_s w_s m_s``."""
        return (self._w * self.loc).sum(0)

    def sd(self) -> torch.Tensor:
        """``(num_data,)`` standard deviations, by the law of total variance."""
        mean = self.mean()
        var = (self._w * (self.scale.square() + (self.loc - mean).square())).sum(0)
        return var.sqrt()

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``(num_data,)`` log densities at ``y`` (a log-sum-exp over the components)."""
        y = y.double()
        z = (y - self.loc) / self.scale
        log_normal = -0.5 * z.square() - self.scale.log() - 0.5 * math.log(2 * math.pi)
        return torch.logsumexp(self._w.log() + log_normal, 0)

    def cdf(self, y: torch.Tensor) -> torch.Tensor:
        """``(num_data,)`` distribution functions at ``y``: the PIT values of observed ``y``."""
        return (self._w * _normal_cdf((y.double() - self.loc) / self.scale)).sum(0)

    def crps(self, y: torch.Tensor) -> torch.Tensor:
        r"""``(num_data,)`` continuous ranked probability scores at ``y``, in closed form
        (Grimit et al. 2006):

        .. math:: \mathrm{CRPS} = \sum_i w_i A(y - \mu_i, \sigma_i^2) - \tfrac12 \sum_{i,j}
            w_i w_j A(\mu_i - \mu_j, \sigma_i^2 + \sigma_j^2),

        :math:`A(\mu, \sigma^2) = 2\sigma\varphi(\mu/\sigma) + \mu(2\Phi(\mu/\sigma) - 1)`
        the mean of :math:`|X|`, :math:`X \sim \mathcal N(\mu, \sigma^2)`.
        """
        var = self.scale.square()
        first = (self._w * _crps_kernel(y.double() - self.loc, var)).sum(0)
        pair_w = self.weights[:, None, None] * self.weights[None, :, None]
        pairs = _crps_kernel(self.loc[:, None] - self.loc[None], var[:, None] + var[None])
        return first - 0.5 * (pair_w * pairs).sum((0, 1))

    def sample(self, num: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``(num, num_data)`` draws: a component by its weight for each draw and point, then
        its normal noise."""
        component = torch.multinomial(self.weights.cpu(), num * self.loc.shape[1],
                                      replacement=True, generator=generator)
        component = component.reshape(num, -1).to(self.loc.device)
        loc, scale = self.loc.gather(0, component), self.scale.gather(0, component)
        noise = torch.randn(loc.shape, generator=generator, dtype=torch.float64)
        return loc + scale * noise.to(loc.device)

    def quantile(self, q: float, iterations: int = 100) -> torch.Tensor:
        """``(num_data,)`` ``q``-quantiles, ``0 < q < 1``, by bisection on :meth:`cdf`."""
        if not 0 < q < 1:
            raise ValueError(f"q must lie in (0, 1), got {q!r}")
        reach = 10 * self.scale
        low, high = (self.loc - reach).min(0).values, (self.loc + reach).max(0).values
        for _ in range(iterations):
            mid = 0.5 * (low + high)
            below = self.cdf(mid) < q
            low, high = torch.where(below, mid, low), torch.where(below, high, mid)
        return 0.5 * (low + high)


def central_coverage(pit: torch.Tensor, levels: Sequence[float]) -> torch.Tensor:
    """For each level ``p``, the share of points inside their central ``p`` interval, i.e.
    with ``|u - 1/2| <= p/2`` for the PIT value ``u``."""
    p = torch.as_tensor(levels, dtype=torch.float64)
    inside = (pit.double()[None] - 0.5).abs() <= p[:, None] / 2
    return inside.double().mean(1)


def calibration_error(pit: torch.Tensor,
                      levels: Sequence[float] = CALIBRATION_LEVELS) -> float:
    r"""The mean over ``levels`` of :math:`|\hat c(p) - p|`, :math:`\hat c(p)` the share of
    points inside their central ``p`` interval (:func:`central_coverage`): 0 for a calibrated
    predictive up to sampling noise, larger for intervals too narrow or too wide.

    Examples
    --------
    >>> calibration_error(torch.full((10,), 0.5))  # always at the median: intervals too wide
    0.5
    """
    p = torch.as_tensor(levels, dtype=torch.float64)
    return float((central_coverage(pit, levels) - p).abs().mean())
