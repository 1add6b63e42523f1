r"""Last-layer Laplace approximation of a trained network: the post-hoc Gaussian baseline.

The network's last ``nn.Linear`` becomes Bayesian, everything before it stays at its trained
values. With the prior :math:`\theta \sim \mathcal N(0, \delta^{-1} I)` on the last layer's
parameters and the trained values as the MAP :math:`\hat\theta`,

.. math:: p(\theta \mid \mathcal D) \approx \mathcal N\big(\hat\theta,\;
          (H/T + \delta I)^{-1}\big),

:math:`H` the GGN of the likelihood (:mod:`.curvature`), and the prior precision :math:`\delta`
chosen by the Laplace approximation of the marginal likelihood

.. math:: \log p(\mathcal D \mid \delta) \approx \log p(\mathcal D \mid \hat\theta)
          - \tfrac12\big(\log\det(H/T + \delta I) - P\log\delta + \delta\lVert\hat\theta
          \rVert^2\big).

The backbone's features are computed once per training point and kept (``N x H`` numbers):
the curvature needs nothing else.

References
----------
MacKay, D. (1992). A practical Bayesian framework for backpropagation networks. Neural
Computation. Daxberger, E. et al. (2021). Laplace Redux: effortless Bayesian deep learning.
NeurIPS (``laplace-torch``, whose conventions this follows).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import nn

from pyro_flat.infer.laplace.base import LaplaceApproximation, check_module
from pyro_flat.infer.laplace.curvature import STRUCTURES

__all__ = ["LastLayerLaplace", "last_linear"]


def last_linear(net: nn.Module) -> tuple[str, nn.Linear]:
    """The name and module of the last ``nn.Linear`` of ``net`` (in registration order)."""
    found = [(name, m) for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not found:
        raise ValueError(f"the network has no nn.Linear layer to make Bayesian: {net!r}"[:300])
    return found[-1]


class LastLayerLaplace(LaplaceApproximation):
    r"""A Laplace approximation of the last linear layer of a trained ``net``.

    Target: :math:`\mathcal N(\hat\theta, (H/T + \delta I)^{-1})` over the last layer's
    ``(weight, bias)``, the rest of the network fixed.

    Parameters
    ----------
    net : nn.Module
        The trained network; its output must be its last ``nn.Linear``'s output (logits, or
        the regression mean). It is copied (and the copy put in evaluation mode), so that
        later changes to ``net`` (e.g. ``make_bayesian(net)``, which works in place) leave the
        approximation as fitted.
    likelihood : {"classification", "regression"}
        Softmax over the outputs, or a Gaussian of scale ``sigma_noise`` around them.
    structure : {"kron", "diag", "full"}
        The GGN's structure (:mod:`.curvature`).
    sigma_noise : float
        The regression noise scale (positive; ignored for classification).
    prior_precision : float
        :math:`\delta` until :meth:`optimize_prior_precision` chooses one.
    temperature : float
        :math:`T`, dividing the likelihood (1: the Bayesian posterior).

    Examples
    --------
    >>> import torch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    >>> la = LastLayerLaplace(net, "classification", "kron").fit(x, y)
    >>> delta = la.optimize_prior_precision()
    >>> la.predictive(x[:2]).shape  # probit-approximated class probabilities
    torch.Size([2, 3])
    """

    def __init__(self, net: nn.Module, likelihood: str = "classification",
                 structure: str = "kron", sigma_noise: float = 1.0,
                 prior_precision: float = 1.0, temperature: float = 1.0):
        super().__init__(likelihood, sigma_noise, prior_precision, temperature)
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {sorted(STRUCTURES)}, got {structure!r}")
        # a copy: make_bayesian(net) converts the network in place, after which its parameters
        # would be prior draws
        self.net = copy.deepcopy(check_module("net", net)).eval()
        self.structure = structure
        self.layer_name, self.layer = last_linear(self.net)
        if self.layer.bias is None:
            raise ValueError(f"the last linear layer {self.layer_name!r} has no bias; "
                             "LastLayerLaplace needs one")

    # ------------------------------------------------------------------ features

    def features(self, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """The last layer's inputs at ``x`` (the backbone's features), without gradients,
        in chunks of ``batch_size`` rows: ``(M, H)``."""
        out: list[torch.Tensor] = []
        hook = self.layer.register_forward_hook(lambda m, inp, o: out.append(inp[0].detach()))
        try:
            with torch.no_grad():
                for chunk in x.split(batch_size):
                    self.net(chunk)
        finally:
            hook.remove()
        return torch.cat([f.reshape(len(f), -1) for f in out])

    @property
    def map_parameters(self) -> torch.Tensor:
        r""":math:`\hat\theta`: the last layer's weight (row by row), then its bias."""
        return torch.cat([self.layer.weight.detach().reshape(-1),
                          self.layer.bias.detach()]).double()

    def _outputs(self, features: torch.Tensor) -> torch.Tensor:
        w, b = self.layer.weight.detach().double(), self.layer.bias.detach().double()
        return features @ w.T + b

    # ------------------------------------------------------------------ fit

    def fit(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024
            ) -> LastLayerLaplace:
        """The features of the training inputs ``x`` (once), the curvature, and the
        log-likelihood of the targets ``y`` at the trained network."""
        if len(x) != len(y):
            raise ValueError(f"x and y must hold the same number of points, got {len(x)} and "
                             f"{len(y)}")
        features = self.features(x, batch_size).double()
        outputs = self._outputs(features)
        self.log_likelihood = self.log_likelihood_at(outputs, y)
        self.num_data = len(x)
        self.curvature = STRUCTURES[self.structure](features, self.output_hessians(outputs))
        return self

    def functional(self, x: torch.Tensor, batch_size: int = 1024
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The linearised predictive of the outputs at ``x``: the mean ``(M, C)`` (the
        trained network's outputs) and the covariance :math:`J\Sigma J^\top` ``(M, C, C)``."""
        curvature = self.fitted_curvature()
        features = self.features(x, batch_size).double()
        return (self._outputs(features),
                curvature.output_covariance(features, self.prior_precision))

    def _outputs_of(self, x: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
        c = self.layer.out_features  # the features once, for every draw
        weights = thetas[:, :-c].reshape(len(thetas), c, -1)
        return self.features(x).double() @ weights.transpose(1, 2) + thetas[:, None, -c:]

    def sample_named(self, num_samples: int, generator: torch.Generator | None = None
                     ) -> dict[str, torch.Tensor]:
        """Draws of the last layer's weight and bias by their names in the network
        (``(num_samples, *shape)``, their dtype), as :class:`~.subnetwork.SubnetworkLaplace`'s
        ``sample_named``."""
        weights, biases = zip(*self.sample_layer(num_samples, generator), strict=True)
        prefix = self.layer_name + "." if self.layer_name else ""
        return {prefix + "weight": torch.stack(weights), prefix + "bias": torch.stack(biases)}

    def sample_layer(self, num_samples: int, generator: torch.Generator | None = None
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Draws as ``(weight, bias)`` in the layer's shapes and dtype."""
        c, dtype = self.layer.out_features, self.layer.weight.dtype
        for theta in self.sample(num_samples, generator):
            yield (theta[:-c].reshape(self.layer.weight.shape).to(dtype),
                   theta[-c:].to(dtype))
