r"""Flatness of a BNN posterior, measured on its draws.

The sharpness of Nguyen et al. (2023) at a parameter :math:`\theta` is the rise of the training
loss after one normalised ascent step of length :math:`\rho`,

.. math:: S_\rho(\theta) = L\big(\theta + \rho\, g / \|g\|_2\big) - L(\theta),
    \qquad g = \nabla L(\theta),

with :math:`L` the mean negative log-likelihood over the data and the norm taken over all
parameters together; the paper reports its mean over posterior draws. Every function here works
on copies of the draws and never changes the network or the draws it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyro.poutine as poutine
import torch
import torch.nn.functional as F

from pyro_flat import validation


def _mean_nll(net: Callable, params: Mapping[str, torch.Tensor], x, y, task: str) -> torch.Tensor:
    out = poutine.condition(net, data=dict(params))(x)
    if task == "classification":
        return F.cross_entropy(out, y)
    return 0.5 * (out.squeeze(-1) - y).square().mean()


def sharpness(
    net: Callable,
    draws: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    rho: float = 0.05,
    task: str = "classification",
) -> torch.Tensor:
    r"""Sharpness :math:`S_\rho` of every draw, on the data ``(x, y)``.

    Parameters
    ----------
    net : callable
        The Bayesian network (e.g. from :func:`pyro_flat.nn.make_bayesian`): ``net(x)`` returns
        logits (classification) or predictions (regression, squared-error loss).
    draws : dict
        ``{site: tensor(num_draws, *shape)}``, e.g. ``mcmc.get_samples()``; sites the network
        does not sample are ignored.
    x, y : torch.Tensor
        The data the loss is measured on (the paper uses the training set).
    rho : float
        The radius of the ascent step, ``> 0``.
    task : {"classification", "regression"}
        Cross-entropy of logits, or half the squared error.

    Returns
    -------
    torch.Tensor
        ``(num_draws,)`` sharpness values; their mean is the paper's measure.

    Example
    -------
    >>> import torch
    >>> from pyro_flat.nn import make_bayesian
    >>> net = make_bayesian(torch.nn.Linear(3, 2))
    >>> draws = {"weight": torch.randn(4, 2, 3), "bias": torch.randn(4, 2)}
    >>> sharpness(net, draws, torch.randn(10, 3), torch.randint(0, 2, (10,))).shape
    torch.Size([4])

    References
    ----------
    Nguyen, V.-A. et al. (2023). Flat seeking Bayesian neural networks. NeurIPS.
    """
    rho = validation.positive("rho", rho)
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    sites = _sampled_sites(net, x[:1])
    missing = [s for s in sites if s not in draws]
    if missing:
        raise ValueError(f"draws lack the network's sites {missing}")
    out = []
    for i in range(len(draws[sites[0]])):
        params = {s: draws[s][i].detach().clone().requires_grad_() for s in sites}
        with torch.enable_grad():
            loss = _mean_nll(net, params, x, y, task)
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in
                 zip(grads, params.values(), strict=True)]
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        with torch.no_grad():
            scale = rho / torch.clamp(norm, min=1e-12)
            moved = {s: p + scale * g for (s, p), g in zip(params.items(), grads, strict=True)}
            out.append(_mean_nll(net, moved, x, y, task) - loss.detach())
    return torch.stack(out)


def _sampled_sites(net: Callable, x: torch.Tensor) -> list[str]:
    with torch.no_grad():
        trace = poutine.trace(net).get_trace(x)
    return [n for n, s in trace.nodes.items() if s["type"] == "sample" and not s["is_observed"]]
