"""A Bayesian network as a Pyro model in one line: network, prior and likelihood.

:class:`BNN` is a plain :class:`~pyro.nn.PyroModule` whose ``forward(x, y)`` is the model:
it runs unchanged in ``NUTS``, in this package's kernels and in ``SVI``, can be printed,
conditioned and traced like any Pyro model, and minibatches with ``subsample_size`` in the
way that keeps the network's priors out of the data plate.
"""

from __future__ import annotations

import inspect
from typing import Any

import pyro
import torch
from pyro.nn import PyroModule

from pyro_flat import validation
from pyro_flat.models.likelihoods import Likelihood
from pyro_flat.models.nn import make_bayesian

__all__ = ["BNN"]


def _targets(y: torch.Tensor, d: Any) -> torch.Tensor:
    """The minibatch's targets in the distribution's shape (the rule in :class:`BNN`)."""
    shape = (*d.batch_shape, *d.event_shape)
    if tuple(y.shape) == (*shape, 1):
        return y.squeeze(-1)
    if y.dim() > len(shape) or tuple(y.shape) != shape[len(shape) - y.dim():]:
        # (the distribution may have leading dimensions of its own: vectorised particles)
        raise ValueError(
            f"BNN: observed site 'obs': the targets of the minibatch have shape "
            f"{tuple(y.shape)} and the likelihood's distribution has shape {shape} (batch "
            f"{tuple(d.batch_shape)}, event {tuple(d.event_shape)}); give one target per row "
            f"of x in the distribution's shape (or with one more trailing dimension of size 1, "
            f"which is dropped), e.g. class indices of shape (N,) for Categorical, not one-hot "
            f"rows")
    return y


class BNN(PyroModule):
    r"""``y_i ~ p(y | f_theta(x_i))`` with ``theta ~ N(0, s^2)``: a network as a Pyro model.

    The model, with ``B = subsample_size`` (or ``N``)::

        latents = likelihood.latents()            # e.g. a learned noise scale
        plate = pyro.plate("data", N, subsample_size=B)
        with plate as ind:                        # draw the minibatch indices first,
            pass
        out = net(x[ind])                         # run the network outside the plate,
        with plate:                               # observe inside it (scaled by N / B)
            pyro.sample("obs", likelihood.distribution(out, latents), obs=y[ind])

    Running the network outside the plate keeps its ``PyroSample`` priors global (inside the
    plate they would be batched over the data). With ``subsample_size=None`` the plate is the
    full batch, the model NUTS takes; our kernels also minibatch it with their own
    ``subsample_size``.

    **Targets.** ``y`` holds one target per row of ``x``, and the minibatch's targets must
    have the shape of the likelihood's distribution (``batch_shape + event_shape``: ``(B,)``
    for the built-in likelihoods; its trailing dimensions, if the distribution has leading
    ones of its own, such as vectorised particles). One rule widens this: targets with one trailing
    dimension of size 1 more than the distribution, e.g. regression targets of shape
    ``(N, 1)`` against a mean of shape ``(B,)``, are read without it (``y.squeeze(-1)``), so
    ``(N,)`` and ``(N, 1)`` give the same model. Any other shape raises ``ValueError`` naming
    the site ``"obs"`` and both shapes (torch would broadcast it silently: ``(B, 1)`` against
    ``(B,)`` scores every target against every mean, a ``(B, B)`` log-density).

    **Dtype.** The likelihood's latent sites (``obs_scale``) take the floating dtype of ``x``
    (torch's default dtype for integer inputs), so a float64 network fed float64 inputs has
    float64 latents too.

    Parameters
    ----------
    net : torch.nn.Module
        The network. A plain module is made Bayesian in place by
        :func:`pyro_flat.models.nn.make_bayesian` (with ``prior_scale`` and ``**prior_options``); a
        module that is already a ``PyroModule`` is used as it is, with its own priors (then
        ``prior_scale`` and ``**prior_options`` are refused, not ignored).
    likelihood : pyro_flat.models.likelihoods.Likelihood
        E.g. ``Categorical()``, ``Bernoulli()``, ``HomoskedasticGaussian()`` (learned noise),
        ``HeteroskedasticGaussian()``.
    prior_scale : float
        The prior standard deviation of the network's parameters (see ``make_bayesian``).
    subsample_size : int, optional
        ``B``: the minibatch of each model run (SVI steps, SG-MCMC steps). ``None``: all data.
    **prior_options
        Passed to :func:`~pyro_flat.models.nn.make_bayesian` (``scale_rule``, ``include``, ...).

    Examples
    --------
    >>> import torch, pyro
    >>> pyro.set_rng_seed(0)
    >>> from pyro.infer import MCMC, NUTS
    >>> from pyro_flat.models.bnn import BNN
    >>> from pyro_flat.models.likelihoods import HomoskedasticGaussian
    >>> net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    >>> model = BNN(net, HomoskedasticGaussian())  # learned noise: the site "obs_scale"
    >>> x = torch.linspace(-1, 1, 30).unsqueeze(1); y = torch.sin(3 * x).squeeze(1)
    >>> mcmc = MCMC(NUTS(model), num_samples=5, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> sorted(mcmc.get_samples())
    ['net.0.bias', 'net.0.weight', 'net.2.bias', 'net.2.weight', 'obs_scale']
    """

    def __init__(
        self,
        net: torch.nn.Module,
        likelihood: Likelihood,
        *,
        prior_scale: float = 1.0,
        subsample_size: int | None = None,
        **prior_options: Any,
    ):
        if not isinstance(likelihood, Likelihood):
            raise ValueError(f"likelihood must be a pyro_flat.models.likelihoods.Likelihood (e.g. "
                             f"Categorical() or HomoskedasticGaussian()), got {likelihood!r}")
        if not isinstance(net, torch.nn.Module):
            raise ValueError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        subsample_size = None if subsample_size is None else validation.integer_at_least(
            "subsample_size", subsample_size, 1)
        if isinstance(net, PyroModule) and (prior_scale != 1.0 or prior_options):
            given = ["prior_scale"] * (prior_scale != 1.0) + sorted(prior_options)
            raise ValueError(f"{', '.join(given)} apply to a plain torch network, which BNN "
                             "makes Bayesian; net is a PyroModule already, with priors of its "
                             "own: set them there (or pass the plain network)")
        super().__init__()
        self.net = net if isinstance(net, PyroModule) else make_bayesian(
            net, prior_scale, **prior_options)
        self.likelihood = likelihood
        self.subsample_size = subsample_size

    def _latents(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The likelihood's latents, in the dtype of ``x`` if its ``latents`` takes one."""
        likelihood = self.likelihood
        takes = self.__dict__.get("_takes_dtype")
        if takes is None or takes[0] is not likelihood:  # inspected once per likelihood
            takes = (likelihood, "dtype" in inspect.signature(likelihood.latents).parameters)
            self.__dict__["_takes_dtype"] = takes
        if not takes[1]:
            return likelihood.latents()
        return likelihood.latents(
            dtype=x.dtype if x.is_floating_point() else torch.get_default_dtype())

    def extra_repr(self) -> str:
        return f"likelihood={self.likelihood!r}, subsample_size={self.subsample_size}"

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Run the model on inputs ``x`` (``(N, ...)``) and targets ``y`` (``(N,)``, ``(N,
        1)`` read as ``(N,)``, or ``None`` to sample them); returns the targets of the
        minibatch."""
        n = x.shape[0]
        if y is not None and len(y) != n:
            raise ValueError(f"y must hold one target per row of x: len(x) = {n}, "
                             f"len(y) = {len(y)}")
        latents = self._latents(x)
        size = None if self.subsample_size is None else min(self.subsample_size, n)
        plate = pyro.plate("data", n, subsample_size=size)
        with plate as ind:
            pass
        out = self.net(x[ind])
        with plate:
            d = self.likelihood.distribution(out, latents)
            return pyro.sample("obs", d, obs=None if y is None else _targets(y[ind], d))
