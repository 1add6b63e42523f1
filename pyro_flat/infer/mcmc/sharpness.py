"""SA-SGLD: SGLD on the sharpness-aware posterior (Nguyen et al., NeurIPS 2023)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from pyro_flat import validation
from pyro_flat.infer.mcmc import dynamics as dyn
from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.estimators import Estimate, SharpnessAwareGradient
from pyro_flat.infer.mcmc.friction import NoiseFriction
from pyro_flat.infer.mcmc.integrators import langevin_step_, underdamped_step_
from pyro_flat.infer.mcmc.sgld import MOMENTUM, NOISE
from pyro_flat.infer.mcmc.state import KernelState, StateField
from pyro_flat.models.batchnorm import find_batchnorm
from pyro_flat.optim.ascent import ASAM_OFFSET

#: Deprecated name of :data:`pyro_flat.optim.ascent.ASAM_OFFSET`.
GEOMETRY_ETA = ASAM_OFFSET

class SASGLD(SGMCMCKernel):
    r"""Sharpness-aware SGLD (F-SGLD): Langevin dynamics on the sharpness-aware posterior.

    **Target** :math:`q_{SA}(\theta) \propto \exp\big(-\max_{\|\theta'-\theta\| \le \rho}
    L(\theta')\big)\,p(\theta)`, tempered by ``T``, with the inner maximum approximated by one
    normalised ascent step (SAM's), as in the paper.

    **One step** (two forward/backward passes on the *same* minibatch):

    .. math::

        g &= \nabla \hat U(\theta), \qquad e = \rho\, g / \|g\|_2 \\
        \theta &\leftarrow \theta - \epsilon\,\nabla \hat U(\theta + e) + \sqrt{2 \epsilon T}\,\xi,
            \qquad \xi \sim \mathcal{N}(0, I)

    The norm runs over all parameters together. The perturbed gradient is that of the whole
    minibatch potential :math:`\hat U` (likelihood *and* prior) at :math:`\theta + e`: the
    sharpness-aware potential is then simply :math:`\hat U(\theta + e(\theta))`, one ascent
    step on all of ``U``; taking the prior's gradient at :math:`\theta` instead, as the
    description of the authors' method allows, differs by
    :math:`\nabla^2 \log p \cdot e = O(\rho / \sigma_{\text{prior}}^2)`, negligible beside
    the likelihood's curvature of a BNN. A zero gradient gives :math:`e = 0`.

    With ``geometry=True`` the ball is the ASAM ellipsoid :math:`\|T_\theta^{-1} e\| \le \rho`
    with :math:`T_\theta = \mathrm{diag}(|\theta| + \eta)`, :math:`\eta` =
    :data:`pyro_flat.optim.ascent.ASAM_OFFSET`; its one-step maximiser is
    :math:`e = \rho D g / \sqrt{g^\top D g}` with :math:`D = T_\theta^2`, so the perturbation
    scales with each parameter's magnitude (invariant to rescaling a layer's weights). With
    ``dynamics="underdamped"`` the Langevin step is replaced by the SGHMC step
    (:func:`~pyro_flat.infer.mcmc.integrators.underdamped_step_`, friction :math:`C`, mass
    :math:`M`) with the same perturbed gradient.

    **Structure.** The kernel is the sharpness-aware gradient estimator
    (:class:`~pyro_flat.infer.mcmc.estimators.SharpnessAwareGradient`) followed by a Langevin
    or underdamped step. Its state: the position, and with ``dynamics="underdamped"`` the
    ``momentum`` (zero at the start and after a non-finite step).

    **Cost**: two potential-and-gradient evaluations per SG step (twice SGLD), plus a few
    vector operations and a copy of the parameters. With ``rho = 0`` the second pass is skipped
    and the kernel is SGLD (SGHMC), draw for draw at the same seed.

    **Statistics.** ``lp`` and ``grad_norm`` are those at the unperturbed :math:`\theta`, as for
    every kernel (the estimator returns :math:`\hat U(\theta)` and its gradient beside the
    perturbed gradient the step moves with). The extra per-draw statistic ``sharpness`` is
    :math:`\hat U(\theta + e) - \hat U(\theta)` of the SG step that produced the draw (on that
    step's minibatch, so with minibatches it is noisy; it is ``>= 0`` to first order). A
    non-finite potential or gradient in *either* pass marks the step diverging.

    **BatchNorm.** The perturbed pass must not move running statistics: the running buffers of
    the BatchNorm modules found by :func:`find_batchnorm` (or given as ``batchnorm_modules``)
    are saved before the perturbed pass and restored after it, so they evolve exactly as under
    SGLD (one update per step, from the unperturbed pass).

    An SGD learning rate ``lr`` on the mean loss over ``N`` data points is
    ``step_size = lr / N``; the authors' :math:`\rho` (0.05 on CIFAR-10) is a radius in
    parameter space and is used as is.

    Parameters
    ----------
    rho : float
        The radius :math:`\rho \ge 0` of the neighbourhood; ``0`` is plain SGLD.
    geometry : bool
        Use the geometry-aware (ASAM) ellipsoid instead of the Euclidean ball.
    dynamics : {"langevin", "underdamped"}
        The update after the estimator: Langevin (the default) or SGHMC's.
    friction : float, optional
        :math:`C > 0` of the underdamped form; it needs ``dynamics="underdamped"``.
        Omitted: SGHMC's default (1, and the friction of a momentum decay of 0.1 per step once
        warmup saw a step throw the momentum; :mod:`~pyro_flat.infer.mcmc.friction`).
    mass : float
        Scalar mass :math:`M > 0` of the underdamped form.
    batchnorm_modules : iterable of torch.nn.Module, optional
        BatchNorm modules to protect, in addition to those :func:`find_batchnorm` finds.
    **kwargs
        The arguments of :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> pyro.set_rng_seed(0)
    >>> from pyro.infer import MCMC
    >>> from pyro_flat.infer.mcmc.sharpness import SASGLD
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x), subsample_size=20) as i:
    ...         pyro.sample("y", dist.Normal(w * x[i], 1.0), obs=y[i])
    >>> x = torch.randn(200); y = 2 * x + torch.randn(200)
    >>> kernel = SASGLD(model, step_size=1e-3, rho=0.05, num_steps_per_sample=5)
    >>> mcmc = MCMC(kernel, num_samples=100, warmup_steps=50, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> from pyro_flat import sample_stats
    >>> sample_stats(mcmc)["sharpness"].shape
    torch.Size([100])

    References
    ----------
    Nguyen, V.-A., Vuong, T.-L., Phan, H., Do, T.-T., Phung, D. & Le, T. (2023). Flat Seeking
    Bayesian Neural Networks. NeurIPS.
    Kwon, J., Kim, J., Park, H. & Choi, I. K. (2021). ASAM: Adaptive sharpness-aware
    minimization for scale-invariant learning of deep neural networks. ICML.
    """

    stat_names = SGMCMCKernel.stat_names + ("sharpness",)
    supports_adaptation = True
    supports_preconditioner = False  # a metric would reshape the ball of radius rho
    follows_target = False  # its draws follow q_SA, not pi_T

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        rho: float,
        geometry: bool = False,
        dynamics: str | None = None,
        friction: float | None = None,
        mass: float = 1.0,
        batchnorm_modules: Iterable[nn.Module] | None = None,
        **kwargs: Any,
    ):
        super().__init__(model, step_size, **kwargs)
        self.rho = validation.nonnegative("rho", rho)
        self.geometry = bool(geometry)
        self.dynamics, friction = dyn.resolve_dynamics("SASGLD", dynamics, friction)
        self.mass = validation.positive("mass", mass)
        #: The underdamped form's friction: the given one or SGHMC's default, damped after a
        #: throw and raised on a minibatched model by warmup (the Langevin form shrinks the
        #: step instead).
        self.noise_fit = (NoiseFriction(friction) if self.dynamics == "underdamped"
                          else None)
        self.friction = friction if self.noise_fit is None else self.noise_fit.base
        if self.step_size is not None:
            self.check_step_size(self.step_size)
        self.batchnorm_modules = list(batchnorm_modules or [])
        for m in self.batchnorm_modules:
            if not isinstance(m, nn.modules.batchnorm._NormBase):
                raise ValueError(
                    f"batchnorm_modules must hold BatchNorm modules, got {type(m).__name__}"
                )
        self.estimator = SharpnessAwareGradient(self.rho, self.geometry)

    def state_fields(self) -> tuple[StateField, ...]:
        return (MOMENTUM, NOISE) if self.dynamics == "underdamped" else (NOISE,)

    def momentum_friction(self) -> float | None:
        return self.friction if self.dynamics == "underdamped" else None

    def stability_limit(self, curvature: float) -> float:
        return dyn.stability_limit(self.dynamics, curvature, self.friction, self.mass)

    def check_step_size(self, step_size: float) -> None:
        if self.dynamics == "underdamped":
            dyn.check_underdamped_step(step_size, self.friction, self.mass)

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        found = {id(m): m for m in find_batchnorm(self.model)}
        found.update({id(m): m for m in self.batchnorm_modules})
        self.estimator.batchnorm_modules = list(found.values())
        super().setup(warmup_steps, *args, **kwargs)

    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        if self.dynamics == "langevin":
            langevin_step_(state.position, estimate.step_grad, step_size, self.temperature,
                           state.noise)
        else:
            underdamped_step_(state.position, state.momentum, estimate.step_grad, step_size,
                              self.friction, self.mass, self.temperature, state.noise)
