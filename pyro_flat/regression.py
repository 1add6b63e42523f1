"""Regression analysis from posterior-predictive draws: summaries, scores and calibration.

Everything here takes draws of the observed variable, ``(num_draws, num_data)``: for instance
the ``posterior_predictive`` group that :func:`pyro_flat.to_arviz` exports by default, or
:class:`pyro.infer.Predictive` run on MCMC draws or a guide. Scores are means over the data
points, lower is better for the errors, and each says which library computes it.

Examples
--------
>>> import torch
>>> from pyro_flat import regression
>>> y = torch.zeros(100)
>>> draws = torch.randn(4000, 100, generator=torch.Generator().manual_seed(0))
>>> summary = regression.predictive_summary(draws, level=0.9)
>>> round(regression.interval_coverage(summary.lower, summary.upper, y), 1)
1.0
>>> round(regression.crps(draws, y), 2)  # a N(0, 1) forecast of 0: (sqrt(2) - 1) / sqrt(pi)
0.23

References
----------
Gneiting, T. & Raftery, A. E. (2007). Strictly proper scoring rules, prediction, and
estimation. JASA 102(477). Kuleshov, V., Fenner, N. & Ermon, S. (2018). Accurate uncertainties
for deep learning using calibrated regression. ICML.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pyro_flat import validation

__all__ = [
    "RegressionSummary",
    "calibration_curve",
    "crps",
    "crps_gaussian",
    "gaussian_nll",
    "interval_coverage",
    "predictive_summary",
    "rmse",
]


@dataclass
class RegressionSummary:
    """Per-point predictive mean, standard deviation and central interval."""

    mean: torch.Tensor
    sd: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    level: float


def _as_draws(draws: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    draws = torch.as_tensor(draws)
    if draws.dim() != 2 or draws.shape[0] < 2 or draws.shape[1] < 1:
        raise ValueError(f"draws must have shape (num_draws >= 2, num_data >= 1), got "
                         f"{tuple(draws.shape)}")
    if y is not None and tuple(torch.as_tensor(y).shape) != (draws.shape[1],):
        raise ValueError(f"y must hold one value per data point, shape ({draws.shape[1]},), got "
                         f"{tuple(torch.as_tensor(y).shape)}")
    if not bool(torch.isfinite(draws).all()):
        raise ValueError("draws hold NaN or inf (e.g. from diverging draws): drop them first")
    return draws.double()


def _same_length(name: str, value: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    value = torch.as_tensor(value).double()
    if value.shape != y.shape:
        raise ValueError(f"{name} must have the shape of y, {tuple(y.shape)}, got "
                         f"{tuple(value.shape)}")
    return value


def _targets(y: torch.Tensor) -> torch.Tensor:
    y = torch.as_tensor(y).double()
    if y.dim() != 1 or len(y) == 0:
        raise ValueError(f"y must be a non-empty vector, got shape {tuple(y.shape)}")
    return y


def predictive_summary(draws: torch.Tensor, *, level: float = 0.9) -> RegressionSummary:
    """Mean, standard deviation and the equal-tailed ``level`` interval of each point.

    Parameters
    ----------
    draws : torch.Tensor
        ``(num_draws, num_data)`` posterior-predictive draws of the observed variable.
    level : float
        Mass of the central interval, in ``(0, 1)``; its ends are the ``(1 - level) / 2`` and
        ``(1 + level) / 2`` quantiles of the draws (linear interpolation, as ``torch.quantile``).
    """
    level = validation.in_range("level", level, 0.0, 1.0, closed="()")
    x = _as_draws(draws)
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=x.dtype)
    lower, upper = torch.quantile(x, q, dim=0)
    return RegressionSummary(x.mean(0), x.std(0), lower, upper, level)


def rmse(mean: torch.Tensor, y: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean (scikit-learn's ``mean_squared_error``)."""
    from sklearn.metrics import mean_squared_error

    y = _targets(y)
    mean = _same_length("mean", mean, y)
    return math.sqrt(mean_squared_error(y.numpy(), mean.numpy()))


def gaussian_nll(mean: torch.Tensor, sd: torch.Tensor, y: torch.Tensor) -> float:
    """Mean negative log density of ``y`` under ``N(mean, sd^2)`` per point, in nats.

    The usual regression NLL of a predictive summarised by its first two moments
    (``torch.distributions.Normal``); ``sd`` must be positive.
    """
    y = _targets(y)
    mean, sd = _same_length("mean", mean, y), _same_length("sd", sd, y)
    if not bool((sd > 0).all()):
        raise ValueError("sd must be positive at every point")
    return float(-torch.distributions.Normal(mean, sd).log_prob(y).mean())


def crps_gaussian(mean: torch.Tensor, sd: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean continuous ranked probability score of ``N(mean, sd^2)`` forecasts (closed form).

    .. math:: \mathrm{CRPS} = \sigma\big[z(2\Phi(z) - 1) + 2\varphi(z) - 1/\sqrt\pi\big],
        \qquad z = (y - \mu)/\sigma
    """
    y = _targets(y)
    mean, sd = _same_length("mean", mean, y), _same_length("sd", sd, y)
    if not bool((sd > 0).all()):
        raise ValueError("sd must be positive at every point")
    z = (y - mean) / sd
    normal = torch.distributions.Normal(torch.zeros((), dtype=z.dtype), 1.0)
    phi, cdf = normal.log_prob(z).exp(), normal.cdf(z)
    return float((sd * (z * (2 * cdf - 1) + 2 * phi - 1 / math.sqrt(math.pi))).mean())


def crps(draws: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean continuous ranked probability score of the empirical predictive of the draws.

    .. math:: \mathrm{CRPS}(F, y) = \mathbb E|X - y| - \tfrac12 \mathbb E|X - X'|,
        \qquad X, X' \sim F \text{ independent}

    with :math:`F` the empirical distribution of the draws of each point; the second term is
    computed from the sorted draws in :math:`O(S \log S)` (the identity
    :math:`\sum_{i<j} |x_{(j)} - x_{(i)}| = \sum_k (2k - S - 1)\, x_{(k)}`).
    """
    x = _as_draws(draws, y)
    y = _targets(y)
    s = x.shape[0]
    first = (x - y).abs().mean(0)
    ranks = torch.arange(1, s + 1, dtype=x.dtype).unsqueeze(1)
    spread = ((2 * ranks - s - 1) * x.sort(0).values).sum(0) * 2 / s**2
    return float((first - 0.5 * spread).mean())


def interval_coverage(lower: torch.Tensor, upper: torch.Tensor, y: torch.Tensor) -> float:
    """Share of the points whose ``y`` lies in ``[lower, upper]``."""
    y = _targets(y)
    lower, upper = _same_length("lower", lower, y), _same_length("upper", upper, y)
    return float(((y >= lower) & (y <= upper)).double().mean())


def calibration_curve(
    draws: torch.Tensor, y: torch.Tensor, levels: Sequence[float] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected against observed coverage of central predictive intervals.

    For each level ``p``, the share of points whose ``y`` lies in the equal-tailed ``p``
    interval of its draws; a calibrated predictive follows the diagonal (Kuleshov et al. 2018
    use the one-sided quantiles; central intervals read the same way and show both tails).

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        The levels and the observed coverages.
    """
    levels = torch.linspace(0.05, 0.95, 19, dtype=torch.float64) if levels is None else \
        torch.as_tensor([validation.in_range("levels", p, 0.0, 1.0, closed="()")
                         for p in levels], dtype=torch.float64)
    x = _as_draws(draws, y)
    y = _targets(y)
    q = torch.cat([(1 - levels) / 2, (1 + levels) / 2])
    bounds = torch.quantile(x, q, dim=0)  # (2 L, N)
    lower, upper = bounds[: len(levels)], bounds[len(levels):]
    observed = ((y >= lower) & (y <= upper)).double().mean(1)
    return levels, observed
