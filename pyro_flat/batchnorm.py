"""BatchNorm running statistics for a posterior draw.

A BNN's draws are its weights; BatchNorm's running mean and variance are buffers computed from
activations, so a draw that never ran forward (a thinned draw restored later, EntropyMCMC's
guiding variable :math:`\\theta_a`, a SWAG sample) has no statistics of its own. Recompute them
before predicting with that draw, as SWA/SWAG do (Izmailov et al. 2018; Maddox et al. 2019) and
the Entropy-MCMC authors do for :math:`\\theta_a`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyro.poutine as poutine
import torch
from torch import nn

from pyro_flat import validation
from pyro_flat.batchnorm_state import find_batchnorm


def recompute_batchnorm(
    net: nn.Module,
    draw: Mapping[str, torch.Tensor] | None,
    x: torch.Tensor,
    *,
    batch_size: int = 256,
) -> list[nn.Module]:
    """Reset and recompute the running statistics of ``net``'s BatchNorm layers under ``draw``.

    Runs ``net`` on ``x`` in training mode, in minibatches of ``batch_size``, with the sampled
    sites set to ``draw`` (``poutine.condition``) and each BatchNorm layer's ``momentum`` set
    to ``None`` (cumulative average), so that the running mean is the average of the batch
    means over ``x`` and the running variance the average of the (unbiased) batch variances,
    as :func:`torch.optim.swa_utils.update_bn` computes them. Afterwards every module is back
    in its former mode and momentum; only the BatchNorm buffers have changed. Nothing is
    recorded for autograd.

    Parameters
    ----------
    net : torch.nn.Module
        The Bayesian network (a ``PyroModule``, or a plain module with ``draw=None``).
    draw : dict or None
        ``{site: tensor}`` of one draw (e.g. ``{k: v[i] for k, v in samples.items()}``);
        ``None`` uses the network as it is.
    x : torch.Tensor
        Inputs to compute the statistics on (usually the training inputs).
    batch_size : int
        Minibatch size, ``>= 1``; use the training batch size so that the statistics match.

    Returns
    -------
    list of torch.nn.Module
        The BatchNorm layers that were updated (empty if the network has none).

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    >>> x = torch.randn(100, 2)
    >>> layers = recompute_batchnorm(net, None, x, batch_size=100)
    >>> torch.allclose(layers[0].running_mean, net[0](x).mean(0).detach(), atol=1e-6)
    True
    """
    batch_size = validation.integer_at_least("batch_size", batch_size, 1)
    layers = find_batchnorm(net)
    if not layers:
        return []
    if x.shape[0] == 0:
        raise ValueError("x must hold at least one input")
    modes = {m: m.training for m in net.modules()}
    momenta = [m.momentum for m in layers]
    run = net if draw is None else poutine.condition(net, data=dict(draw))
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None
        net.train()
        with torch.no_grad():
            for start in range(0, x.shape[0], batch_size):
                run(x[start:start + batch_size])
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
        for m, training in modes.items():
            m.training = training
    return layers
