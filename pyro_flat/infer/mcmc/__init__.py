"""SG-MCMC kernels for :class:`pyro.infer.MCMC`."""

from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.contour import ContourSGLD, reweight
from pyro_flat.infer.mcmc.entropy import EntropyMCMC
from pyro_flat.infer.mcmc.l2e import L2E
from pyro_flat.infer.mcmc.sgld import SGHMC, SGLD, CyclicalSGLD
from pyro_flat.infer.mcmc.sharpness import SASGLD

__all__ = ["SGMCMCKernel", "SGLD", "SGHMC", "CyclicalSGLD", "EntropyMCMC",
           "ContourSGLD", "reweight", "SASGLD", "L2E"]
