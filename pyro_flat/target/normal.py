r"""Closed-form Normal log-densities: the usual BNN prior without ``log_prob``'s overhead.

A site's distribution is a *closed-form Normal* when it is a
:class:`~torch.distributions.Normal`, or an :class:`~torch.distributions.Independent` Normal
(``.to_event``), whose batch shape is the full shape of the value; then

.. math:: \log p(x) = -\tfrac12 \sum_j \Big(\frac{x_j - m_j}{\sigma_j}\Big)^2
    - \sum_j \log \sigma_j - \tfrac{n}{2} \log 2\pi.

The minibatch potential (:mod:`.potential`) sums it for the sites it runs through the model and
:class:`~.flat_prior.FlatNormalPrior` for the sites it sums on the flat vector; both recognise
the distribution with :func:`normal_parts`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributions import Independent, Normal

__all__ = ["HALF_LOG_2PI", "normal_log_prob_sum", "normal_parts"]

#: :math:`\tfrac12 \log 2\pi`, the normalising constant of a standard Normal per entry.
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def normal_parts(fn: Any, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(loc, scale)`` of ``fn`` if it is a closed-form Normal for ``value``, else None.

    ``fn`` qualifies when it is a Normal or an ``Independent`` Normal whose batch shape is
    ``value.shape`` (so the value holds no extra sample dimensions).
    """
    base = fn.base_dist if isinstance(fn, Independent) else fn
    if not isinstance(base, Normal) or value.shape != base.batch_shape:
        return None
    return base.loc, base.scale


def _scalar_view(t: torch.Tensor) -> torch.Tensor | None:
    """The single value of a tensor that is a broadcast (all strides 0) of one number, else None."""
    if t.dim() == 0:
        return t
    if all(s == 0 for s in t.stride()):
        return t[(0,) * t.dim()]
    return None


def normal_log_prob_sum(fn: Any, value: torch.Tensor) -> torch.Tensor | None:
    """``fn.log_prob(value).sum()`` in closed form when ``fn`` is a (reinterpreted) Normal.

    Returns None for any other distribution, or a value whose shape is not the distribution's own
    full shape (:func:`normal_parts`), so that the caller falls back to ``fn.log_prob``. A
    location or scale broadcast from one number is used as that number.
    """
    parts = normal_parts(fn, value)
    if parts is None:
        return None
    loc, scale = parts
    # a float64 value with float32 parameters (e.g. ``Normal(0.0, 1.0)``): sum in float64
    dtype = torch.promote_types(scale.dtype, value.dtype)
    loc0 = _scalar_view(loc)
    loc = loc if loc0 is None else loc0
    n = value.numel()
    s0 = _scalar_view(scale)
    if s0 is not None:
        s0 = s0.to(dtype)
        quad = (value - loc).square().sum() / s0.square()
        log_norm = n * (s0.log() + HALF_LOG_2PI)
    else:
        scale = scale.to(dtype)
        quad = ((value - loc) / scale).square().sum()
        log_norm = scale.log().expand(value.shape).sum() + n * HALF_LOG_2PI
    return -0.5 * quad - log_norm
