r"""How much of a minibatched chain's energy scatter is minibatch noise, read from warmup's
energies alone: ContourSGLD's bins and weights need the energy to within a bin.

A minibatch energy is :math:`\hat U_t = U(\theta_t) + \nu_t`, with :math:`\nu_t` the noise of the
batch. The kernels' batches run through epochs: the :math:`M = \lfloor N/B \rfloor` batches of an
epoch are disjoint, so at a fixed :math:`\theta` their energies average to the energy of the
:math:`MB` points they cover (all :math:`N` when :math:`B` divides :math:`N`). Over an epoch the
chain barely moves, so the mean of an epoch's energies is :math:`U` nearly free of noise, and

.. math:: s_U^2 = \mathrm{Var}_e\Big(\tfrac1M \textstyle\sum_{t \in e} \hat U_t\Big), \qquad
          s_\nu^2 = \max\big(\mathrm{Var}_t(\hat U_t) - s_U^2,\ 0\big)

estimate the spread of the target's energies along the chain and the noise of one minibatch
energy (epochs aligned with the first step of the run, which starts one). No extra potential
evaluation is needed.

When the noise is larger than the spread (:data:`NOISE_BOUND`), the bin of a draw is mostly
the noise's: the learned :math:`g` is the PDF of the noisy energies, the flattening follows
the noise, and the weights, which tilt with the energy, concentrate on few draws (the
conformance matrix's minibatched BNNs: noise 25 nats against a spread of 3-6, weights' ESS of
5-23 of 800 draws). ContourSGLD then does not flatten that chain (see its ``auto_bins``).

Examples
--------
>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> level = 3.0 * torch.randn(400, 1, generator=g)  # U along the chain: sd 3, one per epoch
>>> noise = 20.0 * torch.randn(400, 8, generator=g)
>>> noise -= noise.mean(1, keepdim=True)  # an epoch's 8 batches cover every point once
>>> noise_sd, spread = energy_noise((level + noise).flatten().tolist(), batches_per_epoch=8)
>>> round(noise_sd), round(spread, 1)
(19, 2.9)
"""

from __future__ import annotations

import math

import torch

__all__ = ["MIN_EPOCHS", "NOISE_BOUND", "energy_noise"]

#: A chain whose minibatch energy noise is above this many times its energy spread does not
#: flatten.
NOISE_BOUND = 1.0
#: The fewest whole epochs the estimate is made from.
MIN_EPOCHS = 20


def energy_noise(energies: list[float], batches_per_epoch: int) -> tuple[float, float] | None:
    """``(s_nu, s_U)``: the sd of a minibatch energy's noise and the spread of the energies
    over the chain (see the module), from ``energies`` one per SG step starting at an epoch's
    first; ``None`` with fewer than :data:`MIN_EPOCHS` epochs or a non-finite energy."""
    m = int(batches_per_epoch)
    if m < 2:
        return None  # one batch per epoch: every energy is an epoch's, nothing to separate
    u = torch.tensor(energies, dtype=torch.float64)
    epochs = len(u) // m
    if epochs < MIN_EPOCHS or not bool(torch.isfinite(u).all()):
        return None
    u = u[: epochs * m]
    spread = float(u.reshape(epochs, m).mean(1).var())
    noise = max(float(u.var()) - spread, 0.0)
    return math.sqrt(noise), math.sqrt(spread)
