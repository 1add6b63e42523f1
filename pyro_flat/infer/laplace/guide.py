r"""A Laplace approximation as a Pyro guide: the trained network's parameters at their values,
its last layer drawn from the Laplace posterior, for ``Predictive``, ``guide_draws`` and
``to_arviz`` like any fitted guide."""

from __future__ import annotations

from typing import Any

import pyro
import pyro.distributions as dist
import torch

from pyro_flat.infer.laplace.last_layer import LastLayerLaplace

__all__ = ["LaplaceGuide"]


class LaplaceGuide:
    r"""The guide of a Bayesian copy of the network that ``laplace`` was fitted on.

    Target: :math:`q = \mathcal N(\hat\theta, \Sigma)` over the last layer's sites, a point mass
    at the trained value on every other parameter's site. The draw of the last layer is
    :math:`\hat\theta + \Sigma^{1/2}\varepsilon` with :math:`\varepsilon` an auxiliary standard
    normal site (``_LaplaceGuide_noise``), so its structure (Kronecker, diagonal or full) is
    never formed densely.

    Parameters
    ----------
    laplace : LastLayerLaplace
        Fitted (:meth:`~LastLayerLaplace.fit`), its prior precision chosen.
    prefix : str
        How the model names the network's sites: ``prefix + parameter name``; ``"net."`` for
        :class:`~pyro_flat.models.bnn.BNN` (``BNN(make_bayesian(net), ...)``).

    Examples
    --------
    >>> import torch
    >>> from pyro.infer import Predictive
    >>> from pyro_flat.models.bnn import BNN
    >>> from pyro_flat.models.likelihoods import Categorical
    >>> from pyro_flat.models.nn import make_bayesian
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    >>> guide = LaplaceGuide(LastLayerLaplace(net, "classification").fit(x, y))
    >>> model = BNN(make_bayesian(net), Categorical())
    >>> Predictive(model, guide=guide, num_samples=5)(x)["obs"].shape
    torch.Size([5, 64])

    References
    ----------
    Daxberger, E. et al. (2021). Laplace Redux: effortless Bayesian deep learning. NeurIPS.
    """

    def __init__(self, laplace: LastLayerLaplace, prefix: str = "net."):
        if laplace.curvature is None:
            raise ValueError("laplace must be fitted: call laplace.fit(x, y) first")
        self.laplace, self.prefix = laplace, prefix
        layer = laplace.layer_name + "." if laplace.layer_name else ""
        self._weight, self._bias = prefix + layer + "weight", prefix + layer + "bias"
        self._fixed = {prefix + name: p.detach().clone()
                       for name, p in laplace.net.named_parameters()
                       if prefix + name not in (self._weight, self._bias)}

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        la = self.laplace
        num = la.curvature.num_parameters
        noise = pyro.sample("_LaplaceGuide_noise",
                            dist.Normal(torch.zeros(num, dtype=torch.float64), 1.0).to_event(1),
                            infer={"is_auxiliary": True})
        theta = la.map_parameters + la.curvature.scale_noise(noise.unsqueeze(0),
                                                             la.prior_precision)[0]
        c, layer = la.layer.out_features, la.layer
        values = dict(self._fixed)
        values[self._weight] = theta[:-c].reshape(layer.weight.shape).to(layer.weight.dtype)
        values[self._bias] = theta[-c:].to(layer.bias.dtype)
        return {name: pyro.sample(name, dist.Delta(v, event_dim=v.dim()))
                for name, v in values.items()}
