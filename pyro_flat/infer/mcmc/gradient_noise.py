r"""The minibatch gradient noise of an SG-MCMC chain, measured in warmup, beside the injected noise.

A minibatch gradient is :math:`\nabla\hat U = \nabla U + \eta` with :math:`\eta` of
per-coordinate variance :math:`v_i` (zero with a full batch). Each SG step adds
:math:`\eta`'s noise to the noise the update injects, so a chain runs at a higher effective
temperature than the :math:`T` it was given. Per coordinate, per step:

* Langevin updates (SGLD and its kin): :math:`\theta` receives :math:`\epsilon^2 P_i^2 v_i` of
  minibatch noise beside the injected :math:`2\epsilon T P_i`; the ratio is
  :math:`r_i = \epsilon P_i v_i / (2T)` and the chain samples at
  :math:`T_{\mathrm{eff},i} = T(1 + r_i)` (to first order in :math:`\epsilon`);
* underdamped updates (SGHMC, L2E, the underdamped forms of EntropyMCMC and SASGLD): the
  momentum receives :math:`\epsilon^2 P_i v_i` beside the injected
  :math:`2(C - \hat B_i)\epsilon T`; the ratio is
  :math:`r_i = \epsilon P_i v_i / (2(C - \hat B_i)T)` and
  :math:`T_{\mathrm{eff},i}/T = 1 + (\epsilon P_i v_i/(2T) - \hat B_i)/C`, with
  :math:`\hat B_i` a correction the user gives (SGHMC's ``noise_estimate``; Chen et al. 2014,
  Eq. 13).

These assume independent batches. The kernels' epoch-wise batches heat the position by a
share :math:`h` of that (:mod:`pyro_flat.infer.mcmc.epoch_noise`), small when the chain moves
slowly against an epoch: an underdamped update whose friction warmup chose reports its excess
with the :math:`h` it was chosen at; the other reports are upper bounds where :math:`h \le 1`.

:math:`P` is the diagonal metric (1 without one). :func:`measure_variance` estimates
:math:`v` at the chain's position from :data:`NUM_BATCHES` independent minibatches (each a
uniform draw of ``B`` of the ``N`` points, as the kernel's epoch-wise batches are marginally),
so the estimate is the minibatch noise alone, not the movement of the chain.

The kernels report the largest :math:`r_i` (``noise_ratio``) and the largest relative excess
:math:`(T_{\mathrm{eff},i} - T)/T` (``temperature_excess``) in
``diagnostics()["gradient_noise"]``, and warn when the excess is above
:data:`EXCESS_BOUND` (10%: the posterior standard deviations are then up to about 5% too
wide). When warmup chooses the step size, Langevin updates take a step at which the ratio
is at most :data:`TARGET_RATIO`, and the underdamped updates raise the friction until the
excess is at most :data:`TARGET_RATIO` (:mod:`pyro_flat.infer.mcmc.friction`).

References
----------
Chen, T., Fox, E. & Guestrin, C. (2014). Stochastic gradient Hamiltonian Monte Carlo. ICML.
Vollmer, S. J., Zygalakis, K. C. & Teh, Y. W. (2016). Exploration of the (non-)asymptotic
bias and variance of stochastic gradient Langevin dynamics. JMLR.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: Minibatches per estimate of the gradient variance: a coordinate's variance estimate then
#: has a relative standard error of about :math:`\sqrt{2/31} \approx 0.25`.
NUM_BATCHES = 32
#: The noise ratio an adapted Langevin step is chosen for (5% excess temperature).
TARGET_RATIO = 0.05
#: The relative excess temperature above which a run warns.
EXCESS_BOUND = 0.1
#: Seeds the draws of the measuring minibatches (offset by the SG step count), so that
#: measuring touches no random stream of the chain.
_SEED = 0x5EED_0153


def measure_variance(
    evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    num_data: int,
    batch_size: int,
    num_chains: int | None,
    step: int,
    device: torch.device,
    num_batches: int = NUM_BATCHES,
) -> torch.Tensor | None:
    r"""The per-coordinate variance of the minibatch gradient at the current position.

    Parameters
    ----------
    evaluate : callable
        ``evaluate(batch) -> (U, grad U)`` at the chain's position (the gradient flat, one row
        per chain for vectorised chains; it may be a buffer the next call overwrites).
    num_data, batch_size : int
        ``N`` and ``B`` of the subsampled plate.
    num_chains : int or None
        ``K`` for vectorised chains (each gets batches of its own), ``None`` for one chain.
    step : int
        The chain's SG step count, which seeds the batches.
    device : torch.device
        Where the index tensors live.
    num_batches : int
        How many minibatches to evaluate.

    Returns
    -------
    torch.Tensor or None
        The unbiased sample variance over the finite evaluations, shaped like the gradient;
        ``None`` when fewer than two were finite.
    """
    generator = torch.Generator().manual_seed(_SEED + step)
    rows = 1 if num_chains is None else num_chains
    count, mean, m2 = 0, None, None
    for _ in range(num_batches):
        batch = torch.stack([torch.randperm(num_data, generator=generator)[:batch_size]
                             for _ in range(rows)]).to(device)
        _, grad = evaluate(batch[0] if num_chains is None else batch)
        if not bool(torch.isfinite(grad).all()):
            continue
        count += 1
        if mean is None:
            mean, m2 = grad.detach().clone(), torch.zeros_like(grad)
            continue
        delta = grad - mean
        mean.add_(delta, alpha=1.0 / count)
        m2.addcmul_(delta, grad - mean)
    if count < 2:
        return None
    return m2 / (count - 1)


def noise_ratio(variance: torch.Tensor, step_size: float, temperature: float,
                inverse_mass: torch.Tensor | None = None, friction: float | None = None,
                correction: float | torch.Tensor = 0.0) -> torch.Tensor:
    r"""Per coordinate, the minibatch noise of a step over the noise it injects: :math:`r_i`
    above (``friction`` ``None`` for a Langevin update)."""
    scaled = step_size * variance * (1.0 if inverse_mass is None else inverse_mass)
    if friction is None:
        return scaled / (2.0 * temperature)
    injected = torch.as_tensor(friction - correction, dtype=variance.dtype)
    return scaled / (2.0 * injected.clamp(min=torch.finfo(variance.dtype).tiny) * temperature)


def temperature_excess(variance: torch.Tensor, step_size: float, temperature: float,
                       inverse_mass: torch.Tensor | None = None, friction: float | None = None,
                       correction: float | torch.Tensor = 0.0, share: float = 1.0
                       ) -> torch.Tensor:
    r"""Per coordinate, :math:`(T_{\mathrm{eff},i} - T)/T` of a step (see the module's text);
    ``share`` is the part :math:`h` of the noise's heat that reaches the position
    (:func:`~pyro_flat.infer.mcmc.epoch_noise.epoch_share`; 1 for independent batches)."""
    scaled = share * step_size * variance * (1.0 if inverse_mass is None else inverse_mass)
    if friction is None:
        return scaled / (2.0 * temperature)
    return (scaled / (2.0 * temperature) - correction) / friction
