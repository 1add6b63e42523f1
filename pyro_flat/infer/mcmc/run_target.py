r"""What a run's chains step on, built once at the start of each run: the model traced into a
flat layout, its potential :math:`\hat U(z, \text{batch})` (vectorised over ``K`` chains, or
one data-parallel rank's part), the chains' initial values and their minibatches.

A kernel's ``setup`` calls :func:`model_run_target` for a Pyro model and
:func:`user_run_target` for a ``potential_fn``, and binds the result to the chains through a
:class:`~pyro_flat.target.Target`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pyro_flat.infer.mcmc.chains import ChainStreams, VectorizedPotential
from pyro_flat.target.layout import FlatLayout
from pyro_flat.target.minibatch import ChainMinibatches
from pyro_flat.target.potential import ModelPotential
from pyro_flat.target.target import Potential
from pyro_flat.target.tracing import DataPlate, trace_model
from pyro_flat.target.user_potential import UserPotential, per_chain_shapes

__all__ = ["RunTarget", "chain_inits", "model_run_target", "user_run_target"]


@dataclass
class RunTarget:
    """The parts of a run's target.

    Attributes
    ----------
    layout : FlatLayout
        The latent sites on one chain's flat position.
    potential : Potential
        ``U(params, batch)`` (one energy per chain for vectorised chains).
    plate : DataPlate or None
        The plate the kernel subsamples (``None``: full batch, or the model's own subsampling).
    num_data : int or None
        ``N`` where the model says it.
    inits : list of dict
        One chain's initial values per chain.
    minibatches : ChainMinibatches or None
        The chains' minibatch streams (``None``: nothing to subsample).
    """

    layout: FlatLayout
    potential: Potential
    plate: DataPlate | None
    num_data: int | None
    inits: list[dict[str, torch.Tensor]]
    minibatches: ChainMinibatches | None = None


def model_run_target(model: Callable, args: tuple, kwargs: dict, *,
                     init_strategy: Callable, subsample_size: int | None,
                     data_plate: str | None, shard: Any, streams: ChainStreams | None,
                     device: torch.device) -> RunTarget:
    """The target of a Pyro model: traced once per chain (each chain's initial values drawn
    from its own stream, ``streams``; ``None``: one chain on the global stream), its potential
    vectorised over the chains (one chain's, with a single stream, takes its row without the
    chain dimension: no ``vmap``), or one data-parallel rank's part of it (``shard``)."""
    traced_batch = (subsample_size if shard is None
                    else shard.traced_batch_size(subsample_size))

    def trace() -> Any:
        return trace_model(model, args, kwargs, init_strategy, traced_batch, data_plate)

    traced = ([trace()] if streams is None
              else [streams.run_as_global(c, trace) for c in range(len(streams))])
    layout, _, plate, flat_prior, num_data = traced[0]
    potential: Any = ModelPotential(model, args, kwargs, layout, plate, flat_prior)
    if shard is not None:  # the plate of all ranks' data; this rank's part of U
        plate, potential = shard.distribute(plate, potential)
    rows = streams is not None and len(streams) > 1
    if rows:
        potential = VectorizedPotential(potential, len(streams))
    minibatches = None
    if plate is not None:
        generators = [None] if streams is None else list(streams)
        minibatches = ChainMinibatches(plate.size, plate.batch_size, device, generators, rows)
    return RunTarget(layout, potential, plate, num_data, [t.init for t in traced], minibatches)


def user_run_target(potential_fn: Callable, init: dict[str, torch.Tensor],
                    num_chains: int | None) -> RunTarget:
    """The target of a user's ``potential_fn`` from its initial values ``init`` (with a leading
    chain dimension for ``num_chains`` vectorised chains)."""
    shapes = {name: v.shape for name, v in init.items()}
    if num_chains is not None:
        shapes = per_chain_shapes(shapes, num_chains)
    inits = [init] if num_chains is None else [{n: v[c] for n, v in init.items()}
                                               for c in range(num_chains)]
    return RunTarget(FlatLayout.from_shapes(shapes), UserPotential(potential_fn, num_chains),
                     None, None, inits)


def chain_inits(given: dict[str, torch.Tensor], layout: FlatLayout, num_chains: int | None
                ) -> list[dict[str, torch.Tensor]]:
    """User-given initial values of a model's sites, one dict per chain: a value with a leading
    dimension ``K`` (``num_chains``) gives each chain its row, any other value is every chain's."""
    if num_chains is None:
        return [given]
    inits = []
    for c in range(num_chains):
        init = {}
        for s in layout.sites:
            v = given.get(s.name)
            if v is not None and v.shape == (num_chains, *s.shape):
                v = v[c]
            init[s.name] = v
        inits.append({n: v for n, v in init.items() if v is not None})
    return inits
