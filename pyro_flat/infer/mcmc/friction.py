r"""The friction an underdamped update takes on a minibatched model, so that the minibatch noise
heats its chain by at most a stated bound.

Target: the underdamped chain's law :math:`\exp(-U/T)\,\mathcal N(r; 0, MT)` within
:data:`~pyro_flat.infer.mcmc.gradient_noise.TARGET_RATIO` (5%) excess temperature when its
gradient is a minibatch's.

The momentum of an SG step receives :math:`\epsilon^2 P_i v_i` of minibatch noise
(:math:`v_i` the gradient variance, :math:`P` the metric) beside the injected
:math:`2C\epsilon T`. Were the batches independent, the position would run
:math:`\epsilon P_i v_i / (2CT)` too hot; the kernels' epoch-wise batches give it the share
:math:`h` of that (:func:`~pyro_flat.infer.mcmc.epoch_noise.epoch_share`), which falls as
the chain slows against an epoch. :class:`NoiseFriction` keeps the given friction :math:`C`
when :math:`h\,\epsilon \max_i P_i v_i / (2CT)` is within the bound at the stability rule's
step, and otherwise raises :math:`C` to where it is, the step following the rule
(:math:`\epsilon C` tends to the stability fraction as :math:`C` grows, so the excess falls as
:math:`1/C^2` or faster). :math:`h` is taken at the largest curvature: at the default
stability fraction a slower direction feels less of the noise, so the bound holds for it too.

Chen et al. (2014) instead subtract :math:`\hat B_i = \epsilon P_i v_i / (2T)` from the
injected noise. That is exact for independent batches only: with epoch-wise batches it takes
away noise the chain needs, and the chain runs cold; with independent batches, the noise's
correlations between coordinates, which a per-coordinate :math:`\hat B` cannot hold, remain.
SGHMC's ``noise_estimate`` keeps the subtraction for a user who knows :math:`\hat B`
(``docs/methods/adaptation.md`` has the measurements).

Examples
--------
>>> from pyro_flat.infer.mcmc.friction import NoiseFriction
>>> fit = NoiseFriction(1.0)
>>> fit.share is None  # nothing chosen yet: the report assumes independent batches
True
>>> fit.load(0.07)  # a checkpoint's share at its friction
>>> fit.restore(), fit.share  # forget it: the given friction
(1.0, None)

References
----------
Chen, T., Fox, E. & Guestrin, C. (2014). Stochastic gradient Hamiltonian Monte Carlo. ICML.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from scipy.optimize import brentq

from pyro_flat.infer.mcmc.epoch_noise import epoch_share
from pyro_flat.infer.mcmc.gradient_noise import TARGET_RATIO

if TYPE_CHECKING:
    from pyro_flat.infer.mcmc.base import SGMCMCKernel

#: How many times the bracket of the friction may grow fourfold before warmup gives up.
_MAX_GROWTH = 60


class NoiseFriction:
    r"""What warmup chose for an underdamped update on a minibatched model: the friction and
    the share :math:`h` of the minibatch noise's heat that reaches the position (see the
    module).

    Parameters
    ----------
    friction : float
        The given friction :math:`C`, in force until warmup raises it and again at each
        estimate (:meth:`restore`).

    Attributes
    ----------
    given_friction : float
        The given friction.
    share : float or None
        :math:`h` at the chosen friction and step (``None``: none chosen).
    """

    def __init__(self, friction: float):
        self.given_friction = friction
        self.share: float | None = None

    def fit(self, kernel: SGMCMCKernel, curvature: float, variance: torch.Tensor) -> float:
        """Choose the friction (set on ``kernel.friction``) for the measured gradient
        ``variance`` at the top ``curvature``; the step size of the stability rule at it."""
        scale = variance * (1.0 if kernel.metric is None else kernel.metric.inverse_mass)
        top = float(scale.max()) / (2.0 * kernel.temperature)
        batches = kernel.minibatches
        per_epoch = batches.size // batches.batch_size
        curvature_felt = kernel.heating_curvature(curvature)

        def excess(friction: float) -> tuple[float, float, float]:
            kernel.friction = friction
            step = kernel.stability_fraction * kernel.stability_limit(curvature)
            share = epoch_share(curvature_felt, step, friction, kernel.mass,
                                batches_per_epoch=per_epoch)
            return share * step * top / friction, step, share

        friction = self.given_friction
        heat, step, share = excess(friction)
        if math.isfinite(top) and heat > TARGET_RATIO:
            low, high = friction, 4.0 * friction
            for _ in range(_MAX_GROWTH):
                if excess(high)[0] <= TARGET_RATIO:
                    break
                low, high = high, 4.0 * high
            root = brentq(lambda x: math.log(excess(math.exp(x))[0] / TARGET_RATIO),
                          math.log(low), math.log(high), xtol=1e-9)
            friction = math.exp(root)
            heat, step, share = excess(friction)
            if heat > TARGET_RATIO * (1 + 1e-6):  # not a root (excess jumps): the safe end
                friction = high
                heat, step, share = excess(friction)
        kernel.friction, self.share = friction, share
        return step

    def restore(self) -> float:
        """Forget the choice; the given friction (to set on the kernel)."""
        self.share = None
        return self.given_friction

    def load(self, share: float | None) -> None:
        """Continue with a checkpoint's share (the kernel sets its friction itself)."""
        self.share = share
