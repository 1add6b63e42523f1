"""A Bayesian network as a Pyro model in one line: network, prior and likelihood.

:class:`BNN` is a plain :class:`~pyro.nn.PyroModule` whose ``forward(x, y)`` is the model:
it runs unchanged in ``NUTS``, in this package's kernels and in ``SVI``, can be printed,
conditioned and traced like any Pyro model, and minibatches with ``subsample_size`` in the
way that keeps the network's priors out of the data plate.
"""

from __future__ import annotations

from typing import Any

import pyro
import torch
from pyro.nn import PyroModule

from pyro_flat import validation
from pyro_flat.likelihoods import Likelihood
from pyro_flat.nn import make_bayesian

__all__ = ["BNN"]


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

    Parameters
    ----------
    net : torch.nn.Module
        The network. A plain module is made Bayesian in place by
        :func:`pyro_flat.nn.make_bayesian` (with ``prior_scale`` and ``**prior_options``); a
        module that is already a ``PyroModule`` is used as it is.
    likelihood : pyro_flat.likelihoods.Likelihood
        E.g. ``Categorical()``, ``Bernoulli()``, ``HomoskedasticGaussian()`` (learned noise),
        ``HeteroskedasticGaussian()``.
    prior_scale : float
        The prior standard deviation of the network's parameters (see ``make_bayesian``).
    subsample_size : int, optional
        ``B``: the minibatch of each model run (SVI steps, SG-MCMC steps). ``None``: all data.
    **prior_options
        Passed to :func:`~pyro_flat.nn.make_bayesian` (``scale_rule``, ``include``, ...).

    Examples
    --------
    >>> import torch, pyro
    >>> pyro.set_rng_seed(0)
    >>> from pyro.infer import MCMC, NUTS
    >>> from pyro_flat.bnn import BNN
    >>> from pyro_flat.likelihoods import HomoskedasticGaussian
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
            raise ValueError(f"likelihood must be a pyro_flat.likelihoods.Likelihood (e.g. "
                             f"Categorical() or HomoskedasticGaussian()), got {likelihood!r}")
        super().__init__()
        self.net = net if isinstance(net, PyroModule) else make_bayesian(
            net, prior_scale, **prior_options)
        self.likelihood = likelihood
        self.subsample_size = None if subsample_size is None else validation.integer_at_least(
            "subsample_size", subsample_size, 1)

    def extra_repr(self) -> str:
        return f"likelihood={self.likelihood!r}, subsample_size={self.subsample_size}"

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Run the model on inputs ``x`` (``(N, ...)``) and targets ``y`` (``(N,)``, or
        ``None`` to sample them); returns the targets of the minibatch."""
        n = x.shape[0]
        if y is not None and len(y) != n:
            raise ValueError(f"y must hold one target per row of x: len(x) = {n}, "
                             f"len(y) = {len(y)}")
        latents = self.likelihood.latents()
        size = None if self.subsample_size is None else min(self.subsample_size, n)
        plate = pyro.plate("data", n, subsample_size=size)
        with plate as ind:
            pass
        out = self.net(x[ind])
        with plate:
            return pyro.sample("obs", self.likelihood.distribution(out, latents),
                               obs=None if y is None else y[ind])
