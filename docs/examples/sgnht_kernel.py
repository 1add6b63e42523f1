"""A new kernel in 46 lines: the stochastic gradient Nose-Hoover thermostat (Ding et al. 2014)."""

import math
from functools import partial

import torch

from pyro_flat.infer import SGMCMCKernel
from pyro_flat.infer.mcmc.state import StateField


class SGNHT(SGMCMCKernel):
    r"""Target :math:`\exp(-U/T)`. One gradient per step, a thermostat :math:`\xi` that learns
    the friction the gradient noise needs:

    .. math::

        p &\leftarrow p - \epsilon\xi p - \epsilon\nabla\hat U(\theta)
              + \sqrt{2 A \epsilon T}\,\eta \\
        \theta &\leftarrow \theta + \epsilon p, \qquad
        \xi \leftarrow \xi + \epsilon\,(p^\top p / d - T)
    """

    def __init__(self, model=None, step_size=None, *, diffusion: float = 1.0, **kwargs):
        super().__init__(model, step_size, **kwargs)
        self.diffusion = diffusion

    def state_fields(self):
        return (
            StateField("momentum", "p, zero at the start and after a non-finite step",
                       reset=True),
            StateField("thermostat", "xi, one per chain, starting at A",
                       init=partial(thermostat_start, self.diffusion)),
            StateField("noise", "buffer for eta", init="scratch"),
        )

    def update(self, state, estimate, step_size):
        p, xi, t = state.momentum, state.thermostat, self.temperature
        p.addcmul_(xi, p, value=-step_size).add_(estimate.step_grad, alpha=-step_size)
        state.noise.normal_()
        p.add_(state.noise, alpha=math.sqrt(2 * self.diffusion * step_size * t))
        state.position.add_(p, alpha=step_size)
        kinetic = p.square().mean(-1, keepdim=True)
        xi.add_(kinetic.sub_(t), alpha=step_size)


def thermostat_start(diffusion, state):  # a module-level function: worker processes pickle it
    return torch.full(state.position.shape[:-1] + (1,), diffusion)
