"""Inference for flat regions of a BNN posterior: MCMC kernels and SVI tools."""

from pyro_flat.infer.mcmc import (
    L2E,
    SASGLD,
    SGHMC,
    SGLD,
    ContourSGLD,
    CyclicalSGLD,
    EntropyMCMC,
    SGMCMCKernel,
    reweight,
)
from pyro_flat.infer.mcmc.entropy import select_draws
from pyro_flat.infer.svi import (
    HWA,
    SWAG,
    LeanELBO,
    LocalReparameterization,
    SharpnessAwareELBO,
)

__all__ = ["SGMCMCKernel", "SGLD", "SGHMC", "CyclicalSGLD", "EntropyMCMC", "ContourSGLD",
           "reweight", "select_draws", "SASGLD", "L2E",
           "HWA", "SWAG",
           "LeanELBO", "SharpnessAwareELBO", "LocalReparameterization"]
