r"""LeanELBO: ``Trace_ELBO``'s loss and gradients for the common BNN guides, without traces.

For a guide :math:`q_\phi` and a model :math:`p`, one particle of ``Trace_ELBO`` is

.. math:: \ell(\phi) = \log q_\phi(z) - \log p(x, z), \qquad z = g_\phi(\epsilon),

differentiated through the reparameterised draw :math:`z`. :class:`LeanELBO` computes the
same :math:`\ell` and gradient with the work Pyro does per site cut to what this needs: the
guide is not run but drawn by :mod:`pyro_flat.infer.svi.lean_guides` (same parameters, same
random numbers, same values), and the model runs once under a messenger that substitutes the
draw and adds up the scaled log-densities as its sites go by (the one of the SG-MCMC kernels):
no trace, no replay, no per-site bookkeeping afterwards.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from pyro.infer import Trace_ELBO
from pyro.infer.util import torch_item
from pyro.util import warn_if_nan

from pyro_flat import validation
from pyro_flat.infer.svi.lean_guides import GuideDraw, LeanGuide, lean_guide
from pyro_flat.target import LogJoint, UnknownLatentSite


def _shape_key(model: Any, args: tuple, kwargs: dict) -> tuple:
    """The model, the shapes of its tensor arguments and its plain ones (a batch size): what
    the observed shapes follow."""
    def shape(a: Any) -> Any:
        if torch.is_tensor(a):
            return tuple(a.shape)
        return a if isinstance(a, int | float | str | None) else type(a).__name__

    return (id(model), tuple(shape(a) for a in args),
            tuple(sorted((k, shape(v)) for k, v in kwargs.items())))


class LeanELBO(Trace_ELBO):
    r"""``Trace_ELBO`` for Bayesian networks with Pyro's common guides, at a fraction of its cost.

    **Target**: the evidence lower bound
    :math:`\mathbb E_{q_\phi}[\log p(x, z) - \log q_\phi(z)]`, estimated and differentiated
    exactly as :class:`~pyro.infer.Trace_ELBO` does (the same loss and gradients to float
    rounding, the same draws at the same seed).

    **One particle**: draw :math:`z = g_\phi(\epsilon)` from the guide, run the model once with
    :math:`z` substituted, accumulating :math:`\log p(x, z) = \sum_s \text{scale}_s\,
    \log p_s` over its sample sites (prior and likelihood, with Pyro's plate scaling and masks),
    and back-propagate :math:`\ell = \log q_\phi(z) - \log p(x, z)` (divided by the number of
    particles) into the parameters.

    Applies to :class:`~pyro.infer.autoguide.AutoNormal`,
    :class:`~pyro.infer.autoguide.AutoDiagonalNormal` and
    :class:`~pyro.infer.autoguide.AutoDelta` guides whose latent sites are global (no latent
    inside a plate: a Bayesian network's weights), also wrapped by
    :meth:`pyro_flat.infer.LocalReparameterization.guide`, with ``vectorize_particles=False``.
    For any other guide it *is* ``Trace_ELBO`` and says so once, with the reason, in a
    ``UserWarning``. The model can be anything Pyro runs (its own parameters are learned too).
    What is not checked, unlike ``Trace_ELBO`` under validation: that the model's and the
    guide's sites match (a model latent the guide does not draw raises ``RuntimeError``).
    What is: an observed site whose value and distribution broadcast into a larger
    log-density (targets ``(N, 1)`` against a mean ``(B,)``, scored ``B`` times each) raises
    ``ValueError`` naming the site and both shapes (:mod:`pyro_flat.target.observed_shapes`), on the
    first particle for each model and shape of its arguments (the later steps pay nothing).

    **Cost**: one forward and one backward pass of the model plus the draw, close to a
    hand-written torch ELBO step and cheaper than ``Trace_ELBO``'s (docs/methods/lean_elbo.md,
    "Cost").

    Parameters
    ----------
    **kwargs
        The arguments of :class:`pyro.infer.Trace_ELBO` (``num_particles``,
        ``max_plate_nesting``, ``retain_graph``, ``vectorize_particles`` (falls back), ...).

    Examples
    --------
    >>> import torch, pyro
    >>> from pyro.infer import SVI
    >>> from pyro.infer.autoguide import AutoNormal
    >>> from pyro_flat.models.bnn import BNN
    >>> from pyro_flat.models.likelihoods import Categorical
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    >>> model = BNN(net, Categorical(), subsample_size=32)
    >>> x, y = torch.randn(100, 4), torch.randint(0, 3, (100,))
    >>> svi = SVI(model, AutoNormal(model), pyro.optim.Adam({"lr": 1e-2}), LeanELBO())
    >>> losses = [svi.step(x, y) for _ in range(50)]
    >>> losses[-1] < losses[0]
    True

    References
    ----------
    Ranganath, R., Gerrish, S. & Blei, D. (2014). Black box variational inference. AISTATS.
    Kingma, D. P. & Welling, M. (2014). Auto-encoding variational Bayes. ICLR.
    """

    def __init__(self, **kwargs: Any):
        validation.integer_at_least("num_particles", kwargs.get("num_particles", 1), 1)
        super().__init__(**kwargs)
        self._lean_for: tuple[Any, LeanGuide | str] | None = None  # (guide, its drawer)
        self._warned: set[str] = set()
        self._shapes_checked: set[tuple] = set()  # (model, argument shapes) checked once

    # ------------------------------------------------------------------------------ the plan

    def lean_guide(self, guide: Any, args: tuple, kwargs: dict) -> LeanGuide | None:
        """The lean drawer of ``guide``, or None (after one warning) where ``Trace_ELBO`` runs."""
        if self.vectorize_particles:
            lean: LeanGuide | str = "vectorize_particles=True"
        elif self._lean_for is not None and self._lean_for[0] is guide:
            lean = self._lean_for[1]
        else:
            lean = lean_guide(guide, args, kwargs)
            self._lean_for = (guide, lean)
        if isinstance(lean, str):
            if lean not in self._warned:
                self._warned.add(lean)
                warnings.warn(self.fallback_message(lean), UserWarning, stacklevel=3)
            return None
        return lean

    def fallback_message(self, reason: str) -> str:
        """What this loss does for a guide the lean path does not cover (``reason``: why)."""
        return f"{type(self).__name__} runs as Trace_ELBO here: {reason}"

    def particle(self, lean: LeanGuide, model: Callable, args: tuple,
                 kwargs: dict) -> tuple[torch.Tensor, GuideDraw]:
        r"""One particle: :math:`\ell = \log q(z) - \log p(x, z)` (a tensor) and the draw."""
        draw = lean.draw()
        flat = {} if lean.flat_prior is None else lean.flat_prior.fns
        key = _shape_key(model, args, kwargs)
        check = key not in self._shapes_checked
        joint = LogJoint(draw.values, None, None, flat, check_shapes=check)
        try:
            with joint:
                model(*args, **kwargs)
        except UnknownLatentSite as error:
            raise RuntimeError(
                f"the model samples the latent site {error.site!r}, which the guide does not "
                f"draw; {type(self).__name__} needs a guide of every latent site (Trace_ELBO "
                "would sample it from the model's prior)") from None
        if check:
            self._shapes_checked.add(key)
        log_p = joint.log_joint + lean.log_prior(draw, joint.missed)
        return draw.log_q - log_p, draw

    # ------------------------------------------------------------------------ Pyro's ELBO API

    def loss(self, model: Callable, guide: Callable, *args: Any, **kwargs: Any) -> float:
        """The negative ELBO estimate (no gradients)."""
        if self.lean_guide(guide, args, kwargs) is None:
            return super().loss(model, guide, *args, **kwargs)
        with torch.no_grad():
            return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def differentiable_loss(self, model: Callable, guide: Callable, *args: Any,
                            **kwargs: Any) -> torch.Tensor:
        """The negative ELBO estimate as a tensor to differentiate."""
        lean = self.lean_guide(guide, args, kwargs)
        if lean is None:
            return super().differentiable_loss(model, guide, *args, **kwargs)
        loss = 0.0
        for _ in range(self.num_particles):
            loss = loss + self.particle(lean, model, args, kwargs)[0] / self.num_particles
        warn_if_nan(loss, "loss")
        return loss

    def loss_and_grads(self, model: Callable, guide: Callable, *args: Any,
                       **kwargs: Any) -> float:
        """The negative ELBO estimate; its gradient is accumulated into the parameters."""
        lean = self.lean_guide(guide, args, kwargs)
        if lean is None:
            return super().loss_and_grads(model, guide, *args, **kwargs)
        loss = 0.0
        for _ in range(self.num_particles):
            particle, _ = self.particle(lean, model, args, kwargs)
            if getattr(particle, "requires_grad", False):
                scaled = particle if self.num_particles == 1 else particle / self.num_particles
                scaled.backward(retain_graph=self.retain_graph)
            loss += torch_item(particle) / self.num_particles
        warn_if_nan(loss, "loss")
        return loss
