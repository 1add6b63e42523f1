r"""Observed sites whose value and distribution broadcast into a larger log-density: an error.

``dist.Normal(mean, s).log_prob(y)`` with ``mean`` of shape ``(B,)`` and targets ``y`` of
shape ``(B, 1)`` is a ``(B, B)`` tensor: every target scored against every mean, a loss ``B``
times too large, and no error from torch. Pyro's ``Trace_ELBO`` refuses it (its shape check
wants every dimension of a log-density to be a plate's); the kernels' potential,
:class:`~pyro_flat.infer.LeanELBO`, :func:`pyro_flat.to_arviz` and :class:`pyro_flat.models.bnn.BNN`
check it with :func:`check_observed_site`, once per model trace (never per SG step).

The rule. Let ``value`` be the observed value with its event dimensions removed and ``lp`` the
shape of the log-density (``value`` broadcast with the distribution's batch shape, after the
enclosing plates have broadcast the distribution). The site is an error if

1. ``lp`` has more elements than both ``value`` and the distribution's batch shape: both were
   expanded, so each observation is scored against several distribution elements (the
   ``(B, 1)`` against ``(B,)`` case); or
2. along a dimension of ``lp`` that is no plate's, ``lp`` is larger than ``value``: the same
   observation is scored against several distribution elements that no plate declares
   (targets ``(B,)`` in ``pyro.plate("data", B)`` against a network output ``(B, 1)``, which
   the plate broadcasts to ``(B, B)``).

Equivalently: the log-density has at most as many elements as its plates (their subsample
sizes) times the sizes of the value's own other dimensions, and at most as many as the
larger of the value and the distribution. Each observation is then scored once per plate
element it is shared over and never more, as in a model Pyro's ``Trace_ELBO`` accepts; a
value shared by a distribution's elements inside a plate (a scalar observation in a plate)
and i.i.d. observations of one distribution without a plate (``obs=y`` of shape ``(N,)``
against a scalar distribution, which NUTS accepts) stay allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["check_observed_site", "observed_shape_error"]


def observed_shape_error(name: str, fn: Any, value: Any, frames: Iterable[Any] = ()
                         ) -> str | None:
    """The message of :func:`check_observed_site` for site ``name``, or None if it is fine.

    Parameters
    ----------
    name : str
        The site's name.
    fn : torch.distributions.Distribution
        Its distribution, as the plates have broadcast it.
    value : torch.Tensor
        The observed value.
    frames : iterable
        The site's ``cond_indep_stack`` (Pyro's plate frames).
    """
    if not torch.is_tensor(value) or not hasattr(fn, "batch_shape"):
        return None
    batch, event = tuple(fn.batch_shape), tuple(getattr(fn, "event_shape", ()))
    vshape = tuple(value.shape)
    vbatch = vshape[:max(len(vshape) - len(event), 0)]
    try:
        lp = tuple(torch.broadcast_shapes(vbatch, batch))
    except RuntimeError:
        return None  # not broadcastable: the distribution's log_prob raises its own error
    plates = {f.dim: f.size for f in frames
              if getattr(f, "vectorized", True) and f.dim is not None}
    n_lp, n_value, n_fn = math.prod(lp), math.prod(vbatch), math.prod(batch)
    why = None
    if n_lp > max(n_value, n_fn):
        why = (f"{n_lp} log-density terms for {n_value} observation(s) and {n_fn} "
               "distribution element(s): every observation is scored against several "
               "distribution elements")
    else:
        for d in range(-len(lp), 0):
            own = vbatch[d] if -d <= len(vbatch) else 1
            if d not in plates and lp[d] != own:
                why = (f"along dim {d}, which is no plate's, the log-density has size "
                       f"{lp[d]} and the value {own}: each observation is scored "
                       f"{lp[d] // max(own, 1)} times")
                break
    if why is None:
        return None
    plate_text = ", ".join(f"{f.name!r} (dim {f.dim}, size {f.size})" for f in frames
                           if getattr(f, "vectorized", True) and f.dim is not None) or "none"
    return (
        f"observed site {name!r}: the value of shape {vshape} and the distribution of shape "
        f"{batch + event} (batch {batch}, event {event}) broadcast to a log-density of shape "
        f"{lp}, larger than the distribution's own: {why}. Enclosing plates: {plate_text}. "
        "Make the value's shape the distribution's, e.g. y.squeeze(-1) for targets of shape "
        "(N, 1) against a mean of shape (N,), or out.squeeze(-1) for a network output of "
        "shape (N, 1) against targets of shape (N,)"
    )


def check_observed_site(site: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` if an observed site's log-density counts an observation twice.

    ``site`` is a Pyro site (a trace node or a message, with ``"name"``, ``"fn"``,
    ``"value"`` and ``"cond_indep_stack"``); the rule is in the module docstring.

    Examples
    --------
    >>> import pyro, pyro.distributions as dist, torch
    >>> def model(y):
    ...     with pyro.plate("data", 4):
    ...         pyro.sample("obs", dist.Normal(torch.zeros(4), 1.0), obs=y)
    >>> trace = pyro.poutine.trace(model).get_trace(torch.zeros(4, 1))
    >>> check_observed_site(trace.nodes["obs"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: observed site 'obs': the value of shape (4, 1) and the distribution ...
    """
    message = observed_shape_error(site["name"], site["fn"], site["value"],
                                   site.get("cond_indep_stack", ()))
    if message is not None:
        raise ValueError(message)
