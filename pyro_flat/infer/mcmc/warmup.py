"""Warmup that chooses the step size (and a diagonal metric) of an SG-MCMC kernel: the part of
:class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel` that runs at the estimate points of warmup.
The rule and its constants are in :mod:`pyro_flat.infer.mcmc.adaptation`; the measurement of
the minibatch gradient noise in :mod:`pyro_flat.infer.mcmc.gradient_noise`; the choice of the
SG steps per draw in :mod:`pyro_flat.infer.mcmc.thinning`."""

from __future__ import annotations

import logging
import math
import warnings

import pyro.util
import torch

from pyro_flat.batchnorm_state import find_batchnorm, kept_running_stats
from pyro_flat.infer.mcmc import adaptation, gradient_noise, thinning
from pyro_flat.infer.mcmc.adaptation import DiagonalMetric
from pyro_flat.infer.mcmc.thinning import AutoThinning

_LOG = logging.getLogger("pyro_flat.adaptation")


class WarmupAdaptation:
    """Mixin of :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`: step-size (and metric)
    adaptation during warmup, when the kernel was built without a step size."""

    def _reset_adaptation(self) -> None:
        self.metric = None
        self._adapted_step_size = None
        self._adaptation_log: list[dict[str, float]] = []
        self._estimate_at: list[int] = []
        self._moment_sum: torch.Tensor | None = None
        self._moment_count = 0
        self._metric_from_start = True
        self._gradient_variance: torch.Tensor | None = None
        self._noise_at: list[int] = []
        self._noise_log: list[dict[str, float]] = []
        self._noise_warned = False
        self._thinning: AutoThinning | None = None
        self._thinning_at: list[int] = []
        self._thinning_start: int | None = None
        self._autocorrelation_time: float | None = None
        self._steps_per_sample_chosen: int | None = None

    def _plan_adaptation(self, warmup_steps: int, z: torch.Tensor) -> None:
        if self.minibatches is not None:  # measure the gradient noise (also with a given step)
            self._noise_at = (adaptation.estimate_points(warmup_steps) if warmup_steps
                              else [0])
        self._plan_thinning(warmup_steps)
        if not self.adapts or (self._adapted_step_size is not None and not warmup_steps):
            return  # an explicit step size, or a resumed run that adapted already
        if warmup_steps < 1:
            raise ValueError(
                f"{type(self).__name__} was built without a step_size, so warmup chooses it, "
                f"but warmup_steps={warmup_steps}: give MCMC(..., warmup_steps=...) of at least "
                "1 (a few hundred draws are usual) or an explicit step_size"
            )
        self._estimate_at = adaptation.estimate_points(warmup_steps)
        if self.preconditioner == "diag" and warmup_steps < 4:
            raise ValueError(
                f"preconditioner='diag' learns the metric from the gradients of warmup, but "
                f"warmup_steps={warmup_steps}: give MCMC(..., warmup_steps=...) of at least 4 "
                "(a few hundred are usual) or preconditioner=None")
        if self.preconditioner == "diag":
            self._moment_sum = torch.zeros_like(z)
            if z.dim() > 1:  # vectorised chains: a chain that skips a step does not count it
                self._moment_count = torch.zeros(*z.shape[:-1], 1, dtype=z.dtype)

    def potential_of(
        self, params: dict[str, torch.Tensor], batch: torch.Tensor | None
    ) -> torch.Tensor:
        r""":math:`\hat U` of ``params`` (unconstrained, per site) on ``batch``, differentiable
        (twice): :meth:`Target.value <pyro_flat.target.Target.value>`."""
        return self.target.value(params, batch)

    def top_curvature(self) -> float:
        """The largest absolute eigenvalue of the minibatch Hessian (of :math:`P^{1/2} H P^{1/2}`
        with a metric), by :func:`pyro_flat.flatness.hessian_top_eigenvalue`. For vectorised chains,
        the Hessian of the sum of their potentials, block-diagonal: the largest over chains."""
        from pyro_flat.flatness import hessian_top_eigenvalue

        rng = pyro.util.get_rng_state()
        streams = None if self.chain_streams is None else self.chain_streams.get_state()
        try:
            batch = self.peek_batch()
        finally:
            pyro.util.set_rng_state(rng)
            if streams is not None:
                self.chain_streams.set_state(streams)
        scale = None if self.metric is None else self.target.site_views(self.metric.scale)

        def potential(phi: dict[str, torch.Tensor]) -> torch.Tensor:
            params = phi if scale is None else {k: v * scale[k] for k, v in phi.items()}
            return self.potential_of(params, batch)

        start = {k: v.detach() if scale is None else v.detach() / scale[k]
                 for k, v in self.target.site_views(self.position).items()}
        generator = torch.Generator().manual_seed(2_654_435_761 + self.num_steps)
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
        curvature = self.top_curvature()
        self._restore_friction()
        limit = self.stability_limit(curvature) if curvature > 0 else math.inf
        step = self.stability_fraction * limit
        noise_limited = False
        if (self._gradient_variance is not None and self.temperature > 0
                and self.draw_index >= adaptation.NOISE_FROM * self.num_warmup_draws
                and math.isfinite(step) and step > 0):
            fitted = self.fit_gradient_noise(step, curvature, self._gradient_variance)
            noise_limited = fitted < step
            step = fitted
        if not (math.isfinite(step) and step > 0):
            if self._adapted_step_size is not None:  # keep the last good estimate
                _LOG.warning("%s: curvature estimate %r at warmup draw %d unusable; keeping "
                             "step size %.4g", type(self).__name__, curvature, self.draw_index,
                             self._adapted_step_size)
                return
            raise ValueError(
                f"{type(self).__name__}: warmup could not choose a step size at draw "
                f"{self.draw_index}: the largest curvature of the potential is {curvature!r} (a "
                "potential that is linear, or not finite, at the initial parameters); give "
                "an explicit step_size"
            )
        self.check_step_size(step)
        self._adapted_step_size = step
        record = {"draw": self.draw_index, "num_sg_steps": self.num_steps, "curvature": curvature,
                  "stability_limit": limit, "step_size": step}
        if self._gradient_variance is not None:
            record["noise_limited"] = noise_limited
        self._adaptation_log.append(record)
        _LOG.info("%s: warmup draw %d (SG step %d): largest curvature %.4g, stability limit "
                  "%.4g, step size %.4g%s", type(self).__name__, self.draw_index, self.num_steps,
                  curvature, limit, step, " (diagonal metric)" if self.metric else "")


    # ------------------------------------------------------------------ gradient noise

    #: Whether a run warns when the excess temperature is above the bound (a kernel whose
    #: dynamics were fitted to minibatch noise, as L2E's meta-learned ones, reports it only).
    warns_on_gradient_noise: bool = True

    def fit_gradient_noise(self, step_size: float, curvature: float,
                           variance: torch.Tensor) -> float:
        r"""The adapted step size given the measured minibatch gradient ``variance``: at most
        ``step_size`` (the stability rule's), and small enough that the minibatch noise is at
        most :data:`~pyro_flat.infer.mcmc.gradient_noise.TARGET_RATIO` of the injected noise
        in every coordinate (the ratio is linear in the step). SGHMC overrides it to choose
        its noise correction and friction instead."""
        ratio = float(self.gradient_noise_terms(variance, step_size)[0].max())
        if ratio > gradient_noise.TARGET_RATIO:
            return step_size * gradient_noise.TARGET_RATIO / ratio
        return step_size

    def momentum_friction(self) -> float | None:
        """The friction of an underdamped update (``None``: a Langevin update)."""
        return None

    def noise_correction(self) -> float | torch.Tensor:
        r"""The update's gradient-noise correction :math:`\hat B` (0: none)."""
        return 0.0

    def _restore_friction(self) -> None:
        """Undo what an earlier estimate chose for the friction (SGHMC overrides)."""

    def gradient_noise_terms(self, variance: torch.Tensor, step_size: float
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per coordinate, the noise ratio and the relative excess temperature of a step of
        ``step_size`` (:mod:`~pyro_flat.infer.mcmc.gradient_noise`)."""
        terms = {"step_size": step_size, "temperature": self.temperature,
                 "inverse_mass": None if self.metric is None else self.metric.inverse_mass,
                 "friction": self.momentum_friction(), "correction": self.noise_correction()}
        return (gradient_noise.noise_ratio(variance, **terms),
                gradient_noise.temperature_excess(variance, **terms))

    def _measure_noise(self) -> None:
        """Estimate the minibatch gradient variance at the current position."""
        self._noise_at.pop(0)
        batches = self.minibatches
        with kept_running_stats(find_batchnorm(self.model)):
            variance = gradient_noise.measure_variance(
                self.potential_and_grad, batches.size, batches.batch_size,
                self.vectorized_chains, self.num_steps, self.position.device)
        if variance is not None:
            self._gradient_variance = variance

    def _report_noise(self) -> None:
        """Record the noise ratio and excess temperature at the step size in force."""
        step = self.base_step_size
        if step is None:
            step = self.current_step_size()
        if self._gradient_variance is None or self.temperature == 0:
            return
        ratio, excess = self.gradient_noise_terms(self._gradient_variance, step)
        worst = int(excess.reshape(-1, excess.shape[-1]).max(0).values.argmax())
        site = next(s.name for s in self.layout.sites if s.offset <= worst < s.stop)
        record = {"draw": self.draw_index, "num_sg_steps": self.num_steps, "step_size": step,
                  "noise_ratio": float(ratio.max()),
                  "median_noise_ratio": float(ratio.median()),
                  "temperature_excess": float(excess.max()),
                  "site": site}
        friction = self.momentum_friction()
        if friction is not None:
            record["friction"] = float(friction)
            record["noise_correction"] = float(torch.as_tensor(self.noise_correction()).max())
        self._noise_log.append(record)
        _LOG.info("%s: warmup draw %d: minibatch/injected noise ratio %.3g (median %.3g), "
                  "excess temperature %.1f%% (worst at site %r)", type(self).__name__,
                  self.draw_index, record["noise_ratio"], record["median_noise_ratio"],
                  100 * record["temperature_excess"], site)

    def _warn_if_hot(self) -> None:
        """Warn once when the last measured excess temperature is above the bound."""
        if not self._noise_log or self._noise_warned or not self.warns_on_gradient_noise:
            return
        last = self._noise_log[-1]
        if last["temperature_excess"] > gradient_noise.EXCESS_BOUND:
            self._noise_warned = True
            advice = ("omit step_size so that warmup chooses one that accounts for the noise"
                      if not self.adapts else "raise the minibatch size")
            warnings.warn(
                f"{type(self).__name__}: the minibatch gradient noise is "
                f"{last['noise_ratio']:.3g} times the injected noise (site "
                f"{last['site']!r}): the chain runs about "
                f"{100 * last['temperature_excess']:.0f}% hotter than temperature="
                f"{self.temperature:g}, above the bound of "
                f"{100 * gradient_noise.EXCESS_BOUND:.0f}%. Use a smaller step_size, a larger "
                f"subsample_size, or {advice}; see diagnostics()['gradient_noise']",
                RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------ thinning

    def _plan_thinning(self, warmup_steps: int) -> None:
        if self.thinning_by_default:  # "auto" if warmup adapts and can measure, else 1
            self.auto_thinning = self.adapts and (
                warmup_steps >= 4 or self._steps_per_sample_chosen is not None)
            self.num_steps_per_sample = "auto" if self.auto_thinning else 1
        if not self.auto_thinning:
            if warmup_steps >= 4 and self.step_size_schedule is None:  # measure, to warn
                self._thinning = self._new_thinning()
                self._thinning_at = adaptation.estimate_points(warmup_steps)[-1:]
                self._thinning_at.append(warmup_steps)
                self._thinning_start = self._thinning_at.pop(0)
            return
        if self._steps_per_sample_chosen is not None and not warmup_steps:
            return  # a resumed run that chose it already
        if warmup_steps < 4:
            raise ValueError(
                f"num_steps_per_sample='auto' chooses the SG steps per draw from the "
                f"autocorrelations of warmup, but warmup_steps={warmup_steps}: give "
                "MCMC(..., warmup_steps=...) of at least 4 (a few hundred are usual) or an "
                "integer num_steps_per_sample"
            )
        self._thinning = self._new_thinning()
        self._thinning_at = [p for p in adaptation.estimate_points(warmup_steps) if p > 0]
        self._thinning_at.append(warmup_steps)

    def _new_thinning(self) -> AutoThinning:
        weights = thinning.network_weight_sites(getattr(self, "model", None))
        return AutoThinning([(s.offset, s.stop) for s in self.layout.sites
                             if s.numel and s.name not in weights])

    def _end_thinning_window(self, step_before: float | None) -> None:
        self._thinning_at.pop(0)
        step_after = self.base_step_size
        if step_before is None or step_after is None:
            step_before = step_after = 1.0
        next_draws = self._thinning_at[0] - self.draw_index if self._thinning_at else None
        self._thinning.window_end(step_before, step_after, next_draws)
        if not self.auto_thinning:  # measured only: say if the given thinning is far too small
            self._autocorrelation_time = self._thinning.last_tau
            self._thinning = None
            return
        if not self._thinning_at:  # warmup ends: the value of every draw after it
            self._steps_per_sample_chosen = self._thinning.steps_per_sample
            self._autocorrelation_time = self._thinning.last_tau
            tau = self._thinning.last_tau
            _LOG.info("%s: %d SG steps per draw (%s)", type(self).__name__,
                      self._steps_per_sample_chosen,
                      "warmup too short to measure an autocorrelation: the first window's value"
                      if tau is None else f"largest autocorrelation time {tau:.0f} SG steps")
            self._thinning = None

    def _warmup_boundaries(self) -> None:
        """What runs at the start of a draw: noise measurement, adaptation, thinning."""
        if self._noise_at and self.draw_index == self._noise_at[0]:
            self._measure_noise()
        measured = bool(self._noise_log) or self._gradient_variance is not None
        step_before = self.base_step_size
        adapted = False
        if self._estimate_at and self.draw_index == self._estimate_at[0]:
            self._adapt()
            adapted = True
        if self._thinning_at and self.draw_index == self._thinning_at[0]:
            self._end_thinning_window(step_before)
        if measured and (adapted or not self.adapts) and (
                not self._noise_log or self._noise_log[-1]["num_sg_steps"] != self.num_steps):
            self._report_noise()

    def _recording_thinning(self) -> AutoThinning | None:
        """The recorder of this draw's SG steps, if the draw is in a measured window."""
        if self._thinning is None or (self._thinning_start is not None
                                      and self.draw_index < self._thinning_start):
            return None
        return self._thinning

    def _warn_if_thinned_too_little(self) -> None:
        tau = self._autocorrelation_time
        if tau is None or self.auto_thinning:
            return
        if tau > thinning.TOO_FEW_FACTOR * self.num_steps_per_sample:
            warnings.warn(
                f"{type(self).__name__}: the slowest site summary has an autocorrelation time "
                f"of about {tau:.0f} SG steps in the last quarter of warmup, over "
                f"{thinning.TOO_FEW_FACTOR:g} times num_steps_per_sample="
                f"{self.num_steps_per_sample}: the draws will be strongly autocorrelated "
                f"(an effective sample size near {self.num_steps_per_sample / tau:.0%} of "
                f"their number). Use num_steps_per_sample='auto' or about "
                f"{math.ceil(tau / thinning.DRAWS_PER_TAU)}",
                RuntimeWarning, stacklevel=3)

    def steps_for_next_draw(self) -> int:
        """How many SG steps the next call of ``sample`` runs."""
        if not self.auto_thinning:
            return self.num_steps_per_sample
        if self._thinning is not None:
            return self._thinning.steps_per_sample
        return self._steps_per_sample_chosen

