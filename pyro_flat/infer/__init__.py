"""Inference for flat regions of a BNN posterior: MCMC kernels and SVI tools."""

from pyro_flat.infer.mcmc import (
    L2E,
    SASGLD,
    SGHMC,
    SGLD,
    CyclicalSGLD,
    EntropyMCMC,
    SGMCMCKernel,
)
from pyro_flat.infer.svi import HWA, SWAG

__all__ = ["SGMCMCKernel", "SGLD", "SGHMC", "CyclicalSGLD", "EntropyMCMC", "SASGLD", "L2E",
           "HWA", "SWAG"]
