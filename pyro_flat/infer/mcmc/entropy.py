"""Entropy-MCMC: sampling from flat basins with a guiding variable (Li & Zhang, ICLR 2024)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pyro_flat import validation
from pyro_flat.infer.mcmc import dynamics as dyn
from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.estimators import Estimate
from pyro_flat.infer.mcmc.friction import NoiseFriction
from pyro_flat.infer.mcmc.integrators import langevin_step_, underdamped_step_
from pyro_flat.infer.mcmc.noise import PrefetchedNormal
from pyro_flat.infer.mcmc.sgld import MOMENTUM, NOISE
from pyro_flat.infer.mcmc.state import KernelState, StateField

#: Suffix of the guiding variable's sites in the draws: ``"fc1.weight"`` -> ``"fc1.weight__guide"``.
GUIDE_SUFFIX = "__guide"

#: The guiding variable theta_a: starts as a copy of theta, returned with every draw.
GUIDE = StateField("guide", "the guiding variable theta_a, starting at theta",
                   init="position", draws_suffix=GUIDE_SUFFIX)
GUIDE_MOMENTUM = StateField("guide_momentum", "the guide's momentum (underdamped form)",
                            reset=True)
GUIDE_GRAD = StateField("guide_grad", "buffer for the coupling force on the guide",
                        init="scratch")
THETA_GRAD = StateField("theta_grad", "buffer for theta's gradient plus the coupling force",
                        init="scratch")


class EntropyMCMC(SGMCMCKernel):
    r"""Entropy-MCMC: SGLD on the model's parameters :math:`\theta` coupled to a guiding copy
    :math:`\theta_a` that explores the posterior smoothed at scale :math:`\sqrt{\eta T}`.

    **Joint target** (tempered coupling, the authors' code and the default):

    .. math:: p(\theta, \theta_a) \propto
        \exp\!\Big(-\big[U(\theta) + \|\theta - \theta_a\|^2 / (2\eta)\big] / T\Big).

    Its :math:`\theta`-marginal is the tempered posterior :math:`\pi_T \propto e^{-U/T}` itself;
    its :math:`\theta_a`-marginal is the smoothed posterior :math:`\pi_T * \mathcal{N}(0, \eta T I)`
    (at :math:`T = 1` the paper's :math:`\pi * \mathcal{N}(0, \eta I)`), whose mass favours wide
    basins over sharp ones of the same height. With ``tempered_coupling=False`` the coupling is
    not divided by ``T``: :math:`p \propto e^{-U/T - \|\theta-\theta_a\|^2/(2\eta)}`, the
    smoothing width is :math:`\sqrt{\eta}` at every temperature, and the coupling forces below
    are multiplied by ``T``. For a Gaussian target :math:`\mathcal{N}(\mu, \Sigma)` the
    stationary joint is Gaussian with :math:`\mathrm{Cov}\,\theta = T\Sigma`,
    :math:`\mathrm{Cov}\,\theta_a = T\Sigma + \eta T I` and
    :math:`\mathrm{Cov}(\theta, \theta_a) = T\Sigma`.

    **One step** (Langevin form; one gradient of ``U`` and a second parameter copy):

    .. math::

        \theta &\leftarrow \theta - \epsilon\big[\nabla \hat U(\theta)
            + (\theta - \theta_a)/\eta\big] + \sqrt{2\epsilon T}\,\xi_1 \\
        \theta_a &\leftarrow \theta_a - \epsilon(\theta_a - \theta)/\eta + \sqrt{2\epsilon T}\,\xi_2

    (both from the same old values). With ``dynamics="underdamped"`` both variables take an
    SGHMC step (:func:`~pyro_flat.infer.mcmc.integrators.underdamped_step_`, friction
    :math:`C`, mass :math:`M`) on the same joint energy instead.

    **State.** The position :math:`\theta`, the ``guide`` :math:`\theta_a` (a copy of
    :math:`\theta` at the start), and with ``dynamics="underdamped"`` the ``momentum`` and
    ``guide_momentum`` (zero at the start and after a non-finite step).

    **Cost.** One gradient per step, as SGLD; beyond SGLD's update, three vector passes (the
    coupling as two ``lerp_``, the guide's noise) and a second Gaussian vector :math:`\xi_2`,
    which is what costs on a CPU. :math:`\xi_2` does not depend on the step, so when a core is
    spare (torch's intra-op threads leave one free) it is drawn ahead in blocks on a worker
    thread (:class:`~pyro_flat.infer.mcmc.noise.PrefetchedNormal`, same values; attribute
    ``prefetch_noise``). On a network whose gradient dominates the step (a CNN) a step costs
    about as much as SGLD's; on a small MLP the second vector adds a noticeable share, less
    with a spare core than with every core busy (docs/methods/entropy_mcmc.md, "Cost").

    **Draws** hold :math:`\theta` under the model's site names and :math:`\theta_a` under the same
    names with the suffix ``"__guide"``; :func:`select_draws` maps either (or both) onto the
    model's names for :class:`pyro.infer.Predictive` and Bayesian model averaging. The per-draw
    statistic ``coupling_distance`` is :math:`\|\theta - \theta_a\|`. :math:`\theta_a` starts as
    a copy of :math:`\theta`.

    **From the authors' settings.** Their SGD learning rate ``lr`` on the mean loss over ``N``
    data points is ``step_size = lr / N``; their :math:`\eta` already acts on the summed
    potential and is used as is (CIFAR-10: ``lr = 0.5``, ``eta = 4e-4``, ``T = 1e-4``, so
    :math:`\epsilon/\eta = 0.025`). Stability needs :math:`\epsilon/\eta \ll 1`.

    **BatchNorm.** Running statistics are buffers of the network, not sites: :math:`\theta_a`
    never runs a forward pass, so its draws have no statistics of their own. Recompute them for
    each :math:`\theta_a` draw before predicting (the authors refresh them every epoch); a
    normalisation-free network avoids the question.

    Parameters
    ----------
    eta : float
        The coupling :math:`\eta > 0`; larger means a wider smoothing and a looser guide.
    dynamics : {"langevin", "underdamped"}
        The Langevin form (the default) or the underdamped (SGHMC) form.
    friction : float, optional
        :math:`C > 0` of the underdamped form; it needs ``dynamics="underdamped"``.
        Omitted: SGHMC's default (1, and the friction of a momentum decay of 0.1 per step once
        warmup saw a step throw the momentum; :mod:`~pyro_flat.infer.mcmc.friction`).
    mass : float
        Scalar mass :math:`M > 0` of the underdamped form.
    tempered_coupling : bool
        Divide the coupling by ``T`` too (default, as the authors do), see above.
    coupling : bool
        ``False`` switches the coupling off (an ablation): :math:`\theta` is then exactly SGLD
        (or SGHMC) and :math:`\theta_a` a free random walk.
    **kwargs
        The arguments of :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> pyro.set_rng_seed(0)
    >>> from pyro.infer import MCMC
    >>> from pyro_flat.infer import EntropyMCMC
    >>> from pyro_flat.infer.mcmc.entropy import select_draws
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x), subsample_size=20) as i:
    ...         pyro.sample("y", dist.Normal(w * x[i], 1.0), obs=y[i])
    >>> x = torch.randn(200); y = 2 * x + torch.randn(200)
    >>> kernel = EntropyMCMC(model, step_size=1e-3, eta=0.05, num_steps_per_sample=5)
    >>> mcmc = MCMC(kernel, num_samples=100, warmup_steps=50, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> sorted(mcmc.get_samples())
    ['w', 'w__guide']
    >>> select_draws(mcmc.get_samples(), "both")["w"].shape
    torch.Size([200])

    References
    ----------
    Li, B. & Zhang, R. (2024). Entropy-MCMC: Sampling from flat basins with ease. ICLR.
    """

    stat_names = SGMCMCKernel.stat_names + ("coupling_distance",)
    supports_adaptation = True
    supports_preconditioner = False  # a metric would reshape the smoothing kernel
    #: Draw the guide's noise ahead on a worker thread (``None``: when a core is spare, see
    #: :mod:`pyro_flat.infer.mcmc.noise`); the values are the same either way.
    prefetch_noise: bool | None = None

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        eta: float,
        dynamics: str | None = None,
        friction: float | None = None,
        mass: float = 1.0,
        tempered_coupling: bool = True,
        coupling: bool = True,
        **kwargs: Any,
    ):
        super().__init__(model, step_size, **kwargs)
        self.eta = validation.positive("eta", eta)
        self.dynamics, friction = dyn.resolve_dynamics("EntropyMCMC", dynamics, friction)
        self.mass = validation.positive("mass", mass)
        #: The underdamped form's friction: the given one or SGHMC's default, damped after a
        #: throw and raised on a minibatched model by warmup (the Langevin form shrinks the
        #: step instead).
        self.noise_fit = (NoiseFriction(friction) if self.dynamics == "underdamped"
                          else None)
        self.friction = friction if self.noise_fit is None else self.noise_fit.base
        self.tempered_coupling = bool(tempered_coupling)
        self.coupling = bool(coupling)
        if self.step_size is not None:
            self.check_step_size(self.step_size)

    def state_fields(self) -> tuple[StateField, ...]:
        if self.dynamics == "langevin":
            return (GUIDE, NOISE)
        return (GUIDE, MOMENTUM, GUIDE_MOMENTUM, GUIDE_GRAD, THETA_GRAD, NOISE)

    def momentum_friction(self) -> float | None:
        return self.friction if self.dynamics == "underdamped" else None

    def heating_curvature(self, curvature: float) -> float:
        return curvature + self.coupling_strength

    def stability_limit(self, curvature: float) -> float:
        r"""The limit at the joint curvature: the largest eigenvalue of the Hessian of
        :math:`U(\theta) + k\|\theta-\theta_a\|^2/2` in :math:`(\theta, \theta_a)`,
        :math:`(\lambda + 2k + \sqrt{\lambda^2 + 4k^2})/2`, with :math:`k` the coupling
        strength."""
        k = self.coupling_strength
        joint = 0.5 * (curvature + 2 * k + math.sqrt(curvature**2 + 4 * k * k))
        return dyn.stability_limit(self.dynamics, joint, self.friction, self.mass)

    def check_step_size(self, step_size: float) -> None:
        factor = 1.0 if self.tempered_coupling else max(self.temperature, 1e-300)
        validation.in_range("step_size * coupling / eta", step_size * factor / self.eta,
                            0.0, 1.0, closed="()")
        if self.dynamics == "underdamped":
            dyn.check_underdamped_step(step_size, self.friction, self.mass)

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        super().setup(warmup_steps, *args, **kwargs)
        # theta_a's noise is independent of the step, so it is drawn ahead while the gradient
        # is computed (same values as drawing it in the step; see noise.py)
        if getattr(self, "_guide_noise", None) is not None:
            self._guide_noise.close()
        self._guide_noise = PrefetchedNormal(self.state.position, self.aux_generator,
                                             prefetch=self.prefetch_noise)

    def _next_guide_noise(self) -> torch.Tensor:
        return self._guide_noise.next()

    def aux_generator_state(self) -> Any:
        return self._guide_noise.generator_state()

    def cleanup(self) -> None:
        """End of a run (called by ``MCMC``): stop the noise worker thread, so that no thread of
        this kernel outlives the run (e.g. into chains forked for a later multi-chain run)."""
        guide_noise = getattr(self, "_guide_noise", None)
        if guide_noise is not None:
            guide_noise.close()
        super().cleanup()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_guide_noise", None)
        return state

    @property
    def coupling_strength(self) -> float:
        """The force per unit distance, :math:`1/\\eta` (times ``T`` if untempered; 0 if off)."""
        if not self.coupling:
            return 0.0
        return (1.0 if self.tempered_coupling else self.temperature) / self.eta

    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        k = self.coupling_strength
        t = self.temperature
        z, guide, grad = state.position, state.guide, estimate.step_grad
        if self.dynamics == "langevin":
            # The coupling moves theta and theta_a towards each other by w = eps k times their
            # difference d = theta - theta_a: theta - w d = lerp(theta, theta_a, w), and then
            # theta_a + w d = lerp(theta_a, theta', w / (1 - w)) with the moved theta', whose
            # distance to theta_a is (1 - w) d. Two passes, no buffer for d.
            w = step_size * k
            if w > 0:
                z.lerp_(guide, w)
                guide.lerp_(z, w / (1.0 - w))
            langevin_step_(z, grad, step_size, t, state.noise)
            if t > 0:
                noise = self._next_guide_noise()
                guide.add_(noise, alpha=math.sqrt(2.0 * step_size * t))
        else:
            # gradient of the joint energy in theta_a: k (theta_a - theta); in theta: grad + that
            guide_grad = state.guide_grad
            torch.sub(guide, z, out=guide_grad)
            grad = torch.sub(grad, guide_grad, alpha=k, out=state.theta_grad)
            guide_grad.mul_(k)
            c, m = self.friction, self.mass
            underdamped_step_(z, state.momentum, grad, step_size, c, m, t, state.noise)
            # theta_a's force has no minibatch noise: its momentum keeps the friction before
            # the raise (a friction warmup raised for theta's noise would all but freeze it)
            underdamped_step_(guide, state.guide_momentum, guide_grad, step_size,
                              self.noise_fit.base, m, t, self._next_guide_noise(),
                              draw_noise=False)

    def draw_statistics(self) -> dict[str, list[float]]:
        distance = torch.linalg.vector_norm(self.state.position - self.state.guide, dim=-1)
        return {"coupling_distance": distance.tolist()}


def select_draws(
    samples: Mapping[str, torch.Tensor], which: str = "theta", *, dim: int = 0
) -> dict[str, torch.Tensor]:
    """Draws of an :class:`EntropyMCMC` run under the model's own site names.

    Parameters
    ----------
    samples : dict
        ``mcmc.get_samples()`` (draws along ``dim = 0``) or ``get_samples(group_by_chain=True)``
        (then pass ``dim=1`` to concatenate along the draws).
    which : {"theta", "guide", "both"}
        The model's parameters, the guiding variable, or both (``theta`` draws first, then
        ``guide`` draws, concatenated along ``dim``), as the authors' model average uses.

    Returns
    -------
    dict
        ``{site: draws}`` for the model's sites, ready for :class:`pyro.infer.Predictive`.
    """
    if which not in ("theta", "guide", "both"):
        raise ValueError(f"which must be 'theta', 'guide' or 'both', got {which!r}")
    theta = {k: v for k, v in samples.items() if not k.endswith(GUIDE_SUFFIX)}
    guide = {k[: -len(GUIDE_SUFFIX)]: v for k, v in samples.items() if k.endswith(GUIDE_SUFFIX)}
    if not guide:
        raise ValueError("these samples hold no guiding-variable sites (names ending '__guide')")
    if which == "theta":
        return theta
    if which == "guide":
        return guide
    return {k: torch.cat([theta[k], guide[k]], dim=dim) for k in theta}
