r"""The contract between a kernel's update rule and the machinery that runs it.

:class:`UpdateRule` is what an SG-MCMC kernel states about its own update, and nothing else:
its state (``state_fields``), the update itself (``update(state, estimate, step_size)``,
in place), what it supports (both off unless declared: warmup's choice of the step size,
which needs the update's own ``stability_limit``; a diagonal metric), its stability condition
and how its dynamics meet minibatch gradient noise. :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`
runs any update rule under ``pyro.infer.MCMC``; a new kernel subclasses it and writes the
parts of this contract that are its own (the architecture page shows one in 46 lines).

.. math:: \theta_{t+1} = \text{update}(\theta_t, \nabla \hat U(\theta_t), \epsilon_t)
"""

from __future__ import annotations

from typing import Any

import torch

from pyro_flat.infer.mcmc import adaptation, gradient_noise, momentum_watch
from pyro_flat.infer.mcmc.estimators import Estimate
from pyro_flat.infer.mcmc.friction import NoiseFriction
from pyro_flat.infer.mcmc.state import KernelState, StateField

__all__ = ["UpdateRule"]


class UpdateRule:
    """What an SG-MCMC kernel states about its update (see the module). The kernel's other
    attributes it reads are public: ``temperature``, ``metric``, ``friction`` (an underdamped
    update's), ``num_steps``, ``in_warmup``, ``state``."""

    #: Whether warmup may choose the step size when none is given: a kernel that says so also
    #: states its update's :meth:`stability_limit`. Off unless declared, so that a new kernel
    #: is not adapted with a limit that is not its own.
    supports_adaptation: bool = False
    #: Whether the update takes a diagonal metric (``preconditioner="diag"``) and stays exact.
    #: Off unless declared: an update that ignores ``self.metric`` would be silently wrong.
    supports_preconditioner: bool = False
    #: Whether an omitted ``step_size`` follows the kernel's own rule (:meth:`rule_step_size`,
    #: e.g. L2E's meta-learned step) rather than warmup's choice.
    has_step_size_rule: bool = False

    # ------------------------------------------------------------------ the update

    def state_fields(self) -> tuple[StateField, ...]:
        """The state this kernel carries beside the position and the step count: a tuple of
        :class:`~pyro_flat.infer.mcmc.state.StateField` (none here: SGLD's chain is its
        position). Called once per run, after the model is traced (a field may depend on the
        layout or on ``vectorized_chains``)."""
        return ()

    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        """Move ``state.position`` (and the kernel's fields) in place, given the estimator's
        ``estimate`` (its ``step_grad`` is the gradient to move with)."""
        raise NotImplementedError

    def check_step_size(self, step_size: float) -> None:
        """Raise ``ValueError`` if the update is unstable at ``step_size``.

        A kernel with a stability condition (e.g. SGHMC's per-step momentum decay
        ``step_size * friction / mass`` in ``(0, 1]``) states it here. It is checked for a
        constant ``step_size`` when the kernel is built and for every value a
        ``step_size_schedule`` returns, at the step that uses it.
        """

    def stability_limit(self, curvature: float) -> float:
        r"""The largest stable step of :meth:`update` on a quadratic potential of the given
        curvature (largest Hessian eigenvalue; of :math:`P^{1/2} H P^{1/2}` with a metric),
        e.g. the Langevin step's :math:`2/\lambda` (:func:`.adaptation.langevin_limit`).
        Every kernel with ``supports_adaptation = True`` states its own; there is no default,
        because a limit that is not the update's own adapts a step that diverges or crawls."""
        raise NotImplementedError(
            f"{type(self).__name__} declares supports_adaptation but not its update's "
            "stability_limit(curvature)")

    def draw_statistics(self) -> dict[str, list[Any]]:
        """This kernel's own statistics known when a draw is made (e.g. ``coupling_distance``),
        a list of one value per chain each (a single chain is one)."""
        return {}

    def statistics_at_draw(self, energy: list[float]) -> dict[str, list[Any]]:
        r"""This kernel's own statistics of a draw that need the potential at it (``energy``,
        the minibatch :math:`\hat U` there, one per chain), e.g. ContourSGLD's
        ``log_weight``: a list of one value per chain each."""
        return {}

    # ------------------------------------------------------------------ what warmup asks

    #: Whether a run warns when the excess temperature is above the bound (a kernel whose
    #: dynamics were fitted to minibatch noise, as L2E's meta-learned ones, reports it only).
    warns_on_gradient_noise: bool = True
    #: How an underdamped update chooses its friction against the minibatch noise (SGHMC, and
    #: SASGLD and EntropyMCMC with ``dynamics="underdamped"``); ``None``: warmup shrinks the
    #: step instead.
    noise_fit: NoiseFriction | None = None

    @property
    def noise_fit_from(self) -> float:
        """The fraction of warmup from which the adapted step also accounts for the minibatch
        gradient noise (:meth:`fit_gradient_noise`); before it only stability counts. A kernel
        with a ``noise_fit`` fits from the start: its momentum would keep the noise's heat."""
        return 0.0 if self.noise_fit is not None else adaptation.NOISE_FROM

    def fit_gradient_noise(self, step_size: float, curvature: float,
                           variance: torch.Tensor) -> float:
        r"""The adapted step size given the measured minibatch gradient ``variance``. With a
        ``noise_fit``, the friction it chooses and the step of the stability rule at that
        friction (:meth:`~pyro_flat.infer.mcmc.friction.NoiseFriction.fit`). Otherwise at most
        ``step_size`` (the stability rule's), and small enough that the minibatch noise is at
        most :data:`~pyro_flat.infer.mcmc.gradient_noise.TARGET_RATIO` of the injected noise
        in every coordinate (the ratio is linear in the step)."""
        if self.noise_fit is not None:
            return self.noise_fit.fit(self, curvature, variance)
        ratio = float(self.gradient_noise_terms(variance, step_size)[0].max())
        if ratio > gradient_noise.TARGET_RATIO:
            return step_size * gradient_noise.TARGET_RATIO / ratio
        return step_size

    def heating_curvature(self, curvature: float) -> float:
        """The curvature along which the minibatch noise moves the position, given the
        potential's largest ``curvature`` (a kernel that adds a force, as EntropyMCMC's
        coupling, adds its curvature)."""
        return curvature

    def gradient_noise_terms(self, variance: torch.Tensor, step_size: float
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per coordinate, the noise ratio and the relative excess temperature of a step of
        ``step_size`` (:mod:`~pyro_flat.infer.mcmc.gradient_noise`); the excess counts the
        share of the noise that reaches the position with epoch-wise batches where warmup
        chose the friction (the ``share`` of its
        :class:`~pyro_flat.infer.mcmc.friction.NoiseFriction`), and all of it otherwise."""
        share = None if self.noise_fit is None else self.noise_fit.share
        terms = {"step_size": step_size, "temperature": self.temperature,
                 "inverse_mass": None if self.metric is None else self.metric.inverse_mass,
                 "friction": self.momentum_friction(), "correction": self.noise_correction()}
        return (gradient_noise.noise_ratio(variance, **terms),
                gradient_noise.temperature_excess(variance, **terms,
                                                  share=1.0 if share is None else share))

    def momentum_friction(self) -> float | None:
        """The friction of an underdamped update (``None``: a Langevin update)."""
        return None

    #: Whether the draws (reweighted, for a kernel with importance weights) follow the target
    #: :math:`\pi_T`, so that a run warns when their configurational temperature is far from
    #: ``T`` (:mod:`.configurational_temperature`); otherwise it is only reported.
    follows_target: bool = True

    #: Whether a run reads the momentum against its law :math:`\mathcal N(0, MT)` for the
    #: sign of an unstable step (:mod:`.momentum_watch`; L2E's meta-learned update does not
    #: hold that law).
    watches_momentum: bool = True

    def momentum_sd(self, step_size: float) -> float | None:
        """The stationary sd of a momentum coordinate of the underdamped update at
        ``step_size`` (:func:`.momentum_watch.momentum_sd`); ``None``: no momentum to watch (a
        Langevin update, ``temperature=0``, or ``watches_momentum = False``)."""
        friction = self.momentum_friction()
        if friction is None or not self.watches_momentum or not self.temperature > 0:
            return None
        return momentum_watch.momentum_sd(step_size, friction, self.mass, self.temperature)

    def noise_correction(self) -> float | torch.Tensor:
        r"""The update's gradient-noise correction :math:`\hat B` (0: none)."""
        return 0.0

    def load_noise_friction(self, friction: float, share: float | None,
                            base: float | None = None, damped: bool = False) -> None:
        """Continue with the friction a checkpoint's warmup chose, the share of the noise
        that reaches the position at it, the friction before the raise against the noise and
        whether it follows the momentum decay (a kernel without a ``noise_fit`` keeps its own
        friction)."""
        if self.noise_fit is None:
            return
        self.friction = friction
        self.noise_fit.load(share, base, damped)

    def damp_momentum(self, step_size: float) -> bool:
        """After warmup saw a step throw the momentum: a friction that was not given follows
        the momentum decay from now on, at ``step_size`` at once
        (:meth:`~pyro_flat.infer.mcmc.friction.NoiseFriction.damp`); whether it does."""
        return self.noise_fit is not None and self.noise_fit.damp(self, step_size)

    def hold_momentum_decay(self, step_size: float) -> None:
        """Keep a damped friction's momentum decay at the step warmup settled on."""
        if self.noise_fit is not None:
            self.noise_fit.hold(self, step_size)

    def restore_friction(self, curvature: float) -> None:
        """Undo what an earlier estimate chose against the noise: the given friction, the
        default, or once damped the momentum decay's at the top ``curvature``
        (:meth:`~pyro_flat.infer.mcmc.friction.NoiseFriction.restore`)."""
        if self.noise_fit is not None:
            self.friction = self.noise_fit.restore(self, curvature)

    #: Defaults of this kernel's statistics until they are known (others: NaN).
    stat_defaults: dict[str, Any] = {}
    #: Statistics whose values are not floats.
    stat_dtypes: dict[str, torch.dtype] = {"diverging": torch.bool}

    def rule_step_size(self) -> float:
        """The step size of the kernel's own rule when ``step_size`` is omitted (a kernel with
        ``has_step_size_rule = True`` states it)."""
        raise NotImplementedError(f"{type(self).__name__} declares has_step_size_rule but not "
                                  "its rule_step_size()")

