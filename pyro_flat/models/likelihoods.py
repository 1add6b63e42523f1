"""Observation models for Bayesian networks: how the targets depend on the network's output.

A likelihood turns a network's output on a minibatch into the distribution of each target,
and draws its own latent parameters (e.g. a learned noise scale) once per model run, outside
the data plate. :class:`pyro_flat.models.bnn.BNN` uses them; each is a few lines of plain Pyro.

=================================  ===================================  ==========================
likelihood                         network output per data point        latent sites
=================================  ===================================  ==========================
:class:`Categorical`               ``C`` logits                         none
:class:`Bernoulli`                 one logit (``(B,)`` or ``(B, 1)``)   none
:class:`HomoskedasticGaussian`     the mean (``(B,)`` or ``(B, 1)``)    ``obs_scale`` if learned
:class:`HeteroskedasticGaussian`   mean and raw scale, ``(B, 2)``       none
=================================  ===================================  ==========================

Examples
--------
>>> import torch
>>> from pyro_flat.models.likelihoods import HeteroskedasticGaussian
>>> d = HeteroskedasticGaussian().distribution(torch.zeros(4, 2), {})
>>> d.batch_shape, bool((d.scale > 0).all())
(torch.Size([4]), True)
"""

from __future__ import annotations

from typing import Any

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F

from pyro_flat import validation

__all__ = ["Bernoulli", "Categorical", "HeteroskedasticGaussian", "HomoskedasticGaussian",
           "Likelihood"]


class Likelihood:
    """The distribution of the targets given the network's output on a batch.

    Subclasses implement :meth:`distribution` and, if they have latent parameters,
    :meth:`latents`.
    """

    def latents(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Draw the likelihood's own latent sites (called once per model run, outside the
        data plate); none by default.

        ``dtype``: the floating dtype of the latents' priors (:class:`~pyro_flat.models.bnn.BNN`
        passes the dtype of its inputs, so that a float64 network has float64 latents);
        ``None``: torch's default dtype. A subclass whose ``latents`` takes no ``dtype`` is
        called without it.
        """
        return {}

    def distribution(self, output: torch.Tensor, latents: dict[str, torch.Tensor]
                     ) -> dist.Distribution:
        """The distribution of each target, batch shape ``(B,)``, for outputs ``(B, ...)``."""
        raise NotImplementedError

    def _one_per_point(self, output: torch.Tensor) -> torch.Tensor:
        if output.dim() == 2 and output.shape[1] == 1:
            output = output.squeeze(1)
        if output.dim() != 1:
            raise ValueError(
                f"{type(self).__name__} needs one network output per data point, shape (B,) "
                f"or (B, 1), but the network returned shape {tuple(output.shape)}"
            )
        return output

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Categorical(Likelihood):
    """``y ~ Categorical(logits=f(x))``; the network returns ``(B, C)`` logits."""

    def distribution(self, output: torch.Tensor, latents: dict[str, Any]) -> dist.Distribution:
        if output.dim() != 2 or output.shape[1] < 2:
            raise ValueError(f"Categorical needs (B, C) logits with C >= 2 classes, but the "
                             f"network returned shape {tuple(output.shape)}")
        return dist.Categorical(logits=output)


class Bernoulli(Likelihood):
    """``y ~ Bernoulli(logits=f(x))``, targets in ``{0, 1}`` as floats."""

    def distribution(self, output: torch.Tensor, latents: dict[str, Any]) -> dist.Distribution:
        return dist.Bernoulli(logits=self._one_per_point(output))


class HomoskedasticGaussian(Likelihood):
    r"""``y ~ N(f(x), sigma^2)`` with one noise scale for all points.

    Parameters
    ----------
    scale : float, optional
        A fixed ``sigma > 0``. ``None`` (default) learns it: the latent site ``obs_scale``
        with prior ``HalfNormal(prior_scale)``, in the dtype ``latents`` is given (in a
        :class:`~pyro_flat.models.bnn.BNN`, its inputs' dtype).
    prior_scale : float
        The scale of the ``HalfNormal`` prior of a learned ``sigma``, ``> 0``.
    """

    def __init__(self, scale: float | None = None, *, prior_scale: float = 1.0):
        self.scale = None if scale is None else validation.positive("scale", scale)
        self.prior_scale = validation.positive("prior_scale", prior_scale)

    def latents(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        if self.scale is not None:
            return {}
        scale = self.prior_scale if dtype is None else torch.tensor(self.prior_scale,
                                                                    dtype=dtype)
        return {"obs_scale": pyro.sample("obs_scale", dist.HalfNormal(scale))}

    def distribution(self, output: torch.Tensor, latents: dict[str, Any]) -> dist.Distribution:
        scale = latents["obs_scale"] if self.scale is None else self.scale
        return dist.Normal(self._one_per_point(output), scale)

    def __repr__(self) -> str:
        fixed = f"scale={self.scale}" if self.scale is not None else \
            f"learned, prior_scale={self.prior_scale}"
        return f"HomoskedasticGaussian({fixed})"


class HeteroskedasticGaussian(Likelihood):
    r"""``y ~ N(m(x), s(x)^2)`` from a two-headed network: output ``(B, 2)`` is the mean and a
    raw scale, :math:`s = \mathrm{softplus}(\text{raw}) + \text{min\_scale}`.

    Parameters
    ----------
    min_scale : float
        A floor on the scale, ``>= 0``, which keeps the density bounded.
    """

    def __init__(self, min_scale: float = 1e-3):
        self.min_scale = validation.nonnegative("min_scale", min_scale)

    def distribution(self, output: torch.Tensor, latents: dict[str, Any]) -> dist.Distribution:
        if output.dim() != 2 or output.shape[1] != 2:
            raise ValueError(f"HeteroskedasticGaussian needs (B, 2) outputs (mean, raw scale), "
                             f"but the network returned shape {tuple(output.shape)}")
        return dist.Normal(output[:, 0], F.softplus(output[:, 1]) + self.min_scale)

    def __repr__(self) -> str:
        return f"HeteroskedasticGaussian(min_scale={self.min_scale})"
