r"""What every Laplace approximation here shares: the likelihood, the marginal likelihood and
its prior precision, the linearised predictive and the draws.

For parameters :math:`\theta` of a trained network (a last layer, or any subnetwork) with the
prior :math:`\mathcal N(0, \delta^{-1} I)` and the trained values :math:`\hat\theta` as the
MAP, the approximation is :math:`\mathcal N(\hat\theta, (H/T + \delta I)^{-1})` with :math:`H`
the GGN of the likelihood, and

.. math:: \log p(\mathcal D \mid \delta) \approx \log p(\mathcal D \mid \hat\theta)
          - \tfrac12\big(\log\det(H/T + \delta I) - P\log\delta + \delta\lVert\hat\theta
          \rVert^2\big).
"""

from __future__ import annotations

import math

import torch

from pyro_flat import validation
from pyro_flat.infer.laplace.curvature import Curvature

__all__ = ["LaplaceApproximation", "LIKELIHOODS", "check_module"]

#: The likelihoods: a softmax over the outputs, or a Gaussian of fixed scale around them.
LIKELIHOODS = ("classification", "regression")


def check_module(name: str, value: object) -> torch.nn.Module:
    """``value`` if it is a ``torch.nn.Module``, else a ``ValueError`` naming ``name``."""
    if not isinstance(value, torch.nn.Module):
        raise ValueError(f"{name} must be a torch.nn.Module (the trained network), got "
                         f"{type(value).__name__}")
    return value


class LaplaceApproximation:
    """The shared part of :class:`~.last_layer.LastLayerLaplace` and
    :class:`~.subnetwork.SubnetworkLaplace`; they give :attr:`map_parameters`,
    ``fit`` (which sets ``curvature``, ``log_likelihood`` and ``num_data``),
    :meth:`functional` and ``_outputs_of`` (the outputs at draws of the parameters)."""

    def __init__(self, likelihood: str, sigma_noise: float, prior_precision: float,
                 temperature: float):
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be 'classification' or 'regression', got "
                             f"{likelihood!r}")
        self.likelihood = likelihood
        self.sigma_noise = validation.positive("sigma_noise", sigma_noise)
        self.prior_precision = validation.positive("prior_precision", prior_precision)
        self.temperature = validation.positive("temperature", temperature)
        self.curvature: Curvature | None = None

    @property
    def map_parameters(self) -> torch.Tensor:
        r""":math:`\hat\theta`, flat, float64."""
        raise NotImplementedError

    def functional(self, x: torch.Tensor, batch_size: int = 1024
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The linearised predictive of the outputs at ``x``: the mean ``(M, C)`` (the
        trained network's outputs) and the covariance :math:`J\Sigma J^\top` ``(M, C, C)``."""
        raise NotImplementedError

    def _outputs_of(self, x: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
        """The network's outputs at ``x`` with its approximated parameters at each draw of
        ``thetas`` ``(S, P)``: ``(S, M, C)``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the likelihood

    def output_hessians(self, outputs: torch.Tensor) -> torch.Tensor:
        r""":math:`\Lambda_n / T` (and :math:`/\sigma^2` for regression)."""
        if self.likelihood == "classification":
            p = outputs.softmax(-1)
            lam = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
        else:
            eye = torch.eye(outputs.shape[-1], dtype=outputs.dtype, device=outputs.device)
            lam = eye.expand(len(outputs), -1, -1) / self.sigma_noise**2
        return lam / self.temperature

    def log_likelihood_at(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        r""":math:`\log p(y \mid \hat\theta) / T` of the outputs at the trained values."""
        if self.likelihood == "classification":
            log_lik = -torch.nn.functional.cross_entropy(outputs, y.long(), reduction="sum")
        else:
            target = y.double().reshape(outputs.shape)
            log_lik = (-0.5 * (target - outputs).square().sum() / self.sigma_noise**2
                       - outputs.numel() * math.log(self.sigma_noise * math.sqrt(2 * math.pi)))
        return float(log_lik) / self.temperature

    # ------------------------------------------------------------------ the evidence

    def fitted_curvature(self) -> Curvature:
        """The curvature ``fit(x, y)`` computed (``RuntimeError`` before it)."""
        if self.curvature is None:
            raise RuntimeError("call fit(x, y) first")
        return self.curvature

    def log_det_precision(self, prior_precision: float | None = None) -> float:
        r""":math:`\log\det(H/T + \delta I)`, the curvature view of flatness: the
        log-volume by which the data shrink the prior around the trained values (larger is
        sharper)."""
        delta = self.prior_precision if prior_precision is None else prior_precision
        return float(self.fitted_curvature().log_det(delta))

    def log_marginal_likelihood(self, prior_precision: float | None = None) -> float:
        r"""The Laplace approximation of :math:`\log p(\mathcal D \mid \delta)` (module
        docstring), at ``prior_precision`` (default the current one)."""
        curvature = self.fitted_curvature()
        delta = self.prior_precision if prior_precision is None else prior_precision
        theta = self.map_parameters
        log_det_ratio = self.log_det_precision(delta) - curvature.num_parameters * math.log(
            delta)
        return self.log_likelihood - 0.5 * (log_det_ratio + delta * float(theta @ theta))

    def optimize_prior_precision(self, bounds: tuple[float, float] = (1e-6, 1e6)) -> float:
        r"""Set :math:`\delta` to the maximiser of :meth:`log_marginal_likelihood` over
        ``bounds`` (on a log grid, then SciPy's bounded scalar search) and return it."""
        from scipy.optimize import minimize_scalar

        lo, hi = math.log(bounds[0]), math.log(bounds[1])
        grid = torch.linspace(lo, hi, 41).tolist()
        values = [self.log_marginal_likelihood(math.exp(t)) for t in grid]
        best = max(range(len(grid)), key=values.__getitem__)
        a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
        found = minimize_scalar(lambda t: -self.log_marginal_likelihood(math.exp(t)),
                                bounds=(a, b), method="bounded", options={"xatol": 1e-8})
        self.prior_precision = math.exp(float(found.x))
        return self.prior_precision

    # ------------------------------------------------------------------ predictions

    def predictive(self, x: torch.Tensor, link: str = "probit", num_samples: int = 100,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        r"""Class probabilities at ``x`` (classification): ``"probit"``, the linearised
        predictive with the probit approximation :math:`\mathrm{softmax}(f /
        \sqrt{1 + \pi\,\mathrm{diag}(J\Sigma J^\top)/8})`; ``"mc"``, the mean softmax over
        ``num_samples`` draws of the parameters (the network's own predictive, not
        linearised). Regression: the mean and the variance of the outputs (linearised; add
        ``sigma_noise ** 2`` for the targets')."""
        mean, cov = self.functional(x)
        if self.likelihood == "regression":
            return torch.stack([mean, cov.diagonal(dim1=-2, dim2=-1)], dim=-1)
        if link == "probit":
            kappa = 1.0 / torch.sqrt(1.0 + math.pi / 8.0 * cov.diagonal(dim1=-2, dim2=-1))
            return (kappa * mean).softmax(-1)
        if link != "mc":
            raise ValueError(f"link must be 'probit' or 'mc', got {link!r}")
        return self._outputs_of(x, self.sample(num_samples, generator)).softmax(-1).mean(0)

    def sample(self, num_samples: int, generator: torch.Generator | None = None
               ) -> torch.Tensor:
        r"""Draws :math:`\hat\theta + \Sigma^{1/2}\varepsilon` of the approximated
        parameters, ``(num_samples, P)`` (float64)."""
        curvature = self.fitted_curvature()
        theta = self.map_parameters
        noise = torch.randn(num_samples, curvature.num_parameters, generator=generator,
                            dtype=torch.float64).to(theta.device)
        return theta + curvature.scale_noise(noise, self.prior_precision)
