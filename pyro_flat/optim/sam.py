r"""SAM: sharpness-aware minimisation (Foret et al. 2021), with ASAM's adaptive ball.

One step on a minibatch loss :math:`L` (two forward/backward passes on the same batch):

.. math::

    g = \nabla L(\theta), \qquad e = \rho\,\frac{D g}{\sqrt{g^\top D g}}, \qquad
    \theta \leftarrow \mathrm{base}\big(\theta,\ \nabla L(\theta + e)\big),

with :math:`D = I` (SAM) or :math:`D = \mathrm{diag}(|\theta| + \eta)^2` (``adaptive=True``,
ASAM, Kwon et al. 2021, :math:`\eta` = ``geometry_offset``), the norm over all parameters of all
groups together (:func:`pyro_flat.optim.ascent.ascent_perturbation`), and ``base`` any torch
optimiser (SGD with momentum, Adam, ...) applied from :math:`\theta` with the gradient taken at
:math:`\theta + e`. A zero or non-finite gradient gives :math:`e = 0`. Deep ensembles,
MC-dropout networks and SWAG collection trained with it are the F- variants of Nguyen et al.
(2023).

Pyro's :class:`~pyro.infer.SVI` calls its optimiser once, after one ``loss_and_grads``, so a
two-pass step cannot be a ``pyro.optim`` optimiser. In Pyro the sharpness-aware step is in the
loss instead: :class:`~pyro_flat.infer.SharpnessAwareELBO` with an ``AutoDelta`` guide is SAM on
the MAP objective with any ``pyro.optim`` optimiser (and with ``AutoNormal`` it is F-SGVB). This
class is for plain torch training loops: ensembles of torch modules, MC dropout, SWAG.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from pyro_flat import validation
from pyro_flat.optim.ascent import ASAM_OFFSET, asam_metric, ascent_perturbation


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation around a base optimiser.

    Parameters
    ----------
    params : iterable
        Parameters or parameter groups, as for any torch optimiser.
    base_optimizer : type
        The torch optimiser class that takes the step (default :class:`torch.optim.SGD`).
    rho : float
        Radius :math:`\\rho \\ge 0` of the ascent step; ``0`` is the base optimiser exactly.
    adaptive : bool
        ASAM's parameter-scaled ball.
    geometry_offset : float
        ASAM's offset :math:`\\eta > 0` in :math:`D = (|\\theta| + \\eta)^2`, so that
        parameters at zero still move (default :data:`pyro_flat.optim.ascent.ASAM_OFFSET`, 0.01).
        Parameter groups may set their own ``"geometry_offset"``.
    batchnorm_modules : iterable of torch.nn.Module
        BatchNorm layers whose running statistics must not move in the perturbed pass (their
        momentum is set to 0 during it); e.g. ``find_batchnorm(net)`` from
        :mod:`pyro_flat.infer.mcmc.sharpness`.
    **base_kwargs
        Arguments of ``base_optimizer`` (``lr``, ``momentum``, ``weight_decay``, ...).

    Examples
    --------
    >>> net = torch.nn.Linear(3, 1)
    >>> opt = SAM(net.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    >>> x, y = torch.randn(32, 3), torch.randn(32, 1)
    >>> def closure():
    ...     opt.zero_grad()
    ...     loss = ((net(x) - y) ** 2).mean()
    ...     loss.backward()
    ...     return loss
    >>> loss = opt.step(closure)  # the loss at theta, before the step

    References
    ----------
    Foret, P., Kleiner, A., Mobahi, H. & Neyshabur, B. (2021). Sharpness-aware minimization for
    efficiently improving generalization. ICLR. Kwon, J. et al. (2021). ASAM: Adaptive
    sharpness-aware minimization for scale-invariant learning. ICML.
    """

    def __init__(
        self,
        params: Iterable[Any],
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        *,
        rho: float = 0.05,
        adaptive: bool = False,
        geometry_offset: float = ASAM_OFFSET,
        batchnorm_modules: Iterable[nn.Module] = (),
        **base_kwargs: Any,
    ):
        rho = validation.nonnegative("rho", rho)
        geometry_offset = validation.positive("geometry_offset", geometry_offset)
        super().__init__(params, dict(rho=rho, adaptive=bool(adaptive),
                                      geometry_offset=geometry_offset))
        self.base_optimizer = base_optimizer(self.param_groups, **base_kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)
        self.batchnorm_modules = list(batchnorm_modules)

    @torch.no_grad()
    def first_step(self) -> None:
        """Move to :math:`\\theta + e` (gradients at :math:`\\theta` must be in ``.grad``)."""
        params = [p for group in self.param_groups for p in group["params"]]
        grads = [p.grad for p in params]
        metric = None
        if any(group["adaptive"] for group in self.param_groups):
            metric = [asam_metric([p], group["geometry_offset"])[0]
                      if group["adaptive"] and p.grad is not None else None
                      for group in self.param_groups for p in group["params"]]
        radii = [group["rho"] for group in self.param_groups for _ in group["params"]]
        if len(set(radii)) <= 1:
            steps = ascent_perturbation(grads, radii[0] if radii else 0.0, metric=metric)
        else:  # groups with their own radius share the norm: scale the unit step per group
            steps = ascent_perturbation(grads, 1.0, metric=metric)
            if steps is not None:
                steps = [None if e is None else e.mul_(r) for e, r in
                         zip(steps, radii, strict=True)]
        for i, p in enumerate(params):
            e = None if steps is None else steps[i]
            if e is not None:
                p.add_(e)
            self.state[p]["e"] = e

    @torch.no_grad()
    def second_step(self) -> None:
        """Return to :math:`\\theta` and let the base optimiser step with the gradient there."""
        for group in self.param_groups:
            for p in group["params"]:
                e = self.state[p].get("e")
                if e is not None:
                    p.sub_(e)
        self.base_optimizer.step()

    def step(  # type: ignore[override]
        self, closure: Callable[[], torch.Tensor] | None = None
    ) -> torch.Tensor:
        """One SAM step; ``closure`` zeroes the gradients, computes the loss on the *same*
        minibatch each time it is called, backpropagates and returns it. Returns the loss at
        :math:`\\theta`."""
        if closure is None:
            raise ValueError("SAM.step needs a closure that recomputes the loss (two passes)")
        with torch.enable_grad():
            loss = closure()
        self.first_step()
        momenta = [m.momentum for m in self.batchnorm_modules]
        try:
            for m in self.batchnorm_modules:
                m.momentum = 0.0
            with torch.enable_grad():
                closure()
        finally:
            for m, momentum in zip(self.batchnorm_modules, momenta, strict=True):
                m.momentum = momentum
        self.second_step()
        return loss


