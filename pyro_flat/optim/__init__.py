"""Optimisers: SAM, the sharpness-aware minimiser, for flat MAP, ensembles and SWAG (F-SWAG)."""

from pyro_flat.optim.sam import SAM

__all__ = ["SAM"]
