"""pyro_flat: flat-seeking inference for Bayesian neural networks in Pyro."""

from pyro_flat.diagnostics import sample_stats, to_arviz

__version__ = "0.1.0"

__all__ = ["__version__", "sample_stats", "to_arviz"]
