r"""Warmup of an SG-MCMC kernel as an object: :class:`Warmup` measures the minibatch gradient
noise, chooses the step size (and a diagonal metric) and the SG steps per draw at the estimate
points of warmup, as Pyro's ``WarmupAdapter`` does for HMC.

The kernel hands itself to its ``Warmup`` and calls it at the start of each draw
(:meth:`Warmup.at_draw_start`), after each finite step (:meth:`Warmup.accumulate`, for the
metric) and at the end of a run (:meth:`Warmup.warn_at_end`); the warmup reads the kernel
through its public attributes and methods and sets one of them, ``kernel.metric``. What an
update rule knows about itself stays on the kernel: its ``stability_limit(curvature)``,
``check_step_size``, ``fit_gradient_noise`` (an underdamped update with a ``noise_fit``
chooses its friction there, from the first estimate on; the others shrink the step),
``momentum_friction`` and ``noise_correction``.

The rule and its constants are in :mod:`pyro_flat.infer.mcmc.adaptation`: at each estimate
point the step is

.. math:: \epsilon = f \cdot \epsilon_{\max}(\lambda), \qquad \lambda = \max |\mathrm{eig}\,
          \nabla^2 \hat U(\theta)|

(``f = stability_fraction``), then made small enough that the minibatch noise stays below
its bound (:mod:`pyro_flat.infer.mcmc.gradient_noise`); the steps per draw come from the
warmup's autocorrelations (:mod:`pyro_flat.infer.mcmc.thinning`).

A step chosen at one point can be unstable where the chain goes next (a flat start, a sharper
typical set), and by the time a step overflows the chain has run far out (a blow-up grows for
several finite steps first). So while warmup chooses the step it watches every SG step
(:meth:`Warmup.after_step`): it keeps each chain's lowest-energy position so far, and when a
chain's step is not finite it puts that chain back there (not at its last finite position,
which is already far out) and multiplies the step by :data:`NONFINITE_BACKOFF`; no later
estimate of warmup chooses more than that: a step seen to blow a chain up is not taken again.
Each backoff is a record of ``diagnostics()["step_size_adaptation"]`` marked
``"after_nonfinite_step"``. An underdamped chain whose momentum a finite step threw far
beyond its law (an unstable step, :mod:`.momentum_watch`; watched from the second estimate on,
once the start's energy is shed) backs off the same way, with a record marked
``"after_hot_momentum"`` that names the site. After warmup the step is fixed, and a chain whose
steps keep being non-finite stops with the divergence error.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any

import pyro.util
import torch

from pyro_flat.infer.mcmc import adaptation, gradient_noise, thinning
from pyro_flat.infer.mcmc.adaptation import DiagonalMetric
from pyro_flat.infer.mcmc.thinning import AutoThinning
from pyro_flat.models.batchnorm import find_batchnorm, kept_running_stats

if TYPE_CHECKING:
    from pyro_flat.infer.mcmc.base import SGMCMCKernel

_LOG = logging.getLogger("pyro_flat.adaptation")
#: The factor on the adapted step after a non-finite SG step in warmup.
NONFINITE_BACKOFF = 0.5


class Warmup:
    """What the warmup of one kernel measures and chooses (see the module).

    Parameters
    ----------
    kernel : SGMCMCKernel
        The kernel whose warmup this is.

    Attributes
    ----------
    step_size : float or None
        The step size chosen so far (``None``: none yet, or the kernel was given one).
    steps_per_sample : int or None
        The SG steps per draw chosen at the end of warmup (``num_steps_per_sample="auto"``).
    autocorrelation_time : float or None
        The largest autocorrelation time of the monitored summaries in the last measured
        window, in SG steps.
    log : list of dict
        One record per step-size estimate (draw, SG steps, curvature, stability limit, step).
    noise_log : list of dict
        One record per gradient-noise report (noise ratio, excess temperature, worst site).
    """

    def __init__(self, kernel: SGMCMCKernel):
        self.kernel = kernel
        self.reset()

    def reset(self) -> None:
        """Forget what an earlier run chose (the kernel's metric included)."""
        self.kernel.metric = None
        self.step_size: float | None = None
        #: The largest step warmup may choose after a non-finite step (``None``: no bound).
        self.step_bound: float | None = None
        self._lowest: torch.Tensor | None = None  # each chain's lowest-energy position
        self._lowest_energy: torch.Tensor | None = None
        self.log: list[dict[str, Any]] = []
        self._estimate_at: list[int] = []
        self._momentum_from = 0
        self._moment_sum: torch.Tensor | None = None
        self._moment_count: Any = 0
        self._metric_from_start = True
        self._gradient_variance: torch.Tensor | None = None
        self._noise_at: list[int] = []
        self.noise_log: list[dict[str, Any]] = []
        self._noise_warned = False
        self._thinning: AutoThinning | None = None
        self._thinning_at: list[int] = []
        self._thinning_start: int | None = None
        self.autocorrelation_time: float | None = None
        self.steps_per_sample: int | None = None
        #: Whether the run warned that its given thinning is far too small.
        self.thinning_warned = False

    # ------------------------------------------------------------------ planning

    def plan(self, warmup_steps: int, position: torch.Tensor) -> None:
        """Plan a run of ``warmup_steps`` warmup draws from ``position`` (``(K, d)``, one row
        per chain): when to measure the noise, estimate the step and end a thinning window."""
        k = self.kernel
        if k.minibatches is not None:  # measure the gradient noise (also with a given step)
            self._noise_at = (adaptation.estimate_points(warmup_steps) if warmup_steps
                              else [0])
        self._plan_thinning(warmup_steps)
        if not k.adapts or (self.step_size is not None and not warmup_steps):
            return  # an explicit step size, or a resumed run that adapted already
        if warmup_steps < 1:
            raise ValueError(
                f"{type(k).__name__} was built without a step_size, so warmup chooses it, "
                f"but warmup_steps={warmup_steps}: give MCMC(..., warmup_steps=...) of at least "
                "1 (a few hundred draws are usual) or an explicit step_size"
            )
        self._estimate_at = adaptation.estimate_points(warmup_steps)
        # the momentum is read against its law once the start's energy is shed: from the
        # second estimate on
        self._momentum_from = int(adaptation.ESTIMATE_AT[1] * warmup_steps)
        if k.preconditioner == "diag" and warmup_steps < 4:
            raise ValueError(
                f"preconditioner='diag' learns the metric from the gradients of warmup, but "
                f"warmup_steps={warmup_steps}: give MCMC(..., warmup_steps=...) of at least 4 "
                "(a few hundred are usual) or preconditioner=None")
        if k.preconditioner == "diag":  # one row per chain; a chain that skips a step
            self._moment_sum = torch.zeros_like(position)  # does not count
            self._moment_count = torch.zeros(position.shape[0], 1, dtype=position.dtype)

    @property
    def collects_moments(self) -> bool:
        """Whether the steps' gradients are being summed for the diagonal metric."""
        return self._moment_sum is not None

    def accumulate(self, grad: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Add a step's gradient (``(K, d)``) to the metric's second moments (``rows``: the
        chains that took the step; ``None``: all)."""
        if self._moment_sum is None:
            return
        if rows is None:
            self._moment_sum.addcmul_(grad, grad)
            self._moment_count += 1
        else:
            self._moment_sum[rows] += grad[rows].square()
            self._moment_count += rows.unsqueeze(-1).to(self._moment_sum.dtype)

    # ------------------------------------------------------------------ each draw

    def at_draw_start(self) -> None:
        """What runs at the start of a draw: noise measurement, adaptation, thinning."""
        k = self.kernel
        draw = k.draw_index
        measured = bool(self._noise_at) and draw == self._noise_at[0]
        if measured:
            self.measure_noise()
        step_before = k.base_step_size
        adapted = False
        if self._estimate_at and draw == self._estimate_at[0]:
            self.adapt()
            adapted = True
        if self._thinning_at and draw == self._thinning_at[0]:
            self._end_thinning_window(step_before)
        # report what this draw measured, at the step in force: once the step is chosen when
        # warmup chooses it
        if (adapted or (measured and not k.adapts)) and (
                not self.noise_log or self.noise_log[-1]["num_sg_steps"] != k.num_steps):
            self.report_noise()

    def step_recorder(self) -> AutoThinning | None:
        """The recorder of this draw's SG steps, if the draw is in a measured window."""
        if self._thinning is None or (self._thinning_start is not None
                                      and self.kernel.draw_index < self._thinning_start):
            return None
        return self._thinning

    def steps_for_next_draw(self) -> int:
        """How many SG steps the next draw runs (``"auto"``: the window's, then the chosen)."""
        k = self.kernel
        if not k.auto_thinning:
            return k.num_steps_per_sample
        if self._thinning is not None:
            return self._thinning.steps_per_sample
        return self.steps_per_sample

    # ------------------------------------------------------------------ the step size

    def top_curvature(self) -> float:
        """The largest absolute eigenvalue of the minibatch Hessian at the kernel's position (of
        :math:`P^{1/2} H P^{1/2}` with a metric), by
        :func:`pyro_flat.evaluation.flatness.hessian_top_eigenvalue`. For vectorised chains, the
        Hessian of the sum of their potentials, block-diagonal: the largest over chains."""
        from pyro_flat.evaluation.flatness import hessian_top_eigenvalue

        k = self.kernel
        rng = pyro.util.get_rng_state()
        streams = None if k.chain_streams is None else k.chain_streams.get_state()
        try:
            batch = k.peek_batch()
        finally:
            pyro.util.set_rng_state(rng)
            if streams is not None:
                k.chain_streams.set_state(streams)
        target = k.target
        scale = None if k.metric is None else target.site_views(
            k.metric.scale.reshape(target.position.shape))

        def potential(phi: dict[str, torch.Tensor]) -> torch.Tensor:
            params = phi if scale is None else {n: v * scale[n] for n, v in phi.items()}
            return target.value(params, batch)

        start = {n: v.detach() if scale is None else v.detach() / scale[n]
                 for n, v in target.site_views(target.position).items()}
        generator = torch.Generator().manual_seed(2_654_435_761 + k.num_steps)
        with kept_running_stats(find_batchnorm(k.model)):
            curvature, _ = hessian_top_eigenvalue(
                potential, start, num_iters=adaptation.POWER_ITERATIONS,
                tol=adaptation.POWER_TOLERANCE, generator=generator)
        return abs(curvature)

    def adapt(self) -> None:
        """Re-estimate the step size (and the metric) at this warmup draw."""
        k = self.kernel
        self._estimate_at.pop(0)
        if self._moment_sum is not None and bool(torch.all(torch.as_tensor(self._moment_count)
                                                          > 0)):
            k.metric = DiagonalMetric.from_moments(self._moment_sum / self._moment_count)
            if self._metric_from_start:  # forget the first window, the transient from the start
                self._moment_sum.zero_()
                self._moment_count = self._moment_count * 0
                self._metric_from_start = False
        if not self._estimate_at:
            self._moment_sum = None  # the metric is frozen from here on
        curvature = self.top_curvature()
        k.restore_friction(curvature)
        limit = k.stability_limit(curvature) if curvature > 0 else math.inf
        step = k.stability_fraction * limit
        noise_limited = False
        draw = k.draw_index
        if (self._gradient_variance is not None and k.temperature > 0
                and draw >= k.noise_fit_from * k.num_warmup_draws
                and math.isfinite(step) and step > 0):
            fitted = k.fit_gradient_noise(step, curvature, self._gradient_variance)
            noise_limited = fitted < step
            step = fitted
        if not (math.isfinite(step) and step > 0):
            if self.step_size is not None:  # keep the last good estimate
                _LOG.warning("%s: curvature estimate %r at warmup draw %d unusable; keeping "
                             "step size %.4g", type(k).__name__, curvature, draw,
                             self.step_size)
                return
            raise ValueError(
                f"{type(k).__name__}: warmup could not choose a step size at draw "
                f"{draw}: the largest curvature of the potential is {curvature!r} (a "
                "potential that is linear, or not finite, at the initial parameters); give "
                "an explicit step_size"
            )
        if self.step_bound is not None and step > self.step_bound:
            step = self.step_bound
        k.hold_momentum_decay(step)
        k.check_step_size(step)
        self.step_size = step
        record = {"draw": draw, "num_sg_steps": k.num_steps, "curvature": curvature,
                  "stability_limit": limit, "step_size": step}
        friction = k.momentum_friction()
        if friction is not None:  # an underdamped update: the friction chosen with the step
            record["friction"] = friction
        if self._gradient_variance is not None:
            record["noise_limited"] = noise_limited
        self.log.append(record)
        _LOG.info("%s: warmup draw %d (SG step %d): largest curvature %.4g, stability limit "
                  "%.4g, step size %.4g%s", type(k).__name__, draw, k.num_steps,
                  curvature, limit, step, " (diagonal metric)" if k.metric else "")

    @property
    def watches_steps(self) -> bool:
        """Whether :meth:`after_step` must see each SG step: in warmup, once it has chosen a
        step."""
        k = self.kernel
        return k.adapts and self.step_size is not None and k.in_warmup

    def after_step(self, result: Any) -> None:
        """Watch an SG step of warmup (:class:`~.stepper.StepResult`): remember each chain's
        lowest-energy position; after a non-finite step, or one that threw a chain's momentum
        far beyond its law, put the chains that took it back there and back off (see the
        module)."""
        k = self.kernel
        chains = k.chains
        if result.finite is not None:
            self._back_off(~result.finite, {"after_nonfinite_step": True}, "a non-finite step")
            return
        if self._momentum_ran_hot():
            return
        energy = result.energy  # at the position the step started from, kept in last_finite
        if self._lowest is None:
            self._lowest = chains.last_finite.clone()
            self._lowest_energy = energy.clone()
            return
        lower = energy < self._lowest_energy
        if bool(lower.any()):
            self._lowest[lower] = chains.last_finite[lower]
            self._lowest_energy[lower] = energy[lower]

    def _momentum_ran_hot(self) -> bool:
        """After a finite step: whether a chain's momentum is far beyond its law (an unstable
        step, :mod:`.momentum_watch`, read from the second estimate on); if so, those chains
        also lose their momentum and warmup backs off."""
        k = self.kernel
        watch = k.momentum_watch
        sd = k.momentum_sd(self.step_size)
        if watch is None or sd is None or k.draw_index < self._momentum_from:
            return False
        top, index = watch.excess(k.state.momentum, sd)
        hot = top > watch.bound
        if not bool(hot.any()):
            return False
        k.state.momentum[hot] = 0.0
        chain = int(top.argmax())
        site = k.layout.site_at(int(index[chain]))
        self._back_off(hot, {"after_hot_momentum": round(float(top[chain]), 1), "site": site},
                       f"the momentum of site {site!r} {float(top[chain]):.1f} sds out")
        if k.damp_momentum(self.step_size):  # a friction not given follows the decay now
            self.log[-1]["friction"] = k.momentum_friction()
        return True

    def _back_off(self, chains_hit: torch.Tensor, record: dict[str, Any], what: str) -> None:
        """Put the chains ``chains_hit`` back at their lowest-energy positions and halve the
        step, the bound for the rest of warmup; log it with ``record``."""
        k = self.kernel
        if self._lowest is not None:
            known = chains_hit & torch.isfinite(self._lowest_energy)
            k.chains.position[known] = self._lowest[known]
            k.chains.last_finite[known] = self._lowest[known]
        step = NONFINITE_BACKOFF * self.step_size
        self.step_size = self.step_bound = step
        self.log.append({"draw": k.draw_index, "num_sg_steps": k.num_steps, "step_size": step,
                         **record})
        _LOG.info("%s: warmup draw %d (SG step %d): %s; back to the lowest-energy position, "
                  "step size %.4g from here on and at most that for the rest of warmup",
                  type(k).__name__, k.draw_index, k.num_steps, what, step)

    # ------------------------------------------------------------------ gradient noise

    def measure_noise(self) -> None:
        """Estimate the minibatch gradient variance at the kernel's position."""
        k = self.kernel
        self._noise_at.pop(0)
        batches = k.minibatches
        with kept_running_stats(find_batchnorm(k.model)):
            variance = gradient_noise.measure_variance(
                k.potential_and_grad, batches.size, batches.batch_size,
                k.potential_chains, k.num_steps, k.position.device)
        if variance is not None:
            self._gradient_variance = variance

    def report_noise(self) -> None:
        """Record the noise ratio and excess temperature at the step size in force."""
        k = self.kernel
        step = k.base_step_size
        if step is None:
            step = k.current_step_size()
        if self._gradient_variance is None or k.temperature == 0:
            return
        ratio, excess = k.gradient_noise_terms(self._gradient_variance, step)
        worst = int(excess.reshape(-1, excess.shape[-1]).max(0).values.argmax())
        site = k.layout.site_at(worst)
        record = {"draw": k.draw_index, "num_sg_steps": k.num_steps, "step_size": step,
                  "noise_ratio": float(ratio.max()),
                  "median_noise_ratio": float(ratio.median()),
                  "temperature_excess": float(excess.max()),
                  "site": site}
        friction = k.momentum_friction()
        if friction is not None:
            record["friction"] = float(friction)
            record["noise_correction"] = float(torch.as_tensor(k.noise_correction()).max())
            if k.noise_fit is not None and k.noise_fit.share is not None:
                record["epoch_share"] = k.noise_fit.share
        self.noise_log.append(record)
        _LOG.info("%s: warmup draw %d: minibatch/injected noise ratio %.3g (median %.3g), "
                  "excess temperature %.1f%% (worst at site %r)", type(k).__name__,
                  k.draw_index, record["noise_ratio"], record["median_noise_ratio"],
                  100 * record["temperature_excess"], site)

    # ------------------------------------------------------------------ thinning

    def _plan_thinning(self, warmup_steps: int) -> None:
        k = self.kernel
        if k.thinning_by_default:  # "auto" if warmup adapts and can measure, else 1
            k.auto_thinning = k.adapts and (
                warmup_steps >= 4 or self.steps_per_sample is not None)
            k.num_steps_per_sample = "auto" if k.auto_thinning else 1
        if not k.auto_thinning:
            if warmup_steps >= 4 and k.step_size_schedule is None:  # measure, to warn
                self._thinning = self._new_thinning()
                self._thinning_at = adaptation.estimate_points(warmup_steps)[-1:]
                self._thinning_at.append(warmup_steps)
                self._thinning_start = self._thinning_at.pop(0)
            return
        if self.steps_per_sample is not None and not warmup_steps:
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
        sites = thinning.monitored_sites(self.kernel.layout, self.kernel.model)
        return AutoThinning([(s.offset, s.stop) for s in sites])

    def _end_thinning_window(self, step_before: float | None) -> None:
        k = self.kernel
        self._thinning_at.pop(0)
        step_after = k.base_step_size
        if step_before is None or step_after is None:
            step_before = step_after = 1.0
        next_draws = self._thinning_at[0] - k.draw_index if self._thinning_at else None
        self._thinning.window_end(step_before, step_after, next_draws)
        if not k.auto_thinning:  # measured only: say if the given thinning is far too small
            self.autocorrelation_time = self._thinning.last_tau
            self._thinning = None
            return
        if not self._thinning_at:  # warmup ends: the value of every draw after it
            self.steps_per_sample = self._thinning.steps_per_sample
            self.autocorrelation_time = tau = self._thinning.last_tau
            _LOG.info("%s: %d SG steps per draw (%s)", type(k).__name__,
                      self.steps_per_sample,
                      "warmup too short to measure an autocorrelation: the first window's value"
                      if tau is None else f"largest autocorrelation time {tau:.0f} SG steps")
            self._thinning = None

    # ------------------------------------------------------------------ the end of a run

    def warn_at_end(self) -> None:
        """Warn when the chain runs hot (the minibatch noise above its bound) or its draws are
        thinned far too little for their autocorrelation."""
        self._warn_if_hot()
        self._warn_if_thinned_too_little()

    def _warn_if_hot(self) -> None:
        k = self.kernel
        if not self.noise_log or self._noise_warned or not k.warns_on_gradient_noise:
            return
        last = self.noise_log[-1]
        if last["temperature_excess"] > gradient_noise.EXCESS_BOUND:
            self._noise_warned = True
            advice = ("omit step_size so that warmup chooses one that accounts for the noise"
                      if not k.adapts else "raise the minibatch size")
            warnings.warn(
                f"{type(k).__name__}: the minibatch gradient noise is "
                f"{last['noise_ratio']:.3g} times the injected noise (site "
                f"{last['site']!r}): the chain runs about "
                f"{100 * last['temperature_excess']:.0f}% hotter than temperature="
                f"{k.temperature:g}, above the bound of "
                f"{100 * gradient_noise.EXCESS_BOUND:.0f}%. Use a smaller step_size, a larger "
                f"subsample_size, or {advice}; see diagnostics()['gradient_noise']",
                RuntimeWarning, stacklevel=4)

    def _warn_if_thinned_too_little(self) -> None:
        k = self.kernel
        tau = self.autocorrelation_time
        if tau is None or k.auto_thinning:
            return
        if tau > thinning.TOO_FEW_FACTOR * k.num_steps_per_sample:
            self.thinning_warned = True
            warnings.warn(
                f"{type(k).__name__}: the slowest site summary has an autocorrelation time "
                f"of about {tau:.0f} SG steps in the last quarter of warmup, over "
                f"{thinning.TOO_FEW_FACTOR:g} times num_steps_per_sample="
                f"{k.num_steps_per_sample}: the draws will be strongly autocorrelated "
                f"(an effective sample size near {k.num_steps_per_sample / tau:.0%} of "
                f"their number). Use num_steps_per_sample='auto' or about "
                f"{math.ceil(tau / thinning.DRAWS_PER_TAU)}",
                RuntimeWarning, stacklevel=4)

    # ------------------------------------------------------------------ reports, checkpoints

    def diagnostics(self) -> dict[str, Any]:
        """What warmup chose, for the kernel's ``diagnostics()``."""
        k = self.kernel
        out: dict[str, Any] = {}
        if self.log:
            out["step_size_adaptation"] = [dict(r) for r in self.log]
        if self.noise_log:
            out["gradient_noise"] = dict(self.noise_log[-1])
        if self.steps_per_sample is not None:
            out["num_steps_per_sample"] = self.steps_per_sample
        tau = self.autocorrelation_time if self._thinning is None else None
        if tau is not None or k.auto_thinning:
            out["autocorrelation_time"] = tau
        if k.metric is not None:
            out["inverse_mass"] = {
                n: v.clone() for n, v in k.target.site_views(
                    k.metric.inverse_mass.reshape(k.position.shape)).items()}
        return out

    def state_dict(self) -> dict[str, Any] | None:
        """What warmup chose, for a checkpoint (``None``: nothing)."""
        k = self.kernel
        if self.step_size is None and self.steps_per_sample is None and not self.noise_log:
            return None
        return {
            "step_size": self.step_size,
            "inverse_mass": None if k.metric is None else k.metric.inverse_mass.clone(),
            "log": [dict(r) for r in self.log],
            "num_steps_per_sample": self.steps_per_sample,
            "gradient_noise": [dict(r) for r in self.noise_log],
            "friction": k.momentum_friction(),
            "epoch_share": None if k.noise_fit is None else k.noise_fit.share,
            "base_friction": None if k.noise_fit is None else k.noise_fit.base,
            "momentum_damped": None if k.noise_fit is None else k.noise_fit.damped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue with what a checkpoint's warmup chose (:meth:`state_dict`)."""
        k = self.kernel
        self.step_size = state["step_size"]
        if state["inverse_mass"] is not None:  # one row per chain (a single chain's was saved
            inverse_mass = state["inverse_mass"]  # without its row before one chain was one)
            if inverse_mass.dim() == 1:
                inverse_mass = inverse_mass.unsqueeze(0)
            k.metric = DiagonalMetric(inverse_mass.clone(), inverse_mass.sqrt())
        self.log = [dict(r) for r in state["log"]]
        backoffs = [r["step_size"] for r in self.log if r.get("after_nonfinite_step")]
        self.step_bound = min(backoffs) if backoffs else None
        self.steps_per_sample = state.get("num_steps_per_sample")
        self.noise_log = [dict(r) for r in state.get("gradient_noise", [])]
        if state.get("noise_correction") is not None:
            raise ValueError(
                "this checkpoint was written by a pyro_flat whose warmup subtracted a "
                "per-coordinate noise correction from the injected noise (it ran cold on "
                "epoch-wise minibatches); this one raises the friction instead: resume from "
                "a checkpoint taken before warmup ended, or run warmup again")
        if state.get("friction") is not None:  # underdamped: the friction warmup chose
            k.load_noise_friction(state["friction"], state.get("epoch_share"),
                                  state.get("base_friction"),
                                  bool(state.get("momentum_damped")))
