"""The baseline SG-MCMC kernels: SGLD, SGHMC and cyclical SGLD."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pyro_flat import validation
from pyro_flat.infer.mcmc import adaptation
from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.estimators import Estimate
from pyro_flat.infer.mcmc.friction import NoiseFriction
from pyro_flat.infer.mcmc.integrators import langevin_step_, underdamped_step_
from pyro_flat.infer.mcmc.state import KernelState, StateField

#: Work buffer for the Gaussian noise of a step (drawn with one ``normal_`` call).
NOISE = StateField("noise", "buffer for the step's Gaussian noise", init="scratch")
#: The momentum of the underdamped (SGHMC) update, zero at the start and after a fall-back.
MOMENTUM = StateField("momentum", "the momentum r, zero at the start", reset=True)


class SGLD(SGMCMCKernel):
    r"""Stochastic gradient Langevin dynamics.

    Target :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)`. One gradient per step:

    .. math:: \theta \leftarrow \theta - \epsilon \nabla \hat U(\theta) + \sqrt{2 \epsilon T}\,\xi,
        \qquad \xi \sim \mathcal{N}(0, I)

    where :math:`\hat U` is the minibatch potential. With a full batch it is the unadjusted
    Langevin algorithm. An SGD learning rate ``lr`` on the mean loss over ``N`` data points is
    ``step_size = lr / N``. All arguments are those of :class:`SGMCMCKernel`.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> pyro.set_rng_seed(0)
    >>> from pyro.infer import MCMC
    >>> from pyro_flat.infer import SGLD
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x), subsample_size=20) as i:
    ...         pyro.sample("y", dist.Normal(w * x[i], 1.0), obs=y[i])
    >>> x = torch.randn(200); y = 2 * x + torch.randn(200)
    >>> mcmc = MCMC(SGLD(model, step_size=1e-3, num_steps_per_sample=5), num_samples=200,
    ...             warmup_steps=50, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> float(mcmc.get_samples()["w"].mean())  # doctest: +SKIP
    1.98

    References
    ----------
    Welling, M. & Teh, Y. W. (2011). Bayesian learning via stochastic gradient Langevin
    dynamics. ICML.
    """

    def state_fields(self) -> tuple[StateField, ...]:
        return (NOISE,)

    supports_adaptation = True
    supports_preconditioner = True

    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        langevin_step_(state.position, estimate.step_grad, step_size, self.temperature,
                       state.noise, metric=self.metric)

    def stability_limit(self, curvature: float) -> float:
        r"""The Langevin step's :math:`2/\lambda`."""
        return adaptation.langevin_limit(curvature)


class SGHMC(SGMCMCKernel):
    r"""Stochastic gradient Hamiltonian Monte Carlo with friction.

    Target :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)`, momentum :math:`r \sim
    \mathcal{N}(0, MT)` at stationarity. One gradient per step (Chen et al. 2014, Eq. 13):

    .. math::

        r &\leftarrow r - \epsilon \nabla \hat U(\theta) - \epsilon C M^{-1} r
              + \mathcal{N}\big(0, 2 (C - \hat B) \epsilon T\big) \\
        \theta &\leftarrow \theta + \epsilon M^{-1} r

    The momentum starts at zero. In the SGD-with-momentum form, with velocity
    :math:`v = \epsilon M^{-1} r`, this is :math:`v \leftarrow (1 - \alpha) v - \eta \nabla \hat U +
    \mathcal{N}(0, 2(\alpha - \hat\beta)\eta T)`, :math:`\theta \leftarrow \theta + v` with
    learning rate :math:`\eta = \epsilon^2 / M` on ``U`` and :math:`\alpha = \epsilon C / M`; so SGD
    with learning rate ``lr`` on the mean loss over ``N`` points and momentum ``mu`` is
    ``SGHMC.from_sgd(model, lr, mu, N)`` (``step_size=1``, ``mass=N/lr``,
    ``friction=(1-mu)N/lr``).

    Parameters
    ----------
    friction : float, optional
        :math:`C > 0`; ``step_size * friction / mass`` (the per-step momentum decay) must be in
        ``(0, 1]``. Omitted: 1; but when warmup, choosing the step, sees a step throw the
        momentum far beyond its law, the friction from then on is the one at which the
        momentum decays by 0.1 per step (SGD's momentum 0.9), chosen with the step at each
        later estimate (:mod:`~pyro_flat.infer.mcmc.friction`). When warmup chooses the step
        size on a minibatched model it raises the friction (given or not) until the
        minibatch noise heats the chain by at most 5% (the chosen value is in
        ``diagnostics()["gradient_noise"]`` and ``diagnostics()["step_size_adaptation"]``).
        A run reads the momentum against its law :math:`\mathcal N(0, MT)` and warns when a
        step was unstable somewhere (:mod:`~pyro_flat.infer.mcmc.momentum_watch`).
    mass : float
        Scalar mass :math:`M > 0`.
    noise_estimate : float
        :math:`\hat B \in [0, C]`, an estimate of the gradient-noise term (``0`` ignores it);
        gradient noise of variance :math:`s^2` per element is
        :math:`\hat B = \epsilon s^2 / (2T)`. Subtracted from the injected noise as given:
        warmup raises the friction instead of estimating it.
    **kwargs
        The arguments of :class:`SGMCMCKernel`.

    References
    ----------
    Chen, T., Fox, E. & Guestrin, C. (2014). Stochastic gradient Hamiltonian Monte Carlo. ICML.
    """

    supports_adaptation = True
    supports_preconditioner = True

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        friction: float | None = None,
        mass: float = 1.0,
        noise_estimate: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(model, step_size, **kwargs)
        if friction is not None:
            friction = validation.positive("friction", friction)
        self.mass = validation.positive("mass", mass)
        #: The friction: the given one or the default, damped after a throw and raised on a
        #: minibatched model by warmup.
        self.noise_fit = NoiseFriction(friction)
        self.friction = self.noise_fit.base
        self.noise_estimate = validation.in_range(
            "noise_estimate", noise_estimate, 0.0, self.friction)
        if self.step_size is not None:
            self.check_step_size(self.step_size)

    def momentum_friction(self) -> float:
        return self.friction

    def noise_correction(self) -> float:
        return self.noise_estimate

    def stability_limit(self, curvature: float) -> float:
        return adaptation.underdamped_limit(curvature, self.friction, self.mass)

    def check_step_size(self, step_size: float) -> None:
        validation.in_range(
            "step_size * friction / mass", step_size * self.friction / self.mass, 0, 1,
            closed="(]",
        )
        validation.in_range("noise_estimate", self.noise_estimate, 0.0, self.friction)

    @classmethod
    def from_sgd(
        cls, model: Callable, lr: float, momentum: float, num_data: int, **kwargs: Any
    ) -> SGHMC:
        """SGHMC equivalent to SGD with learning rate ``lr`` on the mean loss and ``momentum``."""
        lr = validation.positive("lr", lr)
        momentum = validation.in_range("momentum", momentum, 0.0, 1.0, closed="[)")
        n = validation.integer_at_least("num_data", num_data, 1)
        return cls(model, 1.0, friction=(1 - momentum) * n / lr, mass=n / lr, **kwargs)

    def state_fields(self) -> tuple[StateField, ...]:
        return (MOMENTUM, NOISE)


    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        underdamped_step_(
            state.position, state.momentum, estimate.step_grad, step_size, self.friction,
            self.mass, self.temperature, state.noise, self.noise_estimate, metric=self.metric,
        )


class CyclicalSGLD(SGLD):
    r"""Cyclical SGLD (Zhang et al. 2020): cosine step-size cycles, explore then sample.

    Target :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)`. Within each cycle of ``L`` SG steps
    the step size at step ``t`` is

    .. math:: \epsilon_t = \frac{\epsilon_0}{2}\left[\cos\left(\frac{\pi\,(t \bmod L)}{L}\right)
        + 1\right],

    the first ``exploration_fraction`` of the cycle is gradient descent (no noise), the rest is
    SGLD, and ``draws_per_cycle`` draws are returned at the end of each cycle, evenly spaced in
    its sampling stage, the last on the cycle's final step. One call of ``sample`` runs up to
    the next draw, so ``MCMC(kernel, num_samples=M * draws_per_cycle,
    warmup_steps=W * draws_per_cycle)`` runs ``W`` discarded cycles then ``M`` kept ones.

    Parameters
    ----------
    step_size : float
        :math:`\epsilon_0`, the step size at the start of each cycle.
    cycle_length : int
        ``L``, SG steps per cycle, ``>= 2``.
    exploration_fraction : float
        :math:`\beta \in [0, 1)`, the noiseless share of each cycle.
    draws_per_cycle : int
        Draws kept per cycle, at most the number of steps in the sampling stage.
    **kwargs
        The arguments of :class:`SGMCMCKernel` except ``num_steps_per_sample`` and
        ``step_size_schedule``, which the cycles replace.

    References
    ----------
    Zhang, R., Li, C., Zhang, J., Chen, C. & Wilson, A. G. (2020). Cyclical stochastic gradient
    MCMC for Bayesian deep learning. ICLR.
    """

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        cycle_length: int,
        exploration_fraction: float = 0.8,
        draws_per_cycle: int = 1,
        **kwargs: Any,
    ):
        for fixed in ("num_steps_per_sample", "step_size_schedule"):
            if fixed in kwargs:
                raise ValueError(f"CyclicalSGLD sets {fixed} from its cycles; do not pass it")
        super().__init__(model, step_size, **kwargs)
        self.step_size_schedule = self._cosine
        self.cycle_length = validation.integer_at_least("cycle_length", cycle_length, 2)
        self.exploration_fraction = validation.in_range(
            "exploration_fraction", exploration_fraction, 0.0, 1.0, closed="[)"
        )
        # round first: 0.8 * 5 is 4.000000000000001 in floating point, whose ceiling is 5
        self._sampling_start = math.ceil(round(self.exploration_fraction * self.cycle_length, 9))
        sampling_steps = self.cycle_length - self._sampling_start
        if sampling_steps == 0:
            raise ValueError(
                f"cycle_length={cycle_length} with exploration_fraction={exploration_fraction} "
                "leaves no SG step of the cycle to sample in: lengthen the cycle or lower the "
                "exploration fraction"
            )
        self.draws_per_cycle = validation.integer_at_least("draws_per_cycle", draws_per_cycle, 1)
        if self.draws_per_cycle > sampling_steps:
            raise ValueError(
                f"draws_per_cycle must be an integer in [1, {sampling_steps}] (the steps in the "
                f"sampling stage of a cycle), got {draws_per_cycle}"
            )
        spacing = sampling_steps // self.draws_per_cycle
        last = self.cycle_length - 1
        self._draw_positions = [last - spacing * (self.draws_per_cycle - 1 - j)
                                for j in range(self.draws_per_cycle)]

    def _cosine(self, t: int) -> float:
        r = t % self.cycle_length
        return 0.5 * self.base_step_size * (math.cos(math.pi * r / self.cycle_length) + 1.0)

    def in_exploration(self, t: int) -> bool:
        """Whether SG step ``t`` lies in the noiseless exploration stage of its cycle."""
        return t % self.cycle_length < self._sampling_start

    def steps_for_next_draw(self) -> int:
        r = self.num_steps % self.cycle_length
        nxt = next(p for p in self._draw_positions + [self._draw_positions[0] + self.cycle_length]
                   if p >= r)
        return nxt - r + 1

    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        temperature = 0.0 if self.in_exploration(self.num_steps) else self.temperature
        langevin_step_(state.position, estimate.step_grad, step_size, temperature, state.noise,
                       metric=self.metric)
