"""Optimisers: SAM, the sharpness-aware minimiser, for flat MAP, ensembles and SWAG (F-SWAG);
a multi-tensor Pyro optimiser for SVI."""

from pyro_flat.optim.multi_tensor import MultiTensorAdam, MultiTensorOptim
from pyro_flat.optim.sam import SAM

__all__ = ["SAM", "MultiTensorOptim", "MultiTensorAdam"]
