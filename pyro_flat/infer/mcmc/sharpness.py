"""SA-SGLD: SGLD on the sharpness-aware posterior (Nguyen et al., NeurIPS 2023)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from pyro_flat import validation
from pyro_flat.batchnorm_state import find_batchnorm, kept_running_stats
from pyro_flat.infer.mcmc import adaptation
from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.integrators import langevin_step_, underdamped_step_

#: The offset :math:`\eta` of the geometry-aware ball, :math:`D = (|\theta| + \eta)^2`
#: (ASAM's default, Kwon et al. 2021), so that parameters at zero can still be perturbed.
GEOMETRY_ETA = 0.01

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
    step on all of ``U``; ALGORITHMS.md allows the prior gradient at :math:`\theta` instead,
    which differs by :math:`\nabla^2 \log p \cdot e = O(\rho / \sigma_{\text{prior}}^2)`,
    negligible beside the likelihood's curvature of a BNN. A zero gradient gives :math:`e = 0`.

    With ``geometry=True`` the ball is the ASAM ellipsoid :math:`\|T_\theta^{-1} e\| \le \rho`
    with :math:`T_\theta = \mathrm{diag}(|\theta| + \eta)`, :math:`\eta` =
    :data:`GEOMETRY_ETA`; its one-step maximiser is :math:`e = \rho D g / \sqrt{g^\top D g}`
    with :math:`D = T_\theta^2`, so the perturbation scales with each parameter's magnitude
    (invariant to rescaling a layer's weights). Given ``friction``, the Langevin step is
    replaced by the SGHMC step (:func:`~pyro_flat.infer.mcmc.integrators.underdamped_step_`,
    friction :math:`C`, mass :math:`M`) with the same perturbed gradient.

    **Cost**: two potential-and-gradient evaluations per SG step (twice SGLD), plus a few
    vector operations and a copy of the parameters. With ``rho = 0`` the second pass is skipped
    and the kernel is SGLD (SGHMC), draw for draw at the same seed.

    **Statistics.** ``lp`` and ``grad_norm`` are those at the unperturbed :math:`\theta`, as for
    every kernel: :meth:`gradient` returns :math:`(\hat U(\theta), \nabla\hat U(\theta))` to the
    base class, which records them, and :meth:`update` moves with the perturbed gradient it
    kept aside. The extra per-draw statistic ``sharpness`` is
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
    friction : float, optional
        :math:`C > 0` selects the underdamped (SGHMC) form; ``None`` the Langevin form.
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
    supports_preconditioner = False  # a metric would reshape the ball of radius rho

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        rho: float,
        geometry: bool = False,
        friction: float | None = None,
        mass: float = 1.0,
        batchnorm_modules: Iterable[nn.Module] | None = None,
        **kwargs: Any,
    ):
        super().__init__(model, step_size, **kwargs)
        self.rho = validation.nonnegative("rho", rho)
        self.geometry = bool(geometry)
        self.friction = None if friction is None else validation.positive("friction", friction)
        self.mass = validation.positive("mass", mass)
        if self.step_size is not None:
            self.check_step_size(self.step_size)
        self.batchnorm_modules = list(batchnorm_modules or [])
        for m in self.batchnorm_modules:
            if not isinstance(m, nn.modules.batchnorm._NormBase):
                raise ValueError(
                    f"batchnorm_modules must hold BatchNorm modules, got {type(m).__name__}"
                )

    def stability_limit(self, curvature: float) -> float:
        if self.friction is None:
            return adaptation.langevin_limit(curvature)
        return adaptation.underdamped_limit(curvature, self.friction, self.mass)

    def check_step_size(self, step_size: float) -> None:
        if self.friction is not None:
            validation.in_range("step_size * friction / mass",
                                step_size * self.friction / self.mass, 0, 1, closed="(]")

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        super().setup(warmup_steps, *args, **kwargs)
        found = {id(m): m for m in find_batchnorm(self.model)}
        found.update({id(m): m for m in self.batchnorm_modules})
        self._bn = list(found.values())

    def init_kernel_state(self, z: torch.Tensor) -> None:
        self._noise = torch.empty_like(z)
        self._grad_at_theta = torch.empty_like(z)
        self._e = torch.empty_like(z)
        self._theta = torch.empty_like(z)
        self._sharpness = math.nan
        self._perturbed = False
        if self.friction is not None:
            self._momentum = torch.zeros_like(z)

    def kernel_state(self) -> dict[str, Any]:
        return {"momentum": self._momentum} if self.friction is not None else {}

    def load_kernel_state(self, state: dict[str, Any]) -> None:
        if self.friction is not None:
            self._momentum.copy_(state["momentum"])

    def reset_kernel_state(self) -> None:
        if self.friction is not None:
            self._momentum.zero_()

    def _perturbation(self, g: torch.Tensor) -> bool:
        """Write the ascent step ``e`` for the gradient ``g`` into ``self._e``; False if g = 0."""
        if self.geometry:
            torch.abs(self._z, out=self._e).add_(GEOMETRY_ETA).square_()  # D
            self._e.mul_(g)  # D g
            norm = float(torch.dot(g, self._e).sqrt())  # sqrt(g^T D g)
        else:
            norm = float(torch.linalg.vector_norm(g))
            self._e.copy_(g)
        if not (norm > 0 and math.isfinite(norm)):
            return False
        self._e.mul_(self.rho / norm)
        return True

    def gradient(self, batch: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U(theta), grad U(theta))`` for the statistics; ``grad U(theta + e)`` is left in
        the base's gradient buffer for :meth:`update` (nothing runs in between)."""
        u, g = self.potential_and_grad(batch)
        if self.rho == 0.0:
            self._sharpness = 0.0
            self._perturbed = False
            return u, g
        self._grad_at_theta.copy_(g)
        if not (math.isfinite(float(u)) and self._perturbation(self._grad_at_theta)):
            # non-finite (the base handles it) or zero gradient (e = 0, the SGLD step)
            self._sharpness = 0.0 if math.isfinite(float(u)) else math.nan
            self._perturbed = False
            return u, g
        self._theta.copy_(self._z)
        try:
            with kept_running_stats(self._bn):
                self._z.add_(self._e)
                u_e, g_e = self.potential_and_grad(batch)  # g_e is the base's buffer self._grad
        finally:
            self._z.copy_(self._theta)  # exact restore, not z - e
        self._sharpness = float(u_e - u)
        if not (math.isfinite(float(u_e)) and bool(torch.isfinite(g_e).all())):
            self._perturbed = False
            return u_e, g_e  # the base marks the step diverging and reports the sites
        self._perturbed = True
        return u, self._grad_at_theta

    def update(self, z: torch.Tensor, grad: torch.Tensor, step_size: float) -> None:
        if self._perturbed:
            grad = self._grad  # grad U(theta + e), from the second pass of gradient()
        if self.friction is None:
            langevin_step_(z, grad, step_size, self.temperature, self._noise)
        else:
            underdamped_step_(z, self._momentum, grad, step_size, self.friction, self.mass,
                              self.temperature, self._noise)

    def record_stats(self) -> None:
        self._stats["sharpness"].append(self._sharpness)
