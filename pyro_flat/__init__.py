"""pyro_flat: flat-seeking inference for Bayesian neural networks in Pyro."""

from pyro_flat.draws.export import get_samples, kernel_diagnostics, sample_stats, to_arviz
from pyro_flat.draws.files import open_draws
from pyro_flat.draws.lean_mcmc import LeanMCMC
from pyro_flat.draws.streaming import DrawWriter

__version__ = "0.1.0"

__all__ = ["__version__", "get_samples", "kernel_diagnostics", "sample_stats", "to_arviz"]
__all__ += ["DrawWriter", "LeanMCMC", "open_draws"]
