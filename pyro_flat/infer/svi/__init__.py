"""SVI tools: flat-seeking losses and averaging of variational (or SGD) iterates."""

from pyro_flat.infer.svi.hwa import HWA
from pyro_flat.infer.svi.lean_elbo import LeanELBO
from pyro_flat.infer.svi.lrt import LocalReparameterization
from pyro_flat.infer.svi.sharpness_elbo import SharpnessAwareELBO
from pyro_flat.infer.svi.swag import SWAG

__all__ = ["HWA", "SWAG", "LeanELBO", "SharpnessAwareELBO", "LocalReparameterization"]
