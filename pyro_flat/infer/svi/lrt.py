r"""SGVB-LRT: the local reparameterisation trick for Bayesian linear and conv layers in Pyro.

With a factorised Gaussian guide :math:`W_{ij} \sim \mathcal N(\mu_{ij}, \sigma_{ij}^2)`, the
pre-activation of a linear layer on an input :math:`a` is Gaussian,
:math:`b_j \sim \mathcal N\big(\sum_i a_i \mu_{ij},\ \sum_i a_i^2 \sigma_{ij}^2\big)`, and
Kingma, Salimans & Welling (2015) sample it directly, independently for every data point,
instead of one weight matrix per minibatch: the same expected log-likelihood, a gradient with
a much smaller variance. For a convolution the mean and the variance are the convolutions of
:math:`a` with :math:`\mu` and of :math:`a^2` with :math:`\sigma^2`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.poutine.messenger import Messenger

_PATCHED = ("linear", "conv1d", "conv2d", "conv3d")
_TINY = 1e-30  # keeps sqrt differentiable where the variance is exactly 0 (e.g. a = 0)


def _normal_parts(fn: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(loc, scale)`` if ``fn`` is a Normal, possibly made independent, expanded or masked."""
    while True:
        if isinstance(fn, dist.Normal):
            return fn.loc, fn.scale
        if isinstance(fn, (dist.Independent, dist.MaskedDistribution)):
            fn = fn.base_dist
        elif isinstance(fn, dist.ExpandedDistribution):
            fn = fn.base_dist
        else:
            return None


class _GuideRecorder(Messenger):
    """Remembers the guide's Normal draws in ``lrt._draws``."""

    def __init__(self, lrt: LocalReparameterization):
        super().__init__()
        self.lrt = lrt

    def __enter__(self) -> _GuideRecorder:
        self.lrt._draws.clear()
        return super().__enter__()

    def _pyro_post_sample(self, msg: dict) -> None:
        if msg["is_observed"] or msg["value"] is None:
            return
        parts = _normal_parts(msg["fn"])
        if parts is not None:
            value = msg["value"]
            self.lrt._draws[id(value)] = (weakref.ref(value), parts[0], parts[1])


class LocalReparameterization:
    r"""Run Bayesian linear and conv layers by local reparameterisation (SGVB-LRT).

    Wrap the model and the guide with the *same* instance::

        lrt = LocalReparameterization()
        svi = SVI(lrt.model(model), lrt.guide(guide), optim, Trace_ELBO())          # SGVB-LRT
        svi = SVI(lrt.model(model), lrt.guide(guide), optim, SharpnessAwareELBO())  # F-SGVB-LRT

    While the guide runs (first, as in every Pyro ELBO), every latent draw from a Normal
    (``AutoNormal``'s per-site Normals, hand-written ``Normal(loc, scale)`` sites) is remembered
    with its ``loc`` and ``scale`` (the draws of the guide's previous run are forgotten).
    While the model runs, ``F.linear`` and ``F.conv{1,2,3}d`` check their ``weight``: if it is
    one of those draws (the tensor the guide sampled, or a view of it of the same shape, as Pyro
    replays it into the model),
    the layer returns

    .. math:: b = a\mu^\top + \beta + \sqrt{a^2 (\sigma^2)^\top + s_\beta^2}\ \odot\ \epsilon,
        \qquad \epsilon \sim \mathcal N(0, I) \text{ per data point and unit},

    (``conv`` in place of the products for convolutions), where the bias is :math:`\beta` if it
    is deterministic, or contributes its mean :math:`\beta = \mu_\beta` and variance
    :math:`s_\beta^2 = \sigma_\beta^2` if it is a remembered draw too. Any other weight (a
    deterministic layer, ``AutoDiagonalNormal``'s views of its joint latent, a draw from a
    non-Gaussian or transformed site) runs the layer unchanged. The weight draws themselves
    still enter the ELBO's prior and entropy terms (use ``TraceMeanField_ELBO`` for an analytic
    KL).

    **Target**: the same ELBO as without the wrapper (each data point's pre-activation has the
    same marginal under both estimators, so the expected log-likelihood is the same when the
    likelihood factorises over data points given the pre-activations of the wrapped layer); only
    the gradient's variance changes. Stacked layers are sampled layer by layer given the
    previous layer's sampled activations, as in the paper.

    **Sharpness-aware variant (F-SGVB-LRT)**: with
    :class:`~pyro_flat.infer.SharpnessAwareELBO`, the means :math:`\mu` are moved to
    :math:`\mu'` in place and the random state is replayed, so the second pass uses the same
    :math:`\epsilon` around the perturbed means: the paper's F-SGVB-LRT.

    The wrapped model is for fitting only: to predict, run the plain model with guide draws.

    **Cost**: two matrix products (or convolutions) per wrapped layer instead of one, plus one
    weight draw from the guide as without the wrapper.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import SVI, Trace_ELBO
    >>> from pyro.infer.autoguide import AutoNormal
    >>> from pyro_flat.models.nn import make_bayesian
    >>> net = make_bayesian(torch.nn.Linear(3, 1))
    >>> def model(x, y):
    ...     mean = net(x).squeeze(-1)
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(mean, 0.1), obs=y)
    >>> lrt = LocalReparameterization()
    >>> guide = AutoNormal(model)
    >>> svi = SVI(lrt.model(model), lrt.guide(guide), pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    >>> x = torch.randn(64, 3); y = x.sum(-1)
    >>> losses = [svi.step(x, y) for _ in range(20)]

    References
    ----------
    Kingma, D. P., Salimans, T. & Welling, M. (2015). Variational dropout and the local
    reparameterization trick. NeurIPS. Nguyen, V.-A. et al. (2023). Flat seeking Bayesian
    neural networks. NeurIPS (SGVB-LRT and F-SGVB-LRT rows).
    """

    def __init__(self) -> None:
        self._draws: dict[int, tuple[weakref.ref, torch.Tensor, torch.Tensor]] = {}
        # torch's own functions, which the patched versions call
        self._originals: dict[str, Callable] = {name: getattr(F, name) for name in _PATCHED}

    def guide(self, fn: Callable) -> Callable:
        """``fn`` (the guide) remembering its Normal draws for the model's layers."""
        return _GuideRecorder(self)(fn)

    def model(self, fn: Callable) -> Callable:
        """``fn`` (the model) with its linear and conv layers locally reparameterised."""

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            saved = {name: getattr(F, name) for name in _PATCHED}
            F.linear = self._linear
            for name in _PATCHED[1:]:
                setattr(F, name, self._conv(self._originals[name]))
            try:
                return fn(*args, **kwargs)
            finally:  # put back what was there, even if calls nest
                for name, previous in saved.items():
                    setattr(F, name, previous)

        return wrapped

    def _lookup(self, t: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        if t is None:
            return None
        for candidate in (t, t._base):
            if candidate is None:
                continue
            hit = self._draws.get(id(candidate))
            if hit is not None and hit[0]() is candidate and candidate.shape == t.shape:
                loc, scale = hit[1], hit[2]
                try:
                    return loc.expand(t.shape), scale.expand(t.shape)
                except RuntimeError:
                    return None
        return None

    def _bias_parts(self, bias: torch.Tensor | None) -> tuple[Any, Any]:
        """(mean, variance or None) of the bias."""
        parts = self._lookup(bias)
        if parts is None:
            return bias, None
        return parts[0], parts[1].square()

    def _linear(self, input: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        linear = self._originals["linear"]
        parts = self._lookup(weight)
        if parts is None:
            return linear(input, weight, bias)
        loc, scale = parts
        b_mean, b_var = self._bias_parts(bias)
        mean = linear(input, loc, b_mean)
        var = linear(input.square(), scale.square(), b_var)
        return mean + torch.sqrt(var + _TINY) * torch.randn_like(mean)

    def _conv(self, conv: Callable) -> Callable:
        def lrt_conv(input: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, *args: Any, **kwargs: Any
                     ) -> torch.Tensor:
            parts = self._lookup(weight)
            if parts is None:
                return conv(input, weight, bias, *args, **kwargs)
            loc, scale = parts
            b_mean, b_var = self._bias_parts(bias)
            mean = conv(input, loc, b_mean, *args, **kwargs)
            var = conv(input.square(), scale.square(), b_var, *args, **kwargs)
            return mean + torch.sqrt(var + _TINY) * torch.randn_like(mean)

        return lrt_conv
