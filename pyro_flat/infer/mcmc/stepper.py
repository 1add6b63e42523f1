r"""One SG step of a kernel's chains, and what happens when it is not finite.

.. math:: (\hat U, \nabla \hat U) = \text{estimate}(\theta, \text{batch}), \qquad
          \theta \leftarrow \text{update}(\theta, \nabla \hat U, \epsilon)
          \text{ for the chains whose } \hat U \text{ and } \|\nabla \hat U\| \text{ are finite}

A chain whose potential or gradient is not finite skips the step: its rows of the state are
kept as they were, it draws no noise, it falls back to its last finite position
(:meth:`~pyro_flat.infer.mcmc.chain.Chains.fall_back`), and the next step tries again with a
fresh minibatch and fresh noise. The divergence policy
(:class:`~pyro_flat.infer.mcmc.divergence.DivergencePolicy`) stops a chain that does so too
often, naming its site and step.

A step either learns at once whether every chain is finite (one host synchronisation, free on
the CPU) or, with ``deferred=True`` (chains on an accelerator), never waits for the host: the
update runs for every chain, the rows of the non-finite ones are put back with a select on the
device, Pyro's argument validation is off (its checks read values on the host), and whether a
chain must stop is read once per draw (:meth:`SGStepper.raise_if_stopped`). Both give the same
draws, to the bit, except that a single chain's non-finite step draws (and discards) its noise
on the deferred path.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import pyro
import torch

from pyro_flat.infer.mcmc.chain import Chains
from pyro_flat.infer.mcmc.divergence import DivergencePolicy
from pyro_flat.infer.mcmc.estimators import Estimate, Evaluate
from pyro_flat.infer.mcmc.state import KernelState
from pyro_flat.target.layout import FlatLayout

__all__ = ["SGStepper", "StepResult"]

#: ``update(state, estimate, step_size)``: a kernel's update rule, in place.
Update = Callable[[KernelState, Estimate, float], None]


class StepResult(NamedTuple):
    """What one SG step saw: per chain, the potential and gradient norm at the position the step
    started from, which chains were finite (``None``: all), the step size, the estimator's
    statistics, and the gradient there (``(K, d)``, the target's buffer: valid until the next
    evaluation; ``None`` where not kept)."""

    energy: torch.Tensor
    grad_norm: torch.Tensor
    finite: torch.Tensor | None
    step_size: float
    stats: dict[str, Any] = {}
    grad: torch.Tensor | None = None


class SGStepper:
    """Steps ``chains`` with an estimator and an update rule (see the module).

    Parameters
    ----------
    chains : Chains
        The chains, one row each.
    evaluate : callable
        ``evaluate(batch) -> (U, grad U)`` at the chains' positions, one row each.
    estimator : callable
        ``estimator(position, evaluate, batch) -> Estimate``
        (:mod:`~pyro_flat.infer.mcmc.estimators`).
    update : callable
        The kernel's update rule, ``update(state, estimate, step_size)``.
    divergence : DivergencePolicy
        The record of non-finite steps, and when a chain must stop.
    layout : FlatLayout
        The sites on the position, for the message of a chain that stops.
    """

    def __init__(self, chains: Chains, evaluate: Evaluate, estimator: Callable[..., Estimate],
                 update: Update, divergence: DivergencePolicy, layout: FlatLayout):
        self.chains = chains
        self.evaluate = evaluate
        self.estimator = estimator
        self.update = update
        self.divergence = divergence
        self.layout = layout
        #: During an update that some chains skip: the chains that take it (``None``: all).
        self.active_chains: torch.Tensor | None = None

    def step(self, step_size: float, batch: torch.Tensor | None,
             evaluated: Callable[[StepResult], None] | None = None,
             moments: Callable[[torch.Tensor, torch.Tensor | None], None] | None = None,
             deferred: bool = False) -> StepResult:
        """One SG step of every chain with ``step_size`` on ``batch``.

        ``evaluated(result)`` is called once the potential is known and before the update (the
        statistics of the draw the step starts from); ``moments(grad, rows)`` with the
        gradients of the chains ``rows`` that take the step (``None``: all). ``deferred``:
        the step without a host synchronisation (see the module).
        """
        chains, state = self.chains, self.chains.state
        checks = pyro.validation_enabled(False) if deferred else contextlib.nullcontext()
        with checks:
            estimate = self.estimator(chains.position, self.evaluate, batch)
        gnorm = torch.linalg.vector_norm(estimate.grad, dim=-1)
        if deferred:
            return self._step_deferred(estimate, gnorm, step_size, evaluated, moments)
        # one synchronisation: a finite sum means every chain is finite (an overflowing sum of
        # finite values goes the slow way, which finds them finite)
        all_finite = math.isfinite(float((estimate.energy + gnorm).sum()))
        finite = None
        if not all_finite:
            finite = torch.isfinite(estimate.energy) & torch.isfinite(gnorm)
            all_finite = bool(finite.all())
        result = StepResult(estimate.energy, gnorm, None if all_finite else finite, step_size,
                            estimate.stats, estimate.grad)
        if evaluated is not None:
            evaluated(result)
        bad = None if all_finite else ~finite
        stop = self.divergence.record(bad)
        if all_finite:
            chains.keep_finite()
            if moments is not None:
                moments(estimate.grad, None)
            self.update(state, estimate, step_size)
        else:
            if stop is not None:
                raise RuntimeError(self.divergence.message(
                    self.layout, chains.position[stop], estimate.grad[stop],
                    float(estimate.energy[stop]), state.num_steps, stop,
                    chains.num_chains if chains.vectorized else None))
            self._step_finite_chains(estimate, step_size, finite, moments)
            chains.fall_back(bad)
        state.num_steps += 1
        return result

    def _step_deferred(self, estimate: Estimate, gnorm: torch.Tensor, step_size: float,
                       evaluated: Callable[[StepResult], None] | None,
                       moments: Callable[[torch.Tensor, torch.Tensor | None], None] | None
                       ) -> StepResult:
        """The step of every chain, the non-finite ones' rows put back on the device."""
        chains, state = self.chains, self.chains.state
        finite = torch.isfinite(estimate.energy) & torch.isfinite(gnorm)
        result = StepResult(estimate.energy, gnorm, finite, step_size, estimate.stats,
                            estimate.grad)
        if evaluated is not None:
            evaluated(result)
        bad = ~finite
        self.divergence.record_on_device(bad, chains.position, estimate.grad, estimate.energy,
                                         state.num_steps)
        self._update_finite_rows(estimate, step_size, finite, moments)
        chains.fall_back(bad)
        state.num_steps += 1
        return result

    def raise_if_stopped(self) -> None:
        """After the deferred steps of a draw: the error of the first chain that had to stop
        on the way (one host synchronisation)."""
        chains = self.chains
        message = self.divergence.stopped(self.layout,
                                          chains.num_chains if chains.vectorized else None)
        if message is not None:
            raise RuntimeError(message)

    def _step_finite_chains(self, estimate: Estimate, step_size: float, finite: torch.Tensor,
                            moments: Callable[[torch.Tensor, torch.Tensor | None], None] | None
                            ) -> None:
        """The update of the chains ``finite``, the others' rows of the state kept."""
        if bool(finite.any()):
            self._update_finite_rows(estimate, step_size, finite, moments)

    def _update_finite_rows(self, estimate: Estimate, step_size: float, finite: torch.Tensor,
                            moments: Callable[[torch.Tensor, torch.Tensor | None], None] | None
                            ) -> None:
        """The update for every chain, the rows of the chains not ``finite`` put back."""
        chains, bad = self.chains, ~finite
        chains.keep_finite_rows(finite)
        if moments is not None:
            moments(estimate.grad, finite)
        kept = chains.rows_of(bad)
        self.active_chains = finite
        try:
            self.update(chains.state, estimate, step_size)
        finally:
            self.active_chains = None
        chains.put_rows(kept, bad)
