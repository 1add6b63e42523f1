r"""Convergence diagnostics of multi-chain draws: rank-normalised split R-hat and bulk effective
sample size (Vehtari et al. 2021), computed by ArviZ, on torch tensors shaped as Pyro's
``mcmc.get_samples(group_by_chain=True)`` gives them.

.. math:: \hat R = \sqrt{\frac{\frac{N-1}{N} W + B/N}{W}}

on the normal scores of the ranks of the split chains (and of the folded draws; the larger is
returned), :math:`W` the mean within-chain variance and :math:`B/N` the variance of the chain
means; the bulk ESS is Stan's effective sample size of the same rank-normalised split chains.

Examples
--------
>>> import torch
>>> from pyro_flat.diagnostics import bulk_ess, split_rhat
>>> draws = torch.randn(4, 500, 3, generator=torch.Generator().manual_seed(0))
>>> bool((split_rhat(draws) < 1.01).all()), bool((bulk_ess(draws) > 1000).all())
(True, True)

References
----------
Vehtari, A., Gelman, A., Simpson, D., Carpenter, B. & Bürkner, P.-C. (2021). Rank-normalization,
folding, and localization: an improved R-hat for assessing convergence of MCMC. Bayesian
Analysis 16(2).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

__all__ = ["bulk_ess", "split_rhat"]


def _dataset(draws: torch.Tensor, name: str = "draws") -> object:
    """``draws`` ``(num_chains, num_draws, *shape)`` as an ArviZ dataset of one variable."""
    if not torch.is_tensor(draws) or draws.dim() < 2 or draws.shape[1] < 4:
        got = tuple(draws.shape) if torch.is_tensor(draws) else type(draws).__name__
        raise ValueError(f"{name} must be a tensor of shape (num_chains, num_draws >= 4, ...), "
                         f"got {got}")
    import arviz as az

    x = draws.detach().to("cpu", torch.float64).numpy()
    return az.convert_to_dataset({"x": x})


def _arviz(function: str, draws: torch.Tensor, method: str) -> torch.Tensor:
    import arviz as az

    data = _dataset(draws)
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # constant or stuck chains: nan, inf
        value = getattr(az, function)(data, method=method)["x"]
    return torch.as_tensor(np.asarray(value, dtype=np.float64)).reshape(draws.shape[2:])


def split_rhat(draws: torch.Tensor) -> torch.Tensor:
    r"""Rank-normalised split R-hat of each element of a parameter, by ArviZ
    (``arviz.rhat(..., method="rank")``).

    Values near 1 say the chains agree; Vehtari et al. recommend :math:`\hat R < 1.01`. It is
    ``nan`` for an element whose draws are all equal, and ``inf`` if the chains are stuck at
    different values.

    Parameters
    ----------
    draws : torch.Tensor
        ``(num_chains, num_draws, *shape)`` draws, ``num_draws >= 4``, as
        ``mcmc.get_samples(group_by_chain=True)[site]``.

    Returns
    -------
    torch.Tensor
        float64 R-hat of shape ``shape``.
    """
    return _arviz("rhat", draws, "rank")


def bulk_ess(draws: torch.Tensor) -> torch.Tensor:
    r"""Bulk effective sample size of each element of a parameter, by ArviZ
    (``arviz.ess(..., method="bulk")``): how many independent draws would estimate the centre
    of the distribution as well. Vehtari et al. recommend at least 100 per chain. It is capped
    at :math:`S \log_{10} S` for ``S`` draws in all (antithetic chains can exceed ``S``).

    Parameters
    ----------
    draws : torch.Tensor
        ``(num_chains, num_draws, *shape)`` draws, ``num_draws >= 4``.

    Returns
    -------
    torch.Tensor
        float64 ESS of shape ``shape``.
    """
    return _arviz("ess", draws, "bulk")
