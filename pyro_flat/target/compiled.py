r"""A readable model's potential and gradient as one compiled function of the flat position.

:class:`CompiledPotential` compiles :math:`z, \text{batch} \mapsto (\hat U, \nabla \hat U)`
of a :class:`~.network_potential.NetworkPotential` with :func:`torch.compile` (the gradient by
:func:`torch.func.grad_and_value`, ``K`` vectorised chains by :func:`torch.func.vmap`), for
:class:`~.target.Target`'s hot path; the update of the chain stays as it is. Compiled
functions are cached in the process by what defines them (the network's structure, the shapes
and dtypes of the data, the minibatch size, the number of chains), so a second run of the same
shapes compiles nothing; the cache keeps the :data:`CACHE_SIZE` most recently used.
"""

from __future__ import annotations

import itertools
import time
import types
from collections import OrderedDict
from collections.abc import Callable

import torch

from pyro_flat.target.network_potential import NetworkFunction, NetworkPotential

__all__ = ["CACHE_SIZE", "CompiledPotential", "clear_cache"]

#: How many compiled functions the process keeps.
CACHE_SIZE = 16
_cache: OrderedDict[tuple, Callable] = OrderedDict()
_names = itertools.count()


def clear_cache() -> None:
    """Forget every compiled function (the next run of each shape compiles again)."""
    _cache.clear()


def _own_code(fn: Callable, name: str) -> Callable:
    """``fn`` with a code object of its own: torch.compile keeps its graphs (and counts its
    recompilations) per code object, so each cached function gets its own."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _compile(function: NetworkFunction, chains: int | None, minibatched: bool) -> Callable:
    value_and_grad = torch.func.grad_and_value(function.energy)
    if chains is not None:
        value_and_grad = torch.func.vmap(
            value_and_grad, in_dims=(0, None, None, 0 if minibatched else None, None, None, None))

    def potential_and_grad(z, x, y, batch, buffers, precision, loc):  # noqa: ANN001, ANN202
        grad, u = value_and_grad(z, x, y, batch, buffers, precision, loc)
        return u, grad

    own = _own_code(potential_and_grad, f"pyro_flat_potential_{next(_names)}")
    return torch.compile(own, dynamic=False, fullgraph=True)


class CompiledPotential:
    r"""``(U, grad U)`` of a readable model's chains (``z``: ``(d,)``, or ``(K, d)`` for
    ``chains=K``), compiled.

    Parameters
    ----------
    network : NetworkPotential
        The model's pure potential (:func:`~.network_potential.read_network`).
    chains : int, optional
        ``K`` vectorised chains (``None``: one chain, without a chain dimension).
    minibatched : bool
        Whether each call gets minibatch indices (``(B,)``, or ``(K, B)``).

    Attributes
    ----------
    cached : bool
        Whether the compiled function came from the cache (an earlier run of the same shapes).
    compile_seconds : float or None
        The wall time of the first call (the compilation, unless ``cached``), set by
        :meth:`warm_up`.

    Examples
    --------
    The compiled path on a small regression network (compiling takes seconds)::

        fast = CompiledPotential(read_network(model, (x, y), {}, layout, None, flat_prior))
        u, grad = fast(z, None)
    """

    def __init__(self, network: NetworkPotential, chains: int | None = None,
                 minibatched: bool = False):
        key = (network.function.key, chains, minibatched)
        #: What identifies the compiled function (its entry in the process's cache).
        self.key = key
        compiled = _cache.get(key)
        self.cached = compiled is not None
        if compiled is None:
            compiled = _compile(network.function, chains, minibatched)
            _cache[key] = compiled
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
        else:
            _cache.move_to_end(key)
        self._compiled = compiled
        self.network = network
        self.compile_seconds: float | None = None

    def warm_up(self, z: torch.Tensor, batch: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first call, timed (:attr:`compile_seconds`)."""
        start = time.perf_counter()
        out = self(z, batch)
        self.compile_seconds = time.perf_counter() - start
        return out

    def __call__(self, z: torch.Tensor, batch: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, grad U)`` at ``z`` on ``batch``; the gradient is a new tensor."""
        u, grad = self._compiled(z, *self.network.inputs(batch))
        return u + self.network.constant, grad
