"""pyro_flat: flat-seeking inference for Bayesian neural networks in Pyro."""

from pyro_flat.diagnostics import get_samples, sample_stats, to_arviz

__version__ = "0.1.0"

__all__ = ["__version__", "get_samples", "sample_stats", "to_arviz"]
