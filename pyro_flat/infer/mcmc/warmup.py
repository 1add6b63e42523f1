"""Warmup that chooses the step size (and a diagonal metric) of an SG-MCMC kernel: the part of
:class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel` that runs at the estimate points of warmup.
The rule and its constants are in :mod:`pyro_flat.infer.mcmc.adaptation`."""

from __future__ import annotations

import logging
import math

import pyro.util
import torch

from pyro_flat.batchnorm_state import find_batchnorm, kept_running_stats
from pyro_flat.infer.mcmc import adaptation
from pyro_flat.infer.mcmc.adaptation import DiagonalMetric

_LOG = logging.getLogger("pyro_flat.adaptation")


class WarmupAdaptation:
    """Mixin of :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`: step-size (and metric)
    adaptation during warmup, when the kernel was built without a step size."""

    @property
    def adapts(self) -> bool:
        """Whether warmup chooses the step size (no ``step_size`` and no schedule given)."""
        return self._adapt_requested

    def _reset_adaptation(self) -> None:
        self.metric = None
        self._adapted_step_size = None
        self._adaptation_log: list[dict[str, float]] = []
        self._estimate_at: list[int] = []
        self._moment_sum: torch.Tensor | None = None
        self._moment_count = 0
        self._metric_from_start = True

    def _plan_adaptation(self, warmup_steps: int, z: torch.Tensor) -> None:
        if not self.adapts or (self._adapted_step_size is not None and not warmup_steps):
            return  # an explicit step size, or a resumed run that adapted already
        if warmup_steps < 1:
            raise ValueError(
                f"{type(self).__name__} was built without a step_size, so warmup chooses it, "
                f"but warmup_steps={warmup_steps}: give MCMC(..., warmup_steps=...) of at least "
                "1 (a few hundred draws are usual) or an explicit step_size"
            )
        self._estimate_at = adaptation.estimate_points(warmup_steps)
        if self.preconditioner == "diag":
            self._moment_sum = torch.zeros_like(z)
            if z.dim() > 1:  # vectorised chains: a chain that skips a step does not count it
                self._moment_count = torch.zeros(*z.shape[:-1], 1, dtype=z.dtype)

    def potential_of(
        self, params: dict[str, torch.Tensor], batch: torch.Tensor | None
    ) -> torch.Tensor:
        r""":math:`\hat U` of ``params`` (unconstrained, per site) on ``batch``, differentiable
        (twice): the model's potential plus the closed-form prior the hot path adds."""
        u = torch.as_tensor(self.potential(params, batch))
        lead = self._z.shape[:-1]
        if u.dim():
            u = u.sum() if lead else _as_scalar(u)  # chains are independent: sum their U
        flat_prior = getattr(self.potential, "flat_prior", None)
        if flat_prior is not None:
            z = torch.cat([params[s.name].reshape(*lead, -1) for s in self._layout.sites],
                          dim=-1)
            d = z - flat_prior.loc
            u = u + 0.5 * (d * flat_prior.precision * d).sum()
        return u

    def _top_curvature(self) -> float:
        """The largest |eigenvalue| of the minibatch Hessian (of :math:`P^{1/2} H P^{1/2}` with a
        metric), by :func:`pyro_flat.flatness.hessian_top_eigenvalue`. For vectorised chains,
        the Hessian of the sum of their potentials, block-diagonal: the largest over chains."""
        from pyro_flat.flatness import hessian_top_eigenvalue

        rng = pyro.util.get_rng_state()
        streams = None if self.chain_streams is None else self.chain_streams.get_state()
        try:
            batch = self._peek_batch()
        finally:
            pyro.util.set_rng_state(rng)
            if streams is not None:
                self.chain_streams.set_state(streams)
        scale = None if self.metric is None else self._site_views(self.metric.scale)

        def potential(phi: dict[str, torch.Tensor]) -> torch.Tensor:
            params = phi if scale is None else {k: v * scale[k] for k, v in phi.items()}
            return self.potential_of(params, batch)

        start = {k: v.detach() if scale is None else v.detach() / scale[k]
                 for k, v in self._site_views(self._z).items()}
        generator = torch.Generator().manual_seed(2_654_435_761 + self._t)
        with kept_running_stats(find_batchnorm(self.model)):
            curvature, _ = hessian_top_eigenvalue(
                potential, start, num_iters=adaptation.POWER_ITERATIONS,
                tol=adaptation.POWER_TOLERANCE, generator=generator)
        return abs(curvature)

    def _adapt(self) -> None:
        """Re-estimate the step size (and the metric) at this warmup draw."""
        self._estimate_at.pop(0)
        if self._moment_sum is not None and bool(torch.all(torch.as_tensor(self._moment_count)
                                                          > 0)):
            self.metric = DiagonalMetric.from_moments(self._moment_sum / self._moment_count)
            if self._metric_from_start:  # forget the first window, the transient from the start
                self._moment_sum.zero_()
                self._moment_count = self._moment_count * 0
                self._metric_from_start = False
        if not self._estimate_at:
            self._moment_sum = None  # the metric is frozen from here on
        curvature = self._top_curvature()
        limit = self.stability_limit(curvature) if curvature > 0 else math.inf
        step = self.stability_fraction * limit
        if not (math.isfinite(step) and step > 0):
            if self._adapted_step_size is not None:  # keep the last good estimate
                _LOG.warning("%s: curvature estimate %r at warmup draw %d unusable; keeping "
                             "step size %.4g", type(self).__name__, curvature, self._draw,
                             self._adapted_step_size)
                return
            raise ValueError(
                f"{type(self).__name__}: warmup could not choose a step size at draw "
                f"{self._draw}: the largest curvature of the potential is {curvature!r} (a "
                "potential that is linear, or not finite, at the initial parameters); give "
                "an explicit step_size"
            )
        self.check_step_size(step)
        self._adapted_step_size = step
        record = {"draw": self._draw, "num_sg_steps": self._t, "curvature": curvature,
                  "stability_limit": limit, "step_size": step}
        self._adaptation_log.append(record)
        _LOG.info("%s: warmup draw %d (SG step %d): largest curvature %.4g, stability limit "
                  "%.4g, step size %.4g%s", type(self).__name__, self._draw, self._t,
                  curvature, limit, step, " (diagonal metric)" if self.metric else "")


def _as_scalar(u: torch.Tensor) -> torch.Tensor:
    if u.numel() != 1:
        raise ValueError(
            f"the potential must be a scalar (one number, U of all parameters), got a tensor "
            f"of shape {tuple(u.shape)}; sum the terms of a potential_fn before returning them"
        )
    return u.reshape(())
