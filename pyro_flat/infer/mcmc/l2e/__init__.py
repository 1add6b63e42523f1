"""L2E (Kim et al. 2024), whole: the kernel (:mod:`.kernel`), its meta-network and update
(:mod:`.meta_net`), the network evaluated in chunks (:mod:`.chunked`) or by a compiled kernel
(:mod:`.native`), and the meta-training that produced the shipped meta-parameters
(:mod:`.training`)."""

from pyro_flat.infer.mcmc.l2e.kernel import L2E
from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet

__all__ = ["L2E", "MetaNet"]
