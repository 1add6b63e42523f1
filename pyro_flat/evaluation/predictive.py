"""Bayesian model averaging: predictive probabilities of a Bayesian network from posterior draws.

For draws :math:`\\theta_1, \\dots, \\theta_S` of the network's weights (``mcmc.get_samples()``),
the posterior predictive of a classifier is estimated by

.. math:: p(y \\mid x, \\mathcal{D}) \\approx \\frac1S \\sum_{s=1}^S
    \\operatorname{softmax}\\big(f_{\\theta_s}(x)\\big)_y .

Draws of a fitted guide (SVI, HWA's averaged guide) come from :func:`guide_draws` in the same
``{site: (num_draws, ...)}`` form, so the same tools serve MCMC and SVI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyro.poutine as poutine
import pyro.util
import torch

from pyro_flat import validation
from pyro_flat.target.sites import latent_sites

__all__ = ["bma_probs", "draw_outputs", "guide_draws"]


def _latent_sites(net: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Size]:
    """Names and value shapes of the sample sites of one forward pass of ``net`` on ``x``.

    The pass draws from the priors; the random state is restored, so that predicting does not
    shift the random streams of the caller.
    """
    rng = pyro.util.get_rng_state()
    try:
        with torch.no_grad():
            trace = poutine.trace(net).get_trace(x)
    except (RuntimeError, ValueError, IndexError) as e:
        raise ValueError(
            f"model_net cannot run on x of shape (num_data, *{tuple(x.shape[1:])}) "
            f"({str(e).splitlines()[0]}); x must hold one input of the shape the network "
            "takes per row"
        ) from e
    finally:
        pyro.util.set_rng_state(rng)
    return {name: site["value"].shape for name, site in latent_sites(trace).items()}


def _check_samples(
    samples: Mapping[str, torch.Tensor], sites: dict[str, torch.Size]
) -> tuple[dict[str, torch.Tensor], int]:
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError(
            "samples must be a non-empty dict {site: tensor of shape (num_draws, *site_shape)}, "
            "as mcmc.get_samples() returns"
        )
    missing = sorted(set(sites) - set(samples))
    if missing:
        raise ValueError(
            f"samples has no draws for the network's sample sites {missing}; it holds "
            f"{sorted(samples)}"
        )
    draws = {name: samples[name] for name in sites}
    num_draws = None
    for name, shape in sites.items():
        value = draws[name]
        if not torch.is_tensor(value) or value.dim() < 1 or value.shape[1:] != shape:
            got = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise ValueError(
                f"samples[{name!r}] must have shape (num_draws, *{tuple(shape)}), got {got} "
                "(pass mcmc.get_samples(), not group_by_chain=True)"
            )
        bad = torch.nonzero(~torch.isfinite(value.reshape(len(value), -1)).all(1)).flatten() \
            if value.numel() else []
        if len(bad):
            raise ValueError(
                f"samples[{name!r}] holds NaN or inf in {len(bad)} draws (the first: "
                f"{bad[:5].tolist()}); drop them before averaging, e.g. the draws marked "
                "diverging in the run's sample_stats"
            )
        if num_draws is None:
            num_draws = value.shape[0]
        elif value.shape[0] != num_draws:
            raise ValueError(
                f"every site of samples must hold the same number of draws; "
                f"samples[{name!r}] has {value.shape[0]}, others {num_draws}"
            )
    if not num_draws:
        raise ValueError("samples holds no draws (num_draws = 0)")
    return draws, num_draws


def _draws_for(model_net: torch.nn.Module, samples: Mapping[str, torch.Tensor],
               x: torch.Tensor) -> tuple[dict[str, torch.Tensor], int]:
    """``samples`` checked against the sites of ``model_net`` on inputs ``x`` (checked too)."""
    if not torch.is_tensor(x) or x.dim() < 1 or x.shape[0] == 0:
        got = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ValueError(
            f"x must be a tensor of shape (num_data, ...) with num_data >= 1, got {got}"
        )
    return _check_samples(samples, _latent_sites(model_net, x[:1]))


def bma_probs(
    model_net: torch.nn.Module,
    samples: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    *,
    batch_size: int = 1024,
    return_per_draw: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Bayesian-model-average class probabilities ``mean_s softmax(net_s(x))``.

    Each draw is plugged into the network with :func:`pyro.poutine.condition`, and the network
    runs on ``x`` in chunks of ``batch_size`` rows under ``torch.no_grad()``. Only a running
    sum of probabilities is kept, so memory is one chunk of activations plus the
    ``(num_data, num_classes)`` result, whatever the number of draws (unless
    ``return_per_draw``). The network runs on the device of ``x`` (put ``x`` where the model
    is): draws kept elsewhere, e.g. MCMC draws on the CPU for a model on a GPU, are moved
    there one at a time. The global random state is left as it was.

    Parameters
    ----------
    model_net : torch.nn.Module
        The Bayesian network, e.g. from :func:`pyro_flat.models.nn.make_bayesian`, returning logits
        of shape ``(batch, num_classes)``. Its mode is left as it is: call ``model_net.eval()``
        first if it has dropout or batch normalisation.
    samples : dict of str to torch.Tensor
        Posterior draws ``{site: tensor of shape (num_draws, *site_shape)}``, as
        ``mcmc.get_samples()`` returns. It must hold every sample site of the network; other
        entries (latent sites of the model outside the network) are ignored.
    x : torch.Tensor
        Inputs of shape ``(num_data, *input_shape)``.
    batch_size : int
        Rows of ``x`` per forward pass, ``>= 1``.
    return_per_draw : bool
        Also return the probabilities of each draw.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``(num_data, num_classes)`` averaged probabilities; with ``return_per_draw``, also the
        ``(num_draws, num_data, num_classes)`` probabilities of each draw.

    Raises
    ------
    ValueError
        If ``samples`` lacks a sample site of the network, its shapes do not match the sites,
        the sites hold different numbers of draws or a non-finite draw, ``x`` is empty or does
        not fit the network, ``batch_size`` is not a positive integer, or the network does not
        return ``(batch, num_classes)`` logits.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.models.nn import make_bayesian
    >>> from pyro_flat.evaluation.predictive import bma_probs
    >>> net = make_bayesian(torch.nn.Linear(3, 4))
    >>> samples = {"weight": torch.randn(10, 4, 3), "bias": torch.randn(10, 4)}
    >>> probs = bma_probs(net, samples, torch.randn(7, 3))
    >>> probs.shape, bool(torch.allclose(probs.sum(-1), torch.ones(7)))
    (torch.Size([7, 4]), True)
    """
    batch_size = validation.integer_at_least("batch_size", batch_size, 1)
    draws, num_draws = _draws_for(model_net, samples, x)

    total = None
    per_draw = None
    with torch.no_grad():
        for s in range(num_draws):
            draw = {k: v[s].to(x.device, non_blocking=True) for k, v in draws.items()}
            net_s = poutine.condition(model_net, data=draw)
            for start in range(0, x.shape[0], batch_size):
                logits = net_s(x[start : start + batch_size])
                if not torch.is_tensor(logits) or logits.dim() != 2:
                    got = tuple(logits.shape) if torch.is_tensor(logits) else type(logits)
                    raise ValueError(
                        f"model_net must return logits of shape (batch, num_classes), got {got}"
                    )
                probs = torch.softmax(logits, dim=-1)
                if total is None:
                    total = probs.new_zeros((x.shape[0], probs.shape[1]))
                    if return_per_draw:
                        per_draw = probs.new_empty((num_draws, *total.shape))
                total[start : start + batch_size] += probs
                if per_draw is not None:
                    per_draw[s, start : start + batch_size] = probs
    mean = total / num_draws
    return (mean, per_draw) if return_per_draw else mean


def draw_outputs(
    model_net: torch.nn.Module,
    samples: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    *,
    batch_size: int = 1024,
) -> torch.Tensor:
    """The raw output of the network for every draw, ``(num_draws, num_data, *output_shape)``.

    What :func:`bma_probs` averages after a softmax, for networks whose outputs are not logits,
    e.g. the mean and raw scale of a heteroscedastic regression
    (:class:`pyro_flat.models.likelihoods.HeteroskedasticGaussian`). Each draw is plugged in with
    :func:`pyro.poutine.condition` and the network runs on ``x`` in chunks of ``batch_size``
    rows under ``torch.no_grad()``, on the device of ``x``; the global random state is left as
    it was. ``samples`` is checked as by :func:`bma_probs`.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.models.nn import make_bayesian
    >>> net = make_bayesian(torch.nn.Linear(3, 2))
    >>> samples = {"weight": torch.randn(5, 2, 3), "bias": torch.randn(5, 2)}
    >>> draw_outputs(net, samples, torch.randn(7, 3)).shape
    torch.Size([5, 7, 2])
    """
    batch_size = validation.integer_at_least("batch_size", batch_size, 1)
    draws, num_draws = _draws_for(model_net, samples, x)
    out = []
    with torch.no_grad():
        for s in range(num_draws):
            draw = {k: v[s].to(x.device, non_blocking=True) for k, v in draws.items()}
            net_s = poutine.condition(model_net, data=draw)
            out.append(torch.cat([net_s(x[start : start + batch_size])
                                  for start in range(0, x.shape[0], batch_size)]))
    return torch.stack(out)


def guide_draws(
    guide: Callable[..., Any], num_samples: int, *args: Any, **kwargs: Any
) -> dict[str, torch.Tensor]:
    """Draws of the latent sites of a fitted guide, ``{site: (num_samples, *site_shape)}``.

    The guide runs ``num_samples`` times on ``args``/``kwargs`` (the model's arguments) under
    ``torch.no_grad()``; its auxiliary sites (e.g. ``AutoDiagonalNormal``'s joint latent) are
    left out, so the result has the model's site names, as ``mcmc.get_samples()``: feed it to
    :func:`bma_probs`, :func:`pyro_flat.to_arviz` or :class:`pyro.infer.Predictive`
    (``posterior_samples=``). HWA's :meth:`~pyro_flat.infer.HWA.averaged_guide` is a guide too.

    Parameters
    ----------
    guide : callable
        A guide whose parameters exist (it has run at least once, e.g. one ``svi.step``).
    num_samples : int
        Number of draws, ``>= 1``.
    *args, **kwargs
        The arguments of the model (and guide).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer.autoguide import AutoDiagonalNormal
    >>> def model(x):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(x @ w, 1.0), obs=torch.zeros(len(x)))
    >>> guide = AutoDiagonalNormal(model)
    >>> x = torch.randn(5, 2)
    >>> _ = guide(x)
    >>> {k: tuple(v.shape) for k, v in guide_draws(guide, 10, x).items()}
    {'w': (10, 2)}
    """
    num_samples = validation.integer_at_least("num_samples", num_samples, 1)
    draws: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), poutine.block():  # unseen by handlers outside this call
        for _ in range(num_samples):
            trace = poutine.trace(guide).get_trace(*args, **kwargs)
            for name, site in trace.nodes.items():
                if site["type"] != "sample" or site["infer"].get("is_auxiliary"):
                    continue
                draws.setdefault(name, []).append(site["value"].detach())
    if not draws:
        raise ValueError("the guide has no latent sample sites to draw")
    return {name: torch.stack(values) for name, values in draws.items()}
