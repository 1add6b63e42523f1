r"""The ascent step of sharpness-aware methods: one normalised step up the loss.

Every sharpness-aware method of the package (:class:`~pyro_flat.optim.SAM`,
:class:`~pyro_flat.infer.SharpnessAwareELBO`, :class:`~pyro_flat.infer.SASGLD` and the measure
:func:`~pyro_flat.evaluation.flatness.sharpness`) moves the parameters :math:`\theta` to the
approximate maximiser :math:`\theta + e` of the loss in a ball of radius :math:`\rho` around them,
and
:func:`ascent_perturbation` is that step :math:`e`. The parameters may come as many tensors
(a network's weights and biases) or as one flat vector (an SG-MCMC kernel's state); the norm
always runs over all of them together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pyro_flat import validation

__all__ = ["ASAM_OFFSET", "ascent_direction", "ascent_perturbation", "asam_metric"]

#: ASAM's default offset :math:`\eta` in :math:`D = (|\theta| + \eta)^2` (Kwon et al. 2021), so
#: that parameters at zero can still be perturbed.
ASAM_OFFSET = 0.01


def asam_metric(
    params: Sequence[torch.Tensor],
    offset: float = ASAM_OFFSET,
    *,
    out: Sequence[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    r"""ASAM's diagonal metric :math:`D = (|\theta| + \eta)^2`, one tensor per parameter.

    Parameters
    ----------
    params : sequence of torch.Tensor
        The parameters :math:`\theta` (their values are read, never changed).
    offset : float
        The offset :math:`\eta > 0`.
    out : sequence of torch.Tensor, optional
        Tensors shaped like ``params`` to write :math:`D` into (no allocation); they are
        returned.

    Returns
    -------
    list of torch.Tensor
        :math:`D`, shaped like ``params``; pass it as ``metric`` to
        :func:`ascent_perturbation`.

    Examples
    --------
    >>> asam_metric([torch.tensor([0.0, -1.0])], offset=0.5)
    [tensor([0.2500, 2.2500])]
    """
    out = [torch.empty_like(p) for p in params] if out is None else list(out)
    if len(out) != len(params):
        raise ValueError(f"out must hold one tensor per parameter ({len(params)}), got {len(out)}")
    with torch.no_grad():
        for p, d in zip(params, out, strict=True):
            torch.abs(p, out=d).add_(offset).square_()
    return out


def ascent_perturbation(
    grads: Sequence[torch.Tensor | None],
    rho: float,
    *,
    metric: Sequence[torch.Tensor | None] | None = None,
    out: Sequence[torch.Tensor | None] | None = None,
) -> list[torch.Tensor | None] | None:
    r"""The sharpness-aware ascent step :math:`e` for the gradient ``grads``.

    With :math:`g` the gradient of the loss at :math:`\theta` (all tensors together, as one
    vector) and a positive diagonal metric :math:`D`,

    .. math::

        e = \rho\, \frac{D g}{\sqrt{g^\top D g}}
          = \operatorname*{arg\,max}_{e^\top D^{-1} e \,\le\, \rho^2} g^\top e,

    the maximiser of the first-order expansion :math:`L(\theta + e) \approx L(\theta) +
    g^\top e` in the ellipsoid of radius :math:`\rho` in the :math:`D^{-1}` norm. With
    :math:`D = I` (``metric=None``) it is SAM's step :math:`e = \rho\, g / \|g\|_2`
    (Foret et al. 2021); with :math:`D = (|\theta| + \eta)^2` (:func:`asam_metric`) it is
    ASAM's scale-invariant step (Kwon et al. 2021); with :math:`D = 1/\sigma` it is the
    geometry-aware step of F-SGVB on the means of a Gaussian.

    **No perturbation.** When :math:`\rho = 0`, or :math:`g^\top D g` is zero or not finite
    (a zero, NaN or infinite gradient), there is no ascent direction and the function returns
    ``None``: the step is :math:`e = 0` and the caller evaluates the loss at :math:`\theta`.

    Parameters
    ----------
    grads : sequence of torch.Tensor or None
        The gradient, one tensor per parameter; a single flat tensor (``[g]``) works alike.
        ``None`` entries (parameters without a gradient) count as zero and get no
        perturbation.
    rho : float
        The radius :math:`\rho \ge 0`.
    metric : sequence of torch.Tensor or None, optional
        The diagonal of :math:`D`, one positive tensor per gradient tensor (of its dtype and
        broadcastable to its shape); a ``None`` entry is the identity for that tensor. ``None``
        (default): :math:`D = I`.
    out : sequence of torch.Tensor or None, optional
        Tensors shaped like ``grads`` to write :math:`e` into, e.g. a kernel's preallocated
        buffer; they may be the ``metric`` tensors themselves. Their content is unspecified
        when the function returns ``None``.

    Returns
    -------
    list of torch.Tensor or None, or None
        :math:`e`, one tensor per gradient tensor (``None`` where the gradient is ``None``);
        or ``None`` for no perturbation (see above). No gradient flows through :math:`e`.

    Notes
    -----
    Arithmetic, so that results are reproducible bit for bit: with :math:`D = I` the norm is
    ``vector_norm`` of each tensor, combined by the ``vector_norm`` of their stack when there
    are several; otherwise :math:`g^\top D g` is the sum of ``dot(g_i, D_i g_i)``. The norm is
    then a Python float :math:`n`, and :math:`e_i = (D_i g_i) \cdot (\rho / n)`.

    Examples
    --------
    >>> g = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]
    >>> e = ascent_perturbation(g, rho=0.5)  # ||g|| = 5 over both tensors
    >>> torch.cat(e)
    tensor([0.3000, 0.0000, 0.4000])
    >>> ascent_perturbation([torch.zeros(3)], rho=0.5) is None  # zero gradient: e = 0
    True

    ASAM on one flat vector: the step is scaled by each parameter's magnitude.

    >>> theta, g = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])
    >>> e, = ascent_perturbation([g], 0.5, metric=asam_metric([theta], offset=1.0))
    >>> e  # D = (4, 1): D g / sqrt(g^T D g) = (4, 1) / sqrt(5)
    tensor([0.8944, 0.2236])
    >>> round(float((e.square() / torch.tensor([4.0, 1.0])).sum().sqrt()), 6)  # the radius
    0.5

    References
    ----------
    Foret, P., Kleiner, A., Mobahi, H. & Neyshabur, B. (2021). Sharpness-aware minimization for
    efficiently improving generalization. ICLR.
    Kwon, J., Kim, J., Park, H. & Choi, I. K. (2021). ASAM: Adaptive sharpness-aware
    minimization for scale-invariant learning of deep neural networks. ICML.
    """
    rho = validation.nonnegative("rho", rho)
    n = len(grads)
    if metric is not None and len(metric) != n:
        raise ValueError(f"metric must hold one tensor per gradient ({n}), got {len(metric)}")
    if out is not None and len(out) != n:
        raise ValueError(f"out must hold one tensor per gradient ({n}), got {len(out)}")
    present = [i for i, g in enumerate(grads) if g is not None]
    if rho == 0.0 or not present:
        return None
    with torch.no_grad():
        dg, norm_t = ascent_direction(grads, metric, out, present)
        norm = float(norm_t)
        if not (norm > 0.0 and math.isfinite(norm)):
            return None
        scale = rho / norm
        e: list[torch.Tensor | None] = [None] * n
        for i in present:
            target = None if out is None else out[i]
            if target is None:
                e[i] = dg[i] * scale
            else:
                if target is not dg[i]:
                    target.copy_(dg[i])
                e[i] = target.mul_(scale)
    return e


def ascent_direction(
    grads: Sequence[torch.Tensor | None],
    metric: Sequence[torch.Tensor | None] | None,
    out: Sequence[torch.Tensor | None] | None,
    present: Sequence[int],
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    r""":math:`D g` (into ``out`` where given, for the tensors ``present``) and the norm
    :math:`\sqrt{g^\top D g}` as a tensor on the gradient's device, with the arithmetic of
    :func:`ascent_perturbation` (which divides ``rho`` by it on the host); a caller that must
    not wait for the host divides on the device instead."""
    if metric is None:
        dg = {i: grads[i] for i in present}  # D g = g
        parts = [torch.linalg.vector_norm(grads[i]) for i in present]
        return dg, parts[0] if len(parts) == 1 else torch.linalg.vector_norm(_stack(parts))
    dg = {i: _times(grads[i], metric[i], None if out is None else out[i]) for i in present}
    parts = [torch.dot(grads[i].reshape(-1), dg[i].reshape(-1)) for i in present]
    return dg, (parts[0] if len(parts) == 1 else _stack(parts).sum()).sqrt()


def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """The per-tensor parts as one vector, on the first one's device (parameters may be spread
    over several devices)."""
    device = parts[0].device
    return torch.stack([t.to(device) for t in parts])


def _times(g: torch.Tensor, d: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    """``D g`` for one tensor, into ``out`` when given."""
    if d is None:
        return g if out is None else out.copy_(g)
    return g * d if out is None else torch.mul(g, d, out=out)
