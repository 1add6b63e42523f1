r"""Kernel Stein discrepancy: how far a set of draws is from the posterior, from the draws and
the posterior's score alone (no reference run, no normalising constant).

With the score :math:`s(x) = \nabla \log \pi(x) = -\nabla U(x)` and a kernel :math:`k`, the
Stein kernel

.. math::

    k_\pi(x, y) = s(x)^\top s(y)\, k(x, y) + s(x)^\top \nabla_y k(x, y)
                  + s(y)^\top \nabla_x k(x, y) + \operatorname{tr} \nabla_x \nabla_y k(x, y)

has mean zero under :math:`\pi`, and the discrepancy of weighted draws :math:`(x_i, w_i)` is

.. math:: \mathrm{KSD}^2 = \sum_{i,j} w_i w_j\, k_\pi(x_i, x_j).

With the inverse multiquadric kernel :math:`k(x, y) = (c^2 + \lVert x - y\rVert^2 /
\ell^2)^\beta`, :math:`\beta \in (-1, 0)`, it goes to zero exactly when the draws converge to
:math:`\pi` (Gorham & Mackey, 2017, Theorem 8), which is why it suits SG-MCMC: it sees the bias
of a finite step, which R-hat and ESS do not.

Estimators. The V-statistic above (``estimator="v"``) of :math:`n` exact draws has expectation
:math:`\mathbb{E}[k_\pi(X, X)]/n`: it falls as :math:`1/n` for a correct sampler and tends to
the population value for a biased one. The U-statistic (``"u"``, :math:`i \ne j` only,
renormalised) is unbiased for the population :math:`\mathrm{KSD}^2` (zero for a correct
sampler, so it can be negative). With minibatch scores (:func:`stein_discrepancy` with
``subsample_size``) each draw gets its own independent minibatch: the Stein kernel is linear in
each score, so the U-statistic stays unbiased, while the V-statistic's diagonal would add the
minibatch noise; the U-statistic is then the default.

Scores are taken in the unconstrained space the SG-MCMC kernels move in (the potential there
includes the log-Jacobian of each site's transform), and the discrepancy is not invariant to
that choice or to the kernel's scale :math:`\ell`: compare methods with the same settings on the
same model.

References
----------
Gorham, J. and Mackey, L. (2017). Measuring sample quality with kernels. ICML.
Liu, Q., Lee, J. and Jordan, M. (2016). A kernelized Stein discrepancy for goodness-of-fit
tests. ICML.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import pyro
import torch
from pyro.infer.autoguide.initialization import init_to_sample

from pyro_flat import validation
from pyro_flat.target import ModelPotential, Target, trace_model

__all__ = ["ModelScores", "imq_stein_kernel", "kernel_stein_discrepancy", "model_scores",
           "stein_discrepancy"]


class ModelScores(NamedTuple):
    """Draws as flat unconstrained vectors and their scores (:func:`model_scores`)."""

    #: ``(n, d)``, the sites in the model's order, each flattened.
    draws: torch.Tensor
    #: ``(n, d)``, :math:`-\nabla U` at each draw.
    scores: torch.Tensor
    #: Whether the scores are minibatch estimates (unbiased, noisy).
    minibatched: bool


def imq_stein_kernel(x: torch.Tensor, score_x: torch.Tensor, y: torch.Tensor,
                     score_y: torch.Tensor, c: float = 1.0, beta: float = -0.5,
                     lengthscale: float = 1.0) -> torch.Tensor:
    r"""The Stein kernel :math:`k_\pi(x_i, y_j)` of the inverse multiquadric kernel
    :math:`(c^2 + \lVert x - y\rVert^2/\ell^2)^\beta`, for every pair: ``(n, m)`` from draws
    ``x`` ``(n, d)`` and ``y`` ``(m, d)`` and their scores.

    With :math:`r = x - y` and :math:`q = c^2 + \lVert r\rVert^2/\ell^2`:

    .. math::

        k_\pi = q^\beta\, s_x^\top s_y + \frac{2\beta q^{\beta-1}}{\ell^2} (s_y - s_x)^\top r
                - \frac{2\beta}{\ell^2}\Big(d\, q^{\beta-1}
                + \frac{2(\beta-1)}{\ell^2} q^{\beta-2} \lVert r\rVert^2\Big)

    Examples
    --------
    >>> import torch
    >>> x = torch.zeros(1, 2)
    >>> imq_stein_kernel(x, -x, x, -x)  # at the mode of N(0, I): -2 beta d / c^3 = 2
    tensor([[2.]])
    """
    d = x.shape[-1]
    ell2 = lengthscale * lengthscale
    r2 = torch.cdist(x, y).square()
    q = c * c + r2 / ell2
    # (s_y - s_x)^T (x - y), pairwise, without forming the (n, m, d) differences
    cross = (x @ score_y.T - (score_y * y).sum(-1)[None, :]
             - (score_x * x).sum(-1)[:, None] + score_x @ y.T)
    q_b1 = q.pow(beta - 1.0)
    return (q * q_b1 * (score_x @ score_y.T)
            + (2.0 * beta / ell2) * q_b1 * cross
            - (2.0 * beta / ell2) * (d * q_b1 + (2.0 * (beta - 1.0) / ell2) * r2 * q_b1 / q))


def _check_kernel(c: float, beta: float, lengthscale: float) -> None:
    if not (isinstance(c, int | float) and math.isfinite(c) and c > 0):
        raise ValueError(f"c must be a finite number in (0, inf), got {c!r}")
    if not (isinstance(beta, int | float) and -1.0 < beta < 0.0):
        raise ValueError(f"beta must be in (-1, 0) (the IMQ kernel's exponent), got {beta!r}")
    if not (isinstance(lengthscale, int | float) and math.isfinite(lengthscale)
            and lengthscale > 0):
        raise ValueError(f"lengthscale must be a finite number in (0, inf), got {lengthscale!r}")


def kernel_stein_discrepancy(
    draws: torch.Tensor,
    scores: torch.Tensor,
    *,
    log_weights: torch.Tensor | None = None,
    estimator: str = "v",
    c: float = 1.0,
    beta: float = -0.5,
    lengthscale: float = 1.0,
    block_size: int = 2048,
) -> float:
    r"""The kernel Stein discrepancy of draws ``(n, d)`` whose scores
    :math:`\nabla \log \pi` are ``scores`` ``(n, d)``, with the IMQ kernel.

    Target: :math:`\mathrm{KSD}^2 = \sum_{i,j} w_i w_j k_\pi(x_i, x_j)` (module docstring).

    Parameters
    ----------
    draws, scores : torch.Tensor
        ``(n, d)``, flat (``n`` draws of every chain).
    log_weights : torch.Tensor, optional
        ``(n,)`` unnormalised log importance weights (e.g. ContourSGLD's ``log_weight``);
        default equal weights.
    estimator : {"v", "u"}
        The V-statistic (all pairs; non-negative) or the U-statistic (pairs :math:`i \ne j`,
        weights renormalised; unbiased for the population value, may be negative).
    c, beta, lengthscale : float
        The IMQ kernel :math:`(c^2 + \lVert x-y\rVert^2/\ell^2)^\beta`; ``c > 0``,
        ``-1 < beta < 0``, ``lengthscale > 0``.
    block_size : int
        Rows of the ``n x n`` Stein kernel matrix formed at a time (memory ``block_size * n``).

    Returns
    -------
    float
        :math:`\mathrm{KSD}` (the square root) for ``"v"``; the signed square root
        :math:`\mathrm{sign}(\mathrm{KSD}^2_U)\sqrt{|\mathrm{KSD}^2_U|}` for ``"u"``.

    Examples
    --------
    >>> import torch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> x = torch.randn(500, 2)  # exact draws of N(0, I), whose score is -x
    >>> good = kernel_stein_discrepancy(x, -x)
    >>> bad = kernel_stein_discrepancy(x + 0.5, -(x + 0.5))  # shifted draws
    >>> good < bad
    True

    References
    ----------
    Gorham, J. and Mackey, L. (2017). Measuring sample quality with kernels. ICML.
    """
    _check_kernel(c, beta, lengthscale)
    block_size = validation.integer_at_least("block_size", block_size, 1)
    if estimator not in ("v", "u"):
        raise ValueError(f"estimator must be 'v' or 'u', got {estimator!r}")
    if draws.dim() != 2 or scores.shape != draws.shape:
        raise ValueError(f"draws and scores must both be (n, d), got {tuple(draws.shape)} and "
                         f"{tuple(scores.shape)}")
    n = draws.shape[0]
    if n < 2:
        raise ValueError(f"draws must hold at least 2 draws, got {n}")
    if not (torch.isfinite(draws).all() and torch.isfinite(scores).all()):
        raise ValueError("draws and scores must be finite (a diverged draw has no score)")
    x, s = draws.double(), scores.double()
    if log_weights is None:
        w = torch.full((n,), 1.0 / n, dtype=torch.float64, device=x.device)
    else:
        if log_weights.shape != (n,):
            raise ValueError(f"log_weights must be ({n},), got {tuple(log_weights.shape)}")
        w = torch.softmax(log_weights.double().to(x.device), 0)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    diagonal = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, n, block_size):
        rows = slice(start, min(start + block_size, n))
        k = imq_stein_kernel(x[rows], s[rows], x, s, c, beta, lengthscale)
        total = total + w[rows] @ k @ w
        diagonal = diagonal + (w[rows].square() * k.diagonal(offset=start)).sum()
    if estimator == "v":
        return math.sqrt(max(float(total), 0.0))
    off_diagonal = 1.0 - float(w.square().sum())
    if off_diagonal <= 1e-12:
        raise ValueError("the U-statistic needs weight on at least two draws (log_weights put "
                         "all of it on one)")
    ksd2 = float(total - diagonal) / off_diagonal
    return math.copysign(math.sqrt(abs(ksd2)), ksd2)


def model_scores(
    model: Callable,
    samples: Mapping[str, torch.Tensor],
    *model_args: object,
    subsample_size: int | None = None,
    seed: int = 0,
    **model_kwargs: object,
) -> ModelScores:
    r"""Draws of a Pyro model's latent sites as flat unconstrained vectors, with their scores
    :math:`-\nabla U` (the model's potential in that space, as the SG-MCMC kernels see it).

    Parameters
    ----------
    model : callable
        The Pyro model the draws are of.
    samples : mapping
        Site name to ``(n, *site shape)`` constrained values, e.g. ``mcmc.get_samples()``;
        every latent site of the model.
    *model_args, **model_kwargs
        The model's data, as given to ``MCMC.run``.
    subsample_size : int, optional
        ``None``: exact scores on all the data. ``B``: unbiased minibatch scores, an
        independent minibatch of ``B`` points per draw, scaled by ``N / B``. A model that
        subsamples its own plate (``pyro.plate("data", N, subsample_size=B)``) is always scored
        on its own minibatches, one per draw (``subsample_size`` must then be ``None`` or its
        ``B``); give its full-batch version for exact scores.
    seed : int
        Seeds the minibatches (the global random state is left as it was).

    Returns
    -------
    ModelScores
        ``(draws, scores, minibatched)``, the first two ``(n, d)``.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(0.0, s), obs=y)
    >>> draws, scores, minibatched = model_scores(model, {"s": torch.ones(3)}, torch.zeros(4))
    >>> draws.squeeze(-1).tolist()  # log s, the unconstrained value
    [0.0, 0.0, 0.0]
    >>> scores.squeeze(-1).tolist()  # d/dz [log p(z) + 4 log N(0; 0, e^z)] at z = 0: -4
    [-4.0, -4.0, -4.0]
    """
    rng = pyro.util.get_rng_state()
    try:
        layout, _, plate, flat_prior, _ = trace_model(model, model_args, model_kwargs,
                                                      init_to_sample)
        if plate is not None:  # the model subsamples its own plate
            if subsample_size is not None and subsample_size != plate.batch_size:
                raise ValueError(
                    f"subsample_size={subsample_size}, but the model subsamples its plate "
                    f"{plate.name!r} by {plate.batch_size}: give that or None")
        elif subsample_size is not None:  # minibatched from outside, as a kernel's
            layout, _, plate, flat_prior, _ = trace_model(
                model, model_args, model_kwargs, init_to_sample, subsample_size)
    finally:
        pyro.util.set_rng_state(rng)
    missing = [s.name for s in layout.sites if s.name not in samples]
    if missing:
        raise ValueError(f"samples has no draws of the model's latent site(s) {missing}; "
                         f"it has {sorted(samples)}")
    sizes = {int(samples[s.name].shape[0]) for s in layout.sites}
    if len(sizes) != 1:
        raise ValueError(f"every site of samples must hold the same number of draws, got {sizes}")
    n = sizes.pop()
    unconstrained = {}
    for site in layout.sites:
        value = torch.as_tensor(samples[site.name])
        if site.transform is not None:
            value = site.transform.inv(value)
        unconstrained[site.name] = value.reshape(n, -1)
    draws = torch.cat([unconstrained[s.name] for s in layout.sites], dim=-1)
    draws = draws.to(layout.flat_dtype([{s.name: samples[s.name] for s in layout.sites}]))
    target = Target(ModelPotential(model, model_args, model_kwargs, layout, plate, flat_prior),
                    layout, plate)
    position = draws[0].clone()
    target.bind(position)
    generator = torch.Generator().manual_seed(seed)
    scores = torch.empty_like(draws)
    for i in range(n):
        position.copy_(draws[i])
        batch = None
        if plate is not None:
            batch = torch.randperm(plate.size, generator=generator)[:plate.batch_size]
        _, grad = target.value_and_grad(position, batch)
        scores[i] = -grad
    return ModelScores(draws, scores, plate is not None)


def stein_discrepancy(
    model: Callable,
    samples: Mapping[str, torch.Tensor],
    *model_args: object,
    subsample_size: int | None = None,
    log_weights: torch.Tensor | None = None,
    estimator: str | None = None,
    c: float = 1.0,
    beta: float = -0.5,
    lengthscale: float = 1.0,
    seed: int = 0,
    **model_kwargs: object,
) -> float:
    r"""The kernel Stein discrepancy of posterior draws of a Pyro model, from the model's own
    gradients: :func:`model_scores`, then :func:`kernel_stein_discrepancy` with the IMQ kernel.

    Target: :math:`\mathrm{KSD}^2 = \sum_{i,j} w_i w_j k_\pi(x_i, x_j)`, the draws
    :math:`x_i` unconstrained, :math:`\pi \propto e^{-U}` the posterior there.

    Parameters
    ----------
    model, samples, *model_args, **model_kwargs
        As :func:`model_scores`: the model, its draws (``mcmc.get_samples()``) and its data.
    subsample_size : int, optional
        ``None``: exact scores; ``B``: minibatch scores (one independent minibatch per draw),
        for data too large to score every draw on (:func:`model_scores`).
    log_weights : torch.Tensor, optional
        ``(n,)`` importance log-weights of the draws (ContourSGLD's ``log_weight``).
    estimator : {"v", "u"}, optional
        Default ``"v"`` with exact scores, ``"u"`` (unbiased under minibatch noise) with
        minibatch scores.
    c, beta, lengthscale, seed
        The IMQ kernel's settings (:func:`kernel_stein_discrepancy`) and the minibatches' seed.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> y = torch.randn(50) + 3.0
    >>> exact = {"mu": y.sum() / (50 + 0.01) + torch.randn(400) / (50 + 0.01) ** 0.5}
    >>> stein_discrepancy(model, exact, y) < stein_discrepancy(model, {"mu": exact["mu"] + 0.3}, y)
    True

    References
    ----------
    Gorham, J. and Mackey, L. (2017). Measuring sample quality with kernels. ICML.
    """
    draws, scores, minibatched = model_scores(
        model, samples, *model_args, subsample_size=subsample_size, seed=seed, **model_kwargs)
    if estimator is None:
        estimator = "u" if minibatched else "v"
    return kernel_stein_discrepancy(draws, scores, log_weights=log_weights, estimator=estimator,
                                    c=c, beta=beta, lengthscale=lengthscale)
