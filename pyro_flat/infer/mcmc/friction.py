r"""The minibatch-noise correction of an underdamped update, and the friction that holds it.

Target: the underdamped chain's law :math:`\exp(-U/T)\,\mathcal N(r; 0, MT)` when its gradient
is a minibatch's. The momentum of an SG step receives :math:`\epsilon^2 P_i v_i` of minibatch
noise (:math:`v_i` the gradient variance, :math:`P` the metric); injecting
:math:`2(C - \hat B_i)\epsilon T` instead of :math:`2C\epsilon T`, with
:math:`\hat B_i = \epsilon P_i v_i / (2T)`, gives the momentum :math:`2C\epsilon T` in all
(Chen et al. 2014, Eq. 13). :class:`NoiseCorrection` chooses :math:`\hat B` and, where
:math:`\max_i \hat B_i` would exceed
:data:`~pyro_flat.infer.mcmc.gradient_noise.CORRECTION_SHARE` of the given friction, the
smallest friction :math:`C` that holds it, at the stability rule's step for that :math:`C`
(:func:`~pyro_flat.infer.mcmc.gradient_noise.corrected_friction`). SGHMC and the underdamped
forms of SASGLD and EntropyMCMC use it when warmup chooses their step on a minibatched model.

Examples
--------
>>> import torch
>>> from pyro_flat.infer.mcmc.friction import NoiseCorrection
>>> fit = NoiseCorrection(1.0)
>>> fit.noise_scale(1.0, 0.01, 1.0) is None  # no correction chosen: the update's own noise
True
>>> fit.load(torch.tensor([1.0, 2.0]))  # a checkpoint's, at friction 4
>>> scale = fit.noise_scale(4.0, 0.01, 1.0)  # sqrt(2 (C - B) eps T)
>>> torch.allclose(scale.square(), torch.tensor([0.06, 0.04]))
True

References
----------
Chen, T., Fox, E. & Guestrin, C. (2014). Stochastic gradient Hamiltonian Monte Carlo. ICML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pyro_flat.infer.mcmc import gradient_noise

if TYPE_CHECKING:
    from pyro_flat.infer.mcmc.base import SGMCMCKernel


class NoiseCorrection:
    r"""What warmup chose for an underdamped update on a minibatched model: the friction and
    the per-coordinate correction :math:`\hat B` (see the module).

    Parameters
    ----------
    friction : float
        The given friction :math:`C`, in force until warmup raises it and again at each
        estimate (:meth:`restore`).

    Attributes
    ----------
    given_friction : float
        The given friction.
    correction : torch.Tensor or None
        :math:`\hat B`, shaped like the position (``None``: none chosen).
    """

    def __init__(self, friction: float):
        self.given_friction = friction
        self.correction: torch.Tensor | None = None
        self._scale: tuple[float, float, torch.Tensor] | None = None

    def fit(self, kernel: SGMCMCKernel, curvature: float, variance: torch.Tensor) -> float:
        """Choose the friction (set on ``kernel.friction``) and :math:`\\hat B` for the measured
        gradient ``variance`` at the top ``curvature``; the step size at that friction."""
        def step_for(friction: float) -> float:
            kernel.friction = friction
            return kernel.stability_fraction * kernel.stability_limit(curvature)

        inverse_mass = None if kernel.metric is None else kernel.metric.inverse_mass
        friction, step, self.correction = gradient_noise.corrected_friction(
            variance, kernel.temperature, self.given_friction, step_for, inverse_mass)
        kernel.friction, self._scale = friction, None
        return step

    def restore(self) -> float:
        """Forget the choice; the given friction (to set on the kernel)."""
        self.correction, self._scale = None, None
        return self.given_friction

    def load(self, correction: torch.Tensor | None) -> None:
        """Continue with a checkpoint's correction (the kernel sets its friction itself)."""
        self.correction, self._scale = correction, None

    def noise_scale(self, friction: float, step_size: float, temperature: float
                    ) -> torch.Tensor | None:
        r""":math:`\sqrt{2 (C - \hat B) \epsilon T}` per coordinate, kept for the step size
        (``None`` without a correction: the update injects its own noise)."""
        if self.correction is None:
            return None
        if self._scale is None or self._scale[:2] != (friction, step_size):
            variance = 2.0 * (friction - self.correction) * step_size * temperature
            self._scale = (friction, step_size, variance.clamp(min=0.0).sqrt())
        return self._scale[2]
