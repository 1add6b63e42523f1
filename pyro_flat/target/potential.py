r"""The minibatch potential of a Pyro model: the hot path of every SG-MCMC kernel.

For unconstrained parameters ``z``, constrained values ``x = T(z)`` and ``T = biject_to(support)``,

.. math::

    U(z) = -\log p(x) - \log|\det J_T(z)|
           - \frac{N}{B} \sum_{i \in \text{batch}} \log p(y_i \mid x)

The model runs once per evaluation under :class:`~pyro_flat.target.log_joint.LogJoint`, which
substitutes the latent values, injects the minibatch indices into the data plate and adds up
the scaled log-densities as the sites go by. Nothing is traced or recorded; constant Normal
priors (the usual BNN prior) are summed in closed form on the flat parameter vector
(:mod:`.flat_prior`), the other Normal sites in closed form as the model runs (:mod:`.normal`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pyro_flat.target.flat_prior import FlatNormalPrior
from pyro_flat.target.layout import FlatLayout
from pyro_flat.target.log_joint import LogJoint
from pyro_flat.target.tracing import DataPlate

__all__ = ["ModelPotential"]


class ModelPotential:
    """``U(z, batch)`` of a Pyro model, for the unconstrained values ``z`` of its latent sites.

    Parameters
    ----------
    model : callable
        The Pyro model.
    model_args, model_kwargs
        Its arguments, fixed for the run.
    layout : FlatLayout
        The latent sites, with their transforms to the constrained space.
    plate : DataPlate or None
        The subsampled data plate, or None to run the model as it is (full batch, or the model's
        own plate subsampling).
    flat_prior : FlatNormalPrior, optional
        Sites whose constant Normal prior is left out of the model run; the caller adds
        ``flat_prior.value_and_grad_`` on the flat vector.

    Attributes
    ----------
    include_prior : bool
        ``False``: the likelihood term alone (no prior, no log-Jacobian), for a data-parallel
        rank whose part of the sum leaves the prior to another rank
        (:mod:`pyro_flat.distributed.data_parallel`).
    """

    include_prior: bool = True

    def __init__(
        self,
        model: Callable,
        model_args: tuple,
        model_kwargs: dict,
        layout: FlatLayout,
        plate: DataPlate | None,
        flat_prior: FlatNormalPrior | None = None,
    ):
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs)
        self.layout = layout
        self.plate = plate
        self._transformed = [s for s in layout.sites if s.transform is not None]
        self.flat_prior = flat_prior

    @property
    def _flat_prior_fns(self) -> dict[str, Any]:
        return {} if self.flat_prior is None else self.flat_prior.fns

    def _arguments(self, batch: torch.Tensor | None) -> tuple[tuple, dict]:
        plate = self.plate
        if batch is None or plate is None or not plate.slice_args:
            return self.model_args, self.model_kwargs
        args = list(self.model_args)
        for i in plate.arg_positions:
            args[i] = args[i].index_select(0, batch)
        kwargs = dict(self.model_kwargs)
        for k in plate.kwarg_names:
            kwargs[k] = kwargs[k].index_select(0, batch)
        return tuple(args), kwargs

    def __call__(
        self, params: dict[str, torch.Tensor], batch: torch.Tensor | None = None
    ) -> torch.Tensor:
        values = params
        log_det = 0.0
        if self._transformed:
            values = dict(params)
            for site in self._transformed:
                z = params[site.name]
                x = site.transform(z)
                if self.include_prior:
                    log_det = log_det + site.transform.log_abs_det_jacobian(z, x).sum()
                values[site.name] = x
        args, kwargs = self._arguments(batch)
        log_joint = LogJoint(values, self.plate, batch, self._flat_prior_fns,
                              self.include_prior)
        with log_joint:
            self.model(*args, **kwargs)
        if log_joint.missed:
            # A prior object changed since setup: from now on it is summed in the model run.
            self.flat_prior.drop(log_joint.missed)
        return -(log_joint.log_joint + log_det)
