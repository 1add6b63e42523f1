"""The latent sample sites of a Pyro trace."""

from __future__ import annotations

from typing import Any

from pyro.poutine import Trace
from pyro.poutine.util import site_is_subsample

__all__ = ["latent_sites"]


def latent_sites(trace: Trace) -> dict[str, dict[str, Any]]:
    """The latent sample sites of ``trace``, by name, in execution order.

    A site is latent when it is a sample site that is neither observed (``obs=...``, or set by
    ``poutine.condition``) nor a plate's subsample (index) site. Deterministic sites
    (``pyro.deterministic``) are observed and so not latent.

    Parameters
    ----------
    trace : pyro.poutine.Trace
        A trace of a model run, e.g. ``poutine.trace(model).get_trace(*args)``.

    Returns
    -------
    dict of str to dict
        ``{name: site}`` with Pyro's site dicts (``"fn"``, ``"value"``, ...).

    Examples
    --------
    >>> import pyro, pyro.distributions as dist, torch
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y), subsample_size=2):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[:2])
    >>> list(latent_sites(pyro.poutine.trace(model).get_trace(torch.zeros(5))))
    ['mu']
    """
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }
