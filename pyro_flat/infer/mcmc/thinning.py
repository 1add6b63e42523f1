r"""SG steps per draw chosen in warmup from the autocorrelations of the chain ("auto" thinning).

An SG step moves the chain by :math:`O(\sqrt\epsilon)`, so successive steps are strongly
correlated and a draw per step wastes memory and analysis on near-copies. With
``num_steps_per_sample="auto"`` warmup runs in the four windows between the estimate points
of :mod:`~pyro_flat.infer.mcmc.adaptation` (0, 1/4, 1/2, 3/4 of warmup) and its end.

**What is monitored.** In each window the kernel records, at every SG step and per chain, every
element of each small site (at most :data:`SMALL_SITE` elements, in the unconstrained space:
noise and prior scales, mixture weights, low-dimensional coefficients) that is not a torch
layer's weight (:func:`network_weight_sites`); a model with no such site is monitored by its
energy :math:`\hat U`. A network's weights, and the energy of a network (its prior term is
the weights' squared norm), wander along the flat and symmetric directions of the posterior
far more slowly than anything the network predicts or the scales a user reads, and between
modes of different energy that no chain crosses: their autocorrelation would ask for
thinning that buys nothing.

**The estimate.** At the end of a window the kernel estimates each summary's integrated
autocorrelation time :math:`\tau` in SG steps (:func:`integrated_autocorrelation_time`: in
the warmup windows the mean over chains of each chain's estimate after removing its linear
drift, or with vectorised chains the multi-chain estimate if it is larger, since it also
sees a slow component on which the chains still disagree; in the last window the multi-chain
estimate), takes the largest over summaries, rescales it to the step size of the next window
(:math:`\tau \propto 1/\epsilon` for a Langevin chain) and sets

.. math:: k = \big\lceil \tau_{\max} / \text{DRAWS\_PER\_TAU} \big\rceil

SG steps per draw for the draws after warmup.

**The windows.** An autocorrelation time is only estimated well from a window many times
longer (Sokal's rule of thumb), and no estimate sees a component slower than its window
spans. So each warmup window runs long enough to hold :data:`WINDOW_TAUS` autocorrelation
times of the previous estimate, :math:`k_w = \max(k, \lceil \text{WINDOW\_TAUS}\,\tau_{\max}
/ D \rceil)` for a window of :math:`D` draws, and at least :data:`MIN_GROWTH` times the
previous window's steps per draw (:data:`MAX_GROWTH` times when the window that ended
spanned fewer than ``WINDOW_TAUS`` of its own estimates: that estimate is only a lower
bound). Every choice is clipped to ``[1, MAX_STEPS_PER_SAMPLE]`` and to at most
``MAX_GROWTH`` times the previous window's.

**The criterion.** About :data:`DRAWS_PER_TAU` (5) draws per autocorrelation time of the
slowest summary, so that the kept draws have an effective sample size of about a fifth of
their number, and at least a tenth where :math:`\tau` was underestimated by up to half (for a
chain whose :math:`\tau` in draws is :math:`\tau/k`). A slow component that the last window
cannot see (one longer than the warmup's SG steps) is missed: the draws' ESS, which ArviZ
reports, is the check. The value chosen at the end of warmup is used for every draw after
it and is in ``diagnostics()["num_steps_per_sample"]`` and the ``step_size_adaptation``
records.

References
----------
Geyer, C. J. (1992). Practical Markov chain Monte Carlo. Statistical Science (the initial
monotone sequence estimator of the integrated autocorrelation time).
"""

from __future__ import annotations

import math

import torch

from pyro_flat.target.layout import FlatLayout, Site

#: Sites with at most this many elements are monitored element by element.
SMALL_SITE = 8
#: SG steps per draw of the first warmup window, before any autocorrelation is known.
INITIAL_STEPS_PER_SAMPLE = 10
#: Draws per integrated autocorrelation time of the slowest summary.
DRAWS_PER_TAU = 5.0
#: The largest factor by which one window's thinning may exceed the previous one's.
MAX_GROWTH = 4
#: The smallest factor by which one warmup window's thinning exceeds the previous one's.
MIN_GROWTH = 2
#: The most SG steps per draw "auto" chooses.
MAX_STEPS_PER_SAMPLE = 10_000
#: The fewest SG steps in a window for an estimate; shorter windows keep the last value.
MIN_WINDOW = 32
#: Autocorrelation times a warmup window is made to span (more than ``3 * draws`` only in a
#: warmup of fewer than 120 draws).
WINDOW_TAUS = 10.0
#: With an integer ``num_steps_per_sample``, the last quarter of warmup is measured too, and
#: a run warns when the autocorrelation time exceeds this many times the thinning (the draws'
#: effective sample size is then about a tenth of their number or less).
TOO_FEW_FACTOR = 10.0


def integrated_autocorrelation_time(x: torch.Tensor, detrend: bool = False,
                                    pooled: bool = False) -> torch.Tensor:
    r"""Geyer's initial-monotone-sequence estimate of :math:`\tau = 1 + 2\sum_{t\ge1}\rho_t`.

    ``x`` is ``(..., n)``: one series per leading index. The autocovariances come from an FFT;
    the sums of consecutive pairs :math:`\Gamma_m = \rho_{2m} + \rho_{2m+1}` are truncated at
    the first non-positive one and made non-increasing. A constant series has
    :math:`\tau = 1`. ``detrend=True`` first removes each series' least-squares line (a
    chain still drifting from its start would otherwise look as slow as the window is long).
    ``pooled=True`` reads the first dimension as chains of one quantity and returns one
    :math:`\tau` per quantity from the multi-chain autocorrelation of Vehtari et al. (2021),
    :math:`\rho_t = 1 - (W - \bar c_t)/\widehat{\mathrm{var}}^+`, whose between-chain term
    undoes most of the downward bias that centring each short series on its own mean gives.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> e = torch.randn(20_000, dtype=torch.float64, generator=g)
    >>> x = torch.zeros_like(e)
    >>> for t in range(1, len(e)):  # AR(1) with coefficient 0.9: tau = 1.9 / 0.1 = 19
    ...     x[t] = 0.9 * x[t - 1] + e[t]
    >>> round(float(integrated_autocorrelation_time(x)))  # doctest: +SKIP
    19

    References
    ----------
    Vehtari, A., Gelman, A., Simpson, D., Carpenter, B. & Bürkner, P.-C. (2021).
    Rank-normalization, folding, and localization: an improved R-hat for assessing convergence
    of MCMC. Bayesian Analysis.
    """
    x = x.to(torch.float64)
    n = x.shape[-1]
    means = x.mean(-1, keepdim=True)
    centred = x - means
    if detrend and n > 2:  # remove the least-squares line: a drift is no autocorrelation
        t = torch.arange(n, dtype=x.dtype) - (n - 1) / 2
        centred = centred - t * (centred * t).sum(-1, keepdim=True) / t.square().sum()
    size = 1 << (2 * n - 1).bit_length()
    spectrum = torch.fft.rfft(centred, n=size)
    acov = torch.fft.irfft(spectrum * spectrum.conj(), n=size)[..., :n] / n
    if pooled and x.shape[0] > 1:
        within = acov[..., :1].mean(0) * n / (n - 1)
        var_plus = within * (n - 1) / n + means.var(0)
        var = var_plus
        rho = 1.0 - (within - acov.mean(0)) / var_plus.clamp(min=torch.finfo(x.dtype).tiny)
    else:
        var = acov[..., :1]
        rho = acov / var.clamp(min=torch.finfo(x.dtype).tiny)
    rho = torch.where(var > 0, rho, torch.zeros_like(rho))
    pairs = rho[..., : 2 * (n // 2)].reshape(*rho.shape[:-1], n // 2, 2).sum(-1)
    positive = torch.cumprod((pairs > 0).to(x.dtype), dim=-1)
    monotone = torch.cummin(torch.where(positive > 0, pairs, torch.zeros_like(pairs)), dim=-1)
    tau = -1.0 + 2.0 * (monotone.values * positive).sum(-1)
    return tau.clamp(min=1.0).where(var.squeeze(-1) > 0, torch.ones_like(tau))


def network_weight_sites(model: object) -> set[str]:
    """The sites of ``model`` that are a torch layer's weights made random by ``PyroSample``.

    A site is one when its :class:`~pyro.nn.PyroModule` is also a ``torch.nn`` layer (for
    example ``PyroModule[torch.nn.Linear]``, or any layer of a network converted by
    :func:`~pyro_flat.models.nn.make_bayesian` or :class:`~pyro_flat.models.bnn.BNN`). A
    ``PyroSample`` of a user's own module (a hierarchical scale, say) and ``pyro.sample`` statements
    are not. A model that is no ``torch.nn.Module`` has none.
    """
    if not isinstance(model, torch.nn.Module):
        return set()
    from pyro_flat.models.nn import pyro_sample_sites

    return {name for layer, name in pyro_sample_sites(model) if _is_torch_layer(layer)}


def monitored_sites(layout: FlatLayout, model: object) -> list[Site]:
    """The sites whose elements are monitored (see the module's text): at most
    :data:`SMALL_SITE` elements, and not a network's weights."""
    weights = network_weight_sites(model)
    return [s for s in layout.sites if 0 < s.numel <= SMALL_SITE and s.name not in weights]


def _is_torch_layer(layer: torch.nn.Module) -> bool:
    return any(c.__module__.startswith("torch.nn.modules.") and c is not torch.nn.Module
               for c in type(layer).__mro__)


class AutoThinning:
    """Chooses the SG steps per draw in warmup (see the module's text).

    The kernel calls :meth:`record` after each SG step of warmup with the flat position,
    :meth:`window_end` at each window's end with the step sizes of the window that ended and
    of the next one, and reads ``steps_per_sample``.
    """

    def __init__(self, site_slices: list[tuple[int, int]]):
        self.columns = [i for start, stop in site_slices if stop - start <= SMALL_SITE
                        for i in range(start, stop)]
        self.steps_per_sample = INITIAL_STEPS_PER_SAMPLE
        self.last_tau: float | None = None
        #: Autocorrelation times the last window spanned.
        self.window_taus: float | None = None
        self._trace: list[torch.Tensor] = []

    def summaries(self, z: torch.Tensor, energy: torch.Tensor) -> torch.Tensor:
        """Per chain, the small sites' elements, or the energy if there are none:
        ``(..., summaries)``."""
        if self.columns:
            return z[..., self.columns]
        return torch.as_tensor(energy, dtype=z.dtype).reshape(*z.shape[:-1], 1)

    def record(self, z: torch.Tensor, energy: torch.Tensor) -> None:
        self._trace.append(self.summaries(z.detach(), energy))

    def window_end(self, step_size: float, next_step_size: float,
                   next_window_draws: int | None) -> None:
        """Choose the thinning of the next window (of ``next_window_draws`` draws; ``None``:
        the draws after warmup) from the window that ended."""
        trace, self._trace = self._trace, []
        if len(trace) < MIN_WINDOW:
            return
        series = torch.stack(trace, -1)  # (..., summaries, steps)
        finite = torch.isfinite(series).all(-1)
        series = torch.where(finite.unsqueeze(-1), series, torch.zeros_like(series))
        if next_window_draws:  # warmup: the chain may still drift
            tau = integrated_autocorrelation_time(series, detrend=True)
            if tau.dim() > 1:  # vectorised chains: the mean over chains, or more if they
                # disagree (each chain's own drift-free estimate cannot see a slow mode that
                # a short window does not cross; the chains' spread can)
                tau = torch.maximum(tau.mean(0),
                                    integrated_autocorrelation_time(series, pooled=True))
        else:  # the last quarter of warmup, at the final step size: pooled over the chains
            tau = integrated_autocorrelation_time(series, pooled=series.dim() > 2)
        slowest = float(tau.max()) * step_size / next_step_size
        self.last_tau = slowest
        self.window_taus = len(trace) / slowest
        wanted = math.ceil(slowest / DRAWS_PER_TAU)
        if next_window_draws:
            wanted = max(wanted, math.ceil(WINDOW_TAUS * slowest / next_window_draws))
            # each window at least MIN_GROWTH times longer than the last: an estimate cannot
            # see a slower component than its window spans; one too short to trust its own
            # estimate (a lower bound only) grows the most
            growth = MAX_GROWTH if self.window_taus < WINDOW_TAUS else MIN_GROWTH
            wanted = max(wanted, growth * self.steps_per_sample)
        self.steps_per_sample = max(1, min(wanted, MAX_STEPS_PER_SAMPLE,
                                           MAX_GROWTH * self.steps_per_sample))
