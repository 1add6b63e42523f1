"""Post-hoc Laplace approximations of trained networks: the last layer Bayesian, with a
generalised Gauss-Newton curvature (Kronecker-factored, diagonal or full), the prior precision
chosen by the Laplace marginal likelihood, the linearised (probit) and Monte Carlo
predictives, and a Pyro guide for ``Predictive`` and ``to_arviz``."""

from pyro_flat.infer.laplace.guide import LaplaceGuide
from pyro_flat.infer.laplace.last_layer import LastLayerLaplace, last_linear

__all__ = ["LaplaceGuide", "LastLayerLaplace", "last_linear"]
