r"""A momentum far beyond its law: an underdamped chain thrown by a locally unstable step.

Target: at stationarity each coordinate of an underdamped chain's momentum is
:math:`\mathcal N(0, MT)`; the discretised update of SGHMC (:func:`.integrators.underdamped_step_`)
holds it at variance

.. math:: \sigma_r^2 = \frac{MT}{1 - \alpha/2}, \qquad \alpha = \epsilon C / M

(the per-step momentum decay; a stiff direction adds a few percent at the adapted step).

An explicit step is stable only below a curvature. Warmup chooses it at the curvature it
measured, but a posterior can be far stiffer elsewhere: in a horseshoe regression a local
scale :math:`\lambda_j` drifting into its Cauchy tail makes the direction of its coefficient
:math:`(\tau\lambda_j)^2` times stiffer. There an overdamped (Langevin) step overshoots and is
pulled back; an underdamped chain's momentum keeps the energy the unstable step released and
carries the scales far away (:math:`\tau` to zero, every coefficient with it) for as long as
the friction takes to dissipate it. The draws stay finite, and the run would be silently
wrong. Such a momentum is tens of :math:`\sigma_r` out, where a chain at stationarity is with
negligible probability, so :class:`MomentumWatch` reads it as the sign of an unstable step (or
of a chain far hotter than its temperature for another reason: minibatch noise far above the
injected noise, which has its own warning, or a start's energy not yet shed):

- a coordinate is *hot* when :math:`|r_i| > b\,\sigma_r` with
  :math:`b = \sqrt{2 \log(2 d / p)}`, :math:`d` the coordinates and :math:`p` =
  :data:`FALSE_ALARM` (the chance that any of :math:`d` stationary normal coordinates is beyond
  :math:`b` is at most :math:`p`);
- in warmup, once its first quarter has shed the start's energy, every SG step is checked: a
  hot chain is put back where its energy was lowest, its momentum at zero, and the step size
  halved, as after a non-finite step (:mod:`~pyro_flat.infer.mcmc.warmup`);
- after warmup each SG step keeps each chain's largest :math:`|r_i|` on the device (no host
  synchronisation), each draw reads it (``diagnostics()["momentum_watch"]``), and a run with
  hot draws warns at its end, naming the site and how far out it was. (Read only at the
  draws, the momentum misses the damage: the flight takes a few dozen steps, and the chain
  then climbs back slowly with an ordinary momentum.)

Examples
--------
>>> import torch
>>> from pyro_flat.infer.mcmc.momentum_watch import MomentumWatch, hot_bound
>>> round(hot_bound(18), 2)  # sds, for 18 coordinates
6.97
>>> watch = MomentumWatch(num_chains=2, dim=18)
>>> momentum = torch.zeros(2, 18); momentum[1, 3] = 24.0  # chain 1 thrown far out
>>> watch.after_step(momentum)  # at an SG step
>>> momentum *= 0.5; watch.after_step(momentum)  # a later step of the same draw
>>> watch.record(momentum, sd=1.0)  # the draw
>>> watch.hot_draws.tolist(), watch.worst.tolist(), watch.worst_index.tolist()
([0, 1], [0.0, 24.0], [0, 3])

References
----------
Chen, T., Fox, E. & Guestrin, C. (2014). Stochastic gradient Hamiltonian Monte Carlo. ICML.
Betancourt, M. (2017). A conceptual introduction to Hamiltonian Monte Carlo. arXiv:1701.02434
(divergences: where a fixed step is unstable, the trajectory's energy departs).
"""

from __future__ import annotations

import math
import warnings

import torch

from pyro_flat.target.layout import FlatLayout

__all__ = ["FALSE_ALARM", "MomentumWatch", "hot_bound", "momentum_sd", "warn_if_momentum_ran_hot"]

#: The chance that a stationary chain's momentum is read as hot at one check.
FALSE_ALARM = 1e-9


def hot_bound(dim: int, false_alarm: float = FALSE_ALARM) -> float:
    r""":math:`b = \sqrt{2\log(2d/p)}`: by the normal tail bound
    :math:`P(|\xi| > b) \le e^{-b^2/2}`, the chance that any of ``dim`` standard normal
    coordinates is beyond :math:`b` is at most ``false_alarm``."""
    return math.sqrt(2.0 * math.log(2.0 * max(dim, 1) / false_alarm))


def momentum_sd(step_size: float, friction: float, mass: float, temperature: float) -> float:
    r""":math:`\sigma_r = \sqrt{MT / (1 - \epsilon C / (2M))}`, the stationary sd of each
    momentum coordinate of the discretised SGHMC update on a flat potential."""
    decay = step_size * friction / mass
    return math.sqrt(mass * temperature / (1.0 - 0.5 * min(decay, 1.0)))


class MomentumWatch:
    """The hot momenta of a run's SG steps after warmup, per chain (see the module): each step
    keeps the largest ``|r_i|`` since the last draw on the device, and each draw reads it.

    Parameters
    ----------
    num_chains, dim : int
        The chains and the coordinates of each.

    Attributes
    ----------
    bound : float
        :func:`hot_bound` of ``dim``, in momentum sds.
    hot_draws : torch.Tensor
        ``(K,)``: each chain's draws with a hot coordinate at one of their SG steps.
    worst : torch.Tensor
        ``(K,)``: each chain's largest ``|r_i| / sd``.
    worst_index : torch.Tensor
        ``(K,)``: the coordinate whose momentum was largest at the end of that draw (the SG
        steps keep only the largest value, which costs one reduction a step).
    num_draws : int
        The draws read.
    """

    def __init__(self, num_chains: int, dim: int, device: torch.device | str = "cpu"):
        self.bound = hot_bound(dim)
        self.hot_draws = torch.zeros(num_chains, dtype=torch.long, device=device)
        self.worst = torch.zeros(num_chains, device=device)
        self.worst_index = torch.zeros(num_chains, dtype=torch.long, device=device)
        self._largest = torch.zeros(num_chains, device=device)
        self.num_draws = 0

    def excess(self, momentum: torch.Tensor, sd: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Each chain's largest ``|r_i| / sd`` and its coordinate (``momentum``: ``(K, d)``)."""
        top, index = momentum.detach().abs().max(-1)
        return top.float() / sd, index

    def as_dict(self) -> dict[str, object]:
        """For ``diagnostics()["momentum_watch"]``: the bound (sds), the draws read, and per
        chain the hot draws and the largest momentum (sds)."""
        return {"bound": self.bound, "num_draws": self.num_draws,
                "hot_draws": self.hot_draws.tolist(),
                "largest": [round(x, 2) for x in self.worst.tolist()]}

    def after_step(self, momentum: torch.Tensor) -> None:
        """Keep the largest ``|r_i|`` of each chain (``momentum``: ``(K, d)``) since the last
        draw; no host synchronisation (one reduction: its coordinate is read at the draw)."""
        torch.maximum(self._largest, momentum.detach().abs().amax(-1).float(),
                      out=self._largest)

    def record(self, momentum: torch.Tensor, sd: float) -> None:
        """Close a draw: count its chains whose largest ``|r_i|`` was beyond ``bound * sd``,
        and keep, for the hottest draw, the coordinate where the momentum (``(K, d)``) is
        largest at the draw; no host synchronisation."""
        top = self._largest / sd
        self.hot_draws += (top > self.bound).long()
        higher = top > self.worst
        self.worst = torch.where(higher, top, self.worst)
        index = momentum.detach().abs().max(-1).indices
        self.worst_index = torch.where(higher, index, self.worst_index)
        self._largest.zero_()
        self.num_draws += 1


def warn_if_momentum_ran_hot(kernel_name: str, watch: MomentumWatch | None,
                             layout: FlatLayout) -> None:
    """Warn when any chain had draws with a hot momentum (names the site, the draws and how far
    out, in sds)."""
    if watch is None or not watch.num_draws:
        return
    hot = watch.hot_draws.tolist()
    if not any(hot):
        return
    chain = max(range(len(hot)), key=lambda c: float(watch.worst[c]))
    site = layout.site_at(int(watch.worst_index[chain]))
    which = (f"{hot[0]} of {watch.num_draws} draws" if len(hot) == 1 else
             f"{sum(hot)} of {watch.num_draws * len(hot)} chain-draws "
             f"({sum(h > 0 for h in hot)} of {len(hot)} chains)")
    warnings.warn(
        f"{kernel_name}: at {which} the momentum was beyond {watch.bound:.1f} sds of its law "
        f"(up to {float(watch.worst[chain]):.0f} sds"
        + (f" in chain {chain}" if len(hot) > 1 else "")
        + f"; at the end of that draw it was largest in site {site!r}): a step was unstable "
        "in a part of the posterior stiffer than warmup measured and the momentum carried the "
        "chain far from where it should be, or minibatch gradient noise far above the "
        "injected noise heats the chain (its own warning says so), or the chain had not shed "
        "its start's energy when warmup ended; the draws near those are biased. Give a "
        "smaller step_size (or stability_fraction), a larger friction, or a longer warmup",
        RuntimeWarning, stacklevel=3)
