"""Every SG-MCMC kernel of pyro_flat, registered in one place.

The kernel contract test (``tests/infer/mcmc/test_kernel_contract.py``, with the architecture
page's example kernel) and the conformance matrix (``tests/conformance``) run over
:data:`KERNELS`; a new kernel is one :func:`register` line here (or, for a kernel of your own,
one call in your code).

Examples
--------
>>> from pyro_flat.infer.mcmc.registry import KERNELS
>>> list(KERNELS)
['SGLD', 'SGHMC', 'CyclicalSGLD', 'EntropyMCMC', 'ContourSGLD', 'SASGLD', 'L2E']
"""

from __future__ import annotations

from typing import TypeVar

from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.contour import ContourSGLD
from pyro_flat.infer.mcmc.entropy import EntropyMCMC
from pyro_flat.infer.mcmc.l2e import L2E
from pyro_flat.infer.mcmc.sgld import SGHMC, SGLD, CyclicalSGLD
from pyro_flat.infer.mcmc.sharpness import SASGLD

__all__ = ["KERNELS", "register"]

_Kernel = TypeVar("_Kernel", bound=type)

#: The registered kernels by class name, in registration order.
KERNELS: dict[str, type[SGMCMCKernel]] = {}


def register(kernel: _Kernel, registry: dict[str, type[SGMCMCKernel]] | None = None) -> _Kernel:
    """Add ``kernel`` (an :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel` subclass) to
    ``registry`` (default :data:`KERNELS`) under its class name; returns it, so it can
    decorate the class."""
    registry = KERNELS if registry is None else registry
    if not (isinstance(kernel, type) and issubclass(kernel, SGMCMCKernel)):
        raise TypeError(f"kernel must be a subclass of SGMCMCKernel, got {kernel!r}")
    if registry.get(kernel.__name__, kernel) is not kernel:
        raise ValueError(f"a different kernel is registered as {kernel.__name__!r}")
    registry[kernel.__name__] = kernel
    return kernel


register(SGLD)
register(SGHMC)
register(CyclicalSGLD)
register(EntropyMCMC)
register(ContourSGLD)
register(SASGLD)
register(L2E)
