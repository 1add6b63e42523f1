r"""The messenger every pyro_flat potential runs a model under: substitute the latent values,
inject the minibatch indices, add up the scaled log-densities as the sites go by.

.. math:: \log p(x, y_B) = \sum_{\text{latent}} \log p(x_s \mid \cdot)
          + \frac{N}{B} \sum_{i \in B} \log p(y_i \mid x)

(the plate's scale; kernel-side subsampling rescales by :math:`N/B` itself). Normal sites are
summed in closed form (:mod:`.normal`). The SG-MCMC kernels' potential
(:class:`~pyro_flat.target.potential.ModelPotential`) and SVI's
:class:`~pyro_flat.infer.LeanELBO` both use it.
"""

from __future__ import annotations

from typing import Any

import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from pyro_flat.target.normal import normal_log_prob_sum
from pyro_flat.target.observed_shapes import check_observed_site
from pyro_flat.target.tracing import DataPlate

__all__ = ["LogJoint", "UnknownLatentSite"]


class UnknownLatentSite(RuntimeError):
    """The model sampled a latent site that has no value to substitute (``site``: its name)."""

    def __init__(self, site: str, message: str):
        super().__init__(message)
        self.site = site


class LogJoint(Messenger):
    """Substitutes latent values, injects minibatch indices, and sums scaled log-densities.

    Run a model under it (``with LogJoint(values, plate, batch, flat_prior_fns): model(...)``)
    and read ``log_joint``: the sum of every site's scaled log-density, the latent sites' at
    ``values`` (constrained), the observed ones' at their data. Nothing is traced or recorded.
    A latent site without a value raises :class:`UnknownLatentSite`. ``flat_prior_fns``: the
    sites whose prior :class:`~pyro_flat.target.flat_prior.FlatNormalPrior` sums on the flat
    vector (left out here while they keep the same distribution object; a site whose object
    changed is listed in ``missed``). ``include_prior=False``: observed sites only.

    ``check_shapes``: refuse an observed site whose value and distribution broadcast into a
    larger log-density (:mod:`.observed_shapes`); off on the kernels' hot path, where
    :func:`~pyro_flat.target.tracing.trace_model` checked the sites once.
    """

    def __init__(
        self,
        values: dict[str, torch.Tensor],
        plate: DataPlate | None,
        batch: torch.Tensor | None,
        flat_prior_fns: dict[str, Any],
        include_prior: bool = True,
        check_shapes: bool = False,
    ):
        super().__init__()
        self.values = values
        self.plate = plate
        self.batch = batch
        self.flat_prior_fns = flat_prior_fns
        self.include_prior = include_prior
        self.check_shapes = check_shapes
        self.missed: list[str] = []
        self.log_joint: torch.Tensor | float = 0.0

    def _pyro_sample(self, msg: dict) -> None:
        if msg["is_observed"]:
            return
        value = self.values.get(msg["name"])
        if value is not None:
            msg["value"] = value
        elif (
            self.batch is not None
            and site_is_subsample(msg)
            and msg["fn"].size == self.plate.size
            and msg["name"] == self.plate.name
        ):
            msg["value"] = self.batch

    def _pyro_post_sample(self, msg: dict) -> None:
        fn = msg["fn"]
        # a plate's index site (pyro.poutine.util.site_is_subsample's test, inlined: every site
        # of every step passes here)
        if type(fn).__name__ == "_Subsample" or msg["infer"].get("_deterministic"):
            return
        if not msg["is_observed"] and msg["name"] not in self.values:
            raise UnknownLatentSite(
                msg["name"],
                f"sample site {msg['name']!r} was not present when the kernel traced the model; "
                "SG-MCMC kernels need a model with a fixed set of latent sites",
            )
        if msg["is_observed"] and self.check_shapes:
            check_observed_site(msg)
        if not msg["is_observed"] and not self.include_prior:
            return
        scale, mask = msg["scale"], msg["mask"]
        if not msg["is_observed"] and msg["name"] in self.flat_prior_fns:
            if fn is self.flat_prior_fns[msg["name"]] and mask is None and _is_one(scale):
                return  # summed in closed form on the flat vector by FlatNormalPrior
            self.missed.append(msg["name"])
        if self.plate is not None and self.plate.slice_args:
            for frame in msg["cond_indep_stack"]:
                # A plate sized from the sliced arguments (e.g. ``pyro.plate("data", len(x))``)
                # sees only the minibatch's points and does not rescale: the kernel does, by
                # N / B (a data-parallel rank sees its part of the B points: still N / B).
                if frame.name == self.plate.name and frame.full_size != self.plate.size:
                    scale = scale * (self.plate.size / self.plate.batch_size)
        lp = None
        if mask is None and not msg["is_observed"]:
            lp = normal_log_prob_sum(fn, msg["value"])
        if lp is None:
            lp = scale_and_mask(fn.log_prob(msg["value"]), 1.0, mask).sum()
        self.log_joint = self.log_joint + (lp if _is_one(scale) else scale * lp)


def _is_one(scale: Any) -> bool:
    return isinstance(scale, float) and scale == 1.0
