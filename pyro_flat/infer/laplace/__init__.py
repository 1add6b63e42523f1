"""Post-hoc Laplace approximations of trained networks: the last layer (a generalised
Gauss-Newton curvature, Kronecker-factored, diagonal or full) or any subnetwork (full or
diagonal) Bayesian, the prior precision chosen by the Laplace marginal likelihood, the
linearised (probit) and Monte Carlo predictives, and a Pyro guide for ``Predictive`` and
``to_arviz``."""

from pyro_flat.infer.laplace.guide import LaplaceGuide
from pyro_flat.infer.laplace.last_layer import LastLayerLaplace, last_linear
from pyro_flat.infer.laplace.subnetwork import SubnetworkLaplace, subnetwork_indices

__all__ = ["LaplaceGuide", "LastLayerLaplace", "SubnetworkLaplace", "last_linear",
           "subnetwork_indices"]
