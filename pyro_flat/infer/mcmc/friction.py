r"""The friction an underdamped update takes: the given one, or :data:`DEFAULT_FRICTION` until
warmup sees a step throw the momentum, and from then on the one at which the adapted step lets
the momentum decay by :data:`MOMENTUM_DECAY` per step; on a minibatched model, raised so that
the minibatch noise heats its chain by at most a stated bound.

Target: the underdamped chain's law :math:`\exp(-U/T)\,\mathcal N(r; 0, MT)` within
:data:`~pyro_flat.infer.mcmc.gradient_noise.TARGET_RATIO` (5%) excess temperature when its
gradient is a minibatch's.

**The friction when none is given.** The per-step momentum decay :math:`\alpha = \epsilon C/M`
sets how long the momentum remembers a kick. The default friction, 1, gives a decay of 0.01 or
less at the steps warmup chooses on BNNs, and mixes the slow directions well; but where a step
is unstable somewhere the chain wanders (a horseshoe's local scale in its Cauchy tail), a throw
of the momentum carries the chain far from the typical set for dozens of steps
(``docs/methods/adaptation.md``; ``benchmarks/horseshoe_flights.py``). So when warmup sees a
throw (:mod:`~pyro_flat.infer.mcmc.momentum_watch`) on an update whose friction was not given,
the friction becomes the one of the decay :math:`\alpha = \min(` :data:`MOMENTUM_DECAY`
:math:`, f/2)` (SGD's momentum 0.9): at once :math:`C = \alpha M/\epsilon` for the halved
step, and at each later estimate the root of :math:`\epsilon(C)\,C/M = \alpha`, where
:math:`\epsilon(C)` is the stability rule's step at :math:`C` (the decay grows with :math:`C`
towards the stability fraction :math:`f`), and at least :math:`\alpha M/\epsilon` when the step
is held below the rule's. A decay of 0.1 on every posterior mixed the smooth ones' slowest
directions three to four times slower, so it is kept for the posteriors that need it.

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
>>> from pyro_flat.infer import SGHMC
>>> fit = NoiseFriction(1.0)
>>> fit.share is None  # nothing chosen yet: the report assumes independent batches
True
>>> fit.load(0.07, 1.0, False)  # a checkpoint's share at its friction
>>> fit.restore(SGHMC(lambda: None), 400.0), fit.share  # forget it: the given friction
(1.0, None)
>>> kernel = SGHMC(lambda: None)  # no friction given: 1, until warmup sees a throw
>>> kernel.friction
1.0
>>> kernel.noise_fit.damp(kernel, 0.01)  # a throw: a decay of 0.1 per step at the step
True
>>> round(kernel.friction * 0.01, 6)
0.1
>>> friction = kernel.noise_fit.restore(kernel, 400.0)  # the next estimate: with the step
>>> round(kernel.stability_fraction * kernel.stability_limit(400.0) * friction, 6)
0.1

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
#: The friction of an underdamped update when none is given, until warmup sees a throw.
DEFAULT_FRICTION = 1.0
#: The per-step momentum decay :math:`\epsilon C/M` of an underdamped update whose friction was
#: not given, once warmup saw a step throw its momentum (SGD's momentum 0.9).
MOMENTUM_DECAY = 0.1


def decay_of(kernel: SGMCMCKernel) -> float:
    """The momentum decay per step that ``kernel`` keeps once damped: :data:`MOMENTUM_DECAY`,
    at most half the stability fraction (the most the stability rule's step can reach is the
    fraction itself)."""
    return min(MOMENTUM_DECAY, 0.5 * kernel.stability_fraction)


def friction_for_decay(kernel: SGMCMCKernel, curvature: float) -> float:
    r"""The friction :math:`C` at which the stability rule's step at ``curvature`` decays the
    momentum by :func:`decay_of` per step, :math:`\epsilon(C)\,C/M = \alpha` (set on
    ``kernel.friction``)."""
    decay = decay_of(kernel)

    def log_excess(log_friction: float) -> float:
        kernel.friction = math.exp(log_friction)
        step = kernel.stability_fraction * kernel.stability_limit(curvature)
        return math.log(step * kernel.friction / (kernel.mass * decay))

    low = high = math.log(DEFAULT_FRICTION)
    for _ in range(_MAX_GROWTH):
        if log_excess(low) < 0:
            break
        low -= math.log(4.0)
    for _ in range(_MAX_GROWTH):
        if log_excess(high) > 0:
            break
        high += math.log(4.0)
    kernel.friction = math.exp(brentq(log_excess, low, high, xtol=1e-12))
    return kernel.friction


class NoiseFriction:
    r"""The friction of an underdamped update: the given one, or :data:`DEFAULT_FRICTION` until
    warmup sees a throw and the momentum decay :data:`MOMENTUM_DECAY`'s after it; raised on a
    minibatched model against its noise; and the share :math:`h` of the minibatch noise's heat
    that reaches the position (see the module).

    Parameters
    ----------
    friction : float or None
        The given friction :math:`C`, in force until warmup raises it and again at each
        estimate (:meth:`restore`); ``None``: :data:`DEFAULT_FRICTION`, and the momentum
        decay's once warmup saw a throw (:meth:`damp`).

    Attributes
    ----------
    given_friction : float or None
        The given friction.
    base : float
        The friction before any raise against the minibatch noise.
    damped : bool
        Whether warmup saw a throw and the friction follows the momentum decay.
    share : float or None
        :math:`h` at the chosen friction and step (``None``: none chosen).
    """

    def __init__(self, friction: float | None):
        self.given_friction = friction
        self.base = DEFAULT_FRICTION if friction is None else friction
        self.damped = False
        self.share: float | None = None

    def damp(self, kernel: SGMCMCKernel, step_size: float) -> bool:
        r"""After warmup saw a step throw the momentum: unless a friction was given, follow the
        momentum decay from now on, at once at least :math:`\alpha M/\epsilon` at
        ``step_size`` (set on ``kernel.friction``); whether the friction follows it."""
        if self.given_friction is not None:
            return False
        self.damped = True
        self.hold(kernel, step_size)
        return True

    def hold(self, kernel: SGMCMCKernel, step_size: float) -> None:
        """Once damped, keep the momentum decay at least :func:`decay_of` at the step warmup
        settled on (below the stability rule's after a back-off)."""
        if self.damped:
            floor = decay_of(kernel) * kernel.mass / step_size
            kernel.friction = max(kernel.friction, floor)
            self.base = max(self.base, floor)

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

        friction = self.base
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

    def restore(self, kernel: SGMCMCKernel, curvature: float) -> float:
        """Forget the raise against the noise; the friction before it at the top
        ``curvature`` (to set on the kernel): the given one, the default, or once damped the
        decay's (:func:`friction_for_decay`)."""
        self.share = None
        if self.damped and curvature > 0 and math.isfinite(curvature):
            self.base = friction_for_decay(kernel, curvature)
        return self.base

    def load(self, share: float | None, base: float | None, damped: bool) -> None:
        """Continue with a checkpoint's share, friction before the raise and damping (the
        kernel sets its friction itself)."""
        self.share = share
        if base is not None:
            self.base = base
        self.damped = bool(damped)
