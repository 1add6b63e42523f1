r"""The mixing of a run's draws, measured at its end: a run whose draws are far more
autocorrelated than their number suggests says so.

Warmup chooses the SG steps per draw (``num_steps_per_sample="auto"``, :mod:`.thinning`)
from the autocorrelations it measured, or warns when a given thinning is far too small for
them. Neither can see what happens after warmup: a chain that had not settled when warmup
ended (a prior scale still drifting towards its posterior) or whose slowest component is
longer than warmup's windows gives draws whose effective sample size is a small fraction of
their number, and the run ends silently.

So at each draw after warmup the kernel keeps the summaries that warmup monitored (every
element of each site of at most :data:`~.thinning.SMALL_SITE` elements that is not a network
weight, in the unconstrained space), and at the end of the run estimates each one's integrated
autocorrelation time :math:`\tau` in draws (:func:`~.thinning.integrated_autocorrelation_time`,
pooled over vectorised chains). The effective sample size is

.. math:: \mathrm{ESS} = K n / \tau

for :math:`K` chains of :math:`n` draws, and a run whose smallest ESS is below
:data:`LOW_ESS_FRACTION` of its :math:`Kn` draws warns, naming the site.

**Reweighted draws.** A kernel whose draws are estimates only once reweighted (ContourSGLD's
``log_weight``) is checked on the estimates a user makes: each chain's self-normalised
weighted mean :math:`\hat m_c = \sum_t w_{ct} f_{ct}` (:math:`w_c = \mathrm{softmax}` of the
chain's log weights). By the delta method its variance is
:math:`\tau_{h,c} \sum_t w_{ct}^2 (f_{ct} - \hat m_c)^2`, with :math:`\tau_{h,c}` the
integrated autocorrelation time of :math:`h_{ct} = w_{ct}(f_{ct} - \hat m_c)`, and the
chains' average has

.. math:: \mathrm{ESS} = \bar\sigma^2 K^2 \Big/ \sum_c \tau_{h,c} \sum_t w_{ct}^2
          (f_{ct} - \hat m_c)^2, \qquad \bar\sigma^2 = \frac1K \sum_c \sum_t w_{ct}
          (f_{ct} - \hat m_c)^2,

which is :math:`K n / \tau` for equal weights. It falls with the weights' spread (their own
ESS, Kong's :math:`1/\sum_t w_t^2`) and with the autocorrelation together, so a run whose
weights keep a tenth of its draws and whose draws keep a fifth of their number, each fine by
itself, warns. The memory is bounded:
past :data:`MAX_KEPT` draws the run keeps every second draw's summaries, then every fourth, and
so on (:class:`DrawMixing`). A run of fewer than
:data:`MIN_DRAWS` draws, a model with no such summary (a network whose every site is a
weight), and a run that warmup already warned of (a given thinning far too small) are not
checked.

References
----------
Geyer, C. J. (1992). Practical Markov chain Monte Carlo. Statistical Science.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from pyro_flat.infer.mcmc.halving_buffer import HalvingBuffer
from pyro_flat.infer.mcmc.thinning import integrated_autocorrelation_time
from pyro_flat.target.layout import Site

__all__ = ["LOW_ESS_FRACTION", "MAX_KEPT", "MIN_DRAWS", "DrawMixing", "LowestESS",
           "warn_if_draws_mix_slowly"]

#: A run warns when its smallest effective sample size is below this fraction of its draws.
LOW_ESS_FRACTION = 0.05
#: The fewest draws (per chain) the check reads: fewer give no usable estimate of ``tau``.
MIN_DRAWS = 40
#: The most draws' summaries a run keeps (then every second one, and so on).
MAX_KEPT = 4096


@dataclass(frozen=True)
class LowestESS:
    """The summary with the smallest effective sample size of a run's draws: ``ess`` of
    ``num_draws`` (over all chains); ``fraction`` is the ESS per kept draw (the ESS over the
    draws' number unless the run kept every ``2^j``-th draw, :class:`DrawMixing`)."""

    ess: float
    site: str
    element: int | None  # in the site's unconstrained flat vector; None: a one-element site
    num_draws: int
    fraction: float
    #: Whether the ESS is that of the reweighted estimates (``lowest_ess(log_weight=...)``).
    reweighted: bool = False


class DrawMixing:
    """The summaries of a run's draws after warmup, and their smallest ESS.

    The summaries are kept in a buffer of :data:`MAX_KEPT` draws: a longer run keeps every
    second draw from the moment the buffer fills (every fourth when it fills again, ...), so
    its memory does not grow with its draws. The ESS of the kept draws is then the run's when
    their autocorrelation time spans many kept draws, which is the case whenever it is below
    :data:`LOW_ESS_FRACTION` of them; ``fraction`` is measured on the kept draws.

    Parameters
    ----------
    sites : list of Site
        The monitored sites of the flat position's layout
        (:func:`~.thinning.monitored_sites`).

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.target.layout import FlatLayout
    >>> mixing = DrawMixing(FlatLayout.from_shapes({"scale": torch.Size([])}).sites)
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.zeros(1)
    >>> for _ in range(400):  # AR(1) with coefficient 0.99: tau = 199, an ESS of about 2
    ...     x = 0.99 * x + torch.randn(1, generator=g)
    ...     mixing.record(x)
    >>> lowest = mixing.lowest_ess()
    >>> lowest.site, lowest.num_draws, lowest.fraction < LOW_ESS_FRACTION
    ('scale', 400, True)
    """

    def __init__(self, sites: list[Site]):
        self._names: list[tuple[str, int | None]] = []
        columns = []
        for site in sites:
            columns += range(site.offset, site.stop)
            self._names += [(site.name, i if site.numel > 1 else None) for i in range(site.numel)]
        self._columns = torch.tensor(columns, dtype=torch.long)
        self._buffer = HalvingBuffer(MAX_KEPT)  # rows ([K,] summaries)

    @property
    def monitors(self) -> bool:
        """Whether the model has a summary to check."""
        return bool(self._names)

    def record(self, position: torch.Tensor) -> None:
        """Keep a draw's summaries (``position``: ``(D,)``, or ``(K, D)`` for ``K`` vectorised
        chains); they stay on the position's device until :meth:`lowest_ess`."""
        if not self._names:
            return
        slot = self._buffer.next_slot(
            lambda: position.new_empty((MAX_KEPT, *position.shape[:-1], len(self._names))))
        if slot is not None:
            self._columns = self._columns.to(position.device)
            torch.index_select(position.detach(), -1, self._columns, out=slot)

    def lowest_ess(self, log_weight: torch.Tensor | None = None) -> LowestESS | None:
        """The smallest ESS over the summaries (``None``: fewer than :data:`MIN_DRAWS` draws or
        nothing monitored); the draws kept so far are released.

        ``log_weight``: the run's log importance weights, one per draw (``(draws,)``, or
        ``(draws, K)`` for vectorised chains; the last as many as were recorded are read); the
        ESS is then that of the chains' reweighted means (see the module's text)."""
        buffer, self._buffer = self._buffer, HalvingBuffer(MAX_KEPT)
        kept, num_kept, seen, stride = buffer.kept, buffer.num_kept, buffer.seen, buffer.stride
        if kept is None or num_kept < MIN_DRAWS:
            return None
        series = kept.to("cpu", torch.float64).movedim(0, -1)  # ([K,] m, draws)
        finite = torch.isfinite(series).all(-1, keepdim=True)
        series = torch.where(finite, series, torch.zeros_like(series))
        chains = series.shape[0] if series.dim() > 2 else 1
        if log_weight is not None and len(log_weight) >= seen:
            lw = torch.as_tensor(log_weight, dtype=torch.float64).cpu()[len(log_weight) - seen:]
            lw = lw[::stride][:num_kept].reshape(num_kept, chains).T  # (K, kept draws)
            ess = _reweighted_ess(series.reshape(chains, -1, num_kept), lw)
            worst = int(ess.argmin())
            site, element = self._names[worst]
            value = float(ess[worst])
            return LowestESS(value, site, element, chains * seen, value / (chains * num_kept),
                             reweighted=True)
        tau = integrated_autocorrelation_time(series, pooled=chains > 1)
        if tau.dim() > 1:  # a single vectorised chain: (1, summaries)
            tau = tau.max(0).values
        worst = int(tau.argmax())
        site, element = self._names[worst]
        slowest = float(tau[worst])
        return LowestESS(chains * num_kept / slowest, site, element, chains * seen,
                         1.0 / slowest)


def warn_if_draws_mix_slowly(kernel_name: str, lowest: LowestESS | None) -> None:
    """Warn when the smallest ESS of a run's draws is below :data:`LOW_ESS_FRACTION` of them."""
    if lowest is None or lowest.fraction >= LOW_ESS_FRACTION:
        return
    element = "" if lowest.element is None else f" (element {lowest.element})"
    share = lowest.ess / lowest.num_draws
    which = "reweighted draws'" if lowest.reweighted else "draws'"
    why = ("the importance weights (see diagnostics()['weights_ess']) and the draws' "
           "autocorrelation together leave few effective draws to reweighted estimates. Use a "
           "smaller zeta, more SG steps per draw or a longer run" if lowest.reweighted else
           "the chain had not settled when warmup ended, or it mixes more slowly than warmup "
           "measured. Run a longer warmup (MCMC's warmup_steps) or more SG steps per draw")
    warnings.warn(
        f"{kernel_name}: the {which} effective sample size for site {lowest.site!r}{element} "
        f"is about {lowest.ess:.0f} of {lowest.num_draws} draws ({share:.1%}), below "
        f"{LOW_ESS_FRACTION:.0%}: {why}, and check the draws with arviz.ess and arviz.rhat",
        RuntimeWarning, stacklevel=4)


def _reweighted_ess(series: torch.Tensor, log_weight: torch.Tensor) -> torch.Tensor:
    """Per summary, the ESS of the chains' average of their self-normalised weighted means
    (``series``: ``(K, summaries, n)``, ``log_weight``: ``(K, n)``; the module's text)."""
    usable = torch.isfinite(log_weight).any(-1, keepdim=True)
    w = torch.softmax(torch.where(usable, log_weight, 0.0), -1).unsqueeze(1)  # (K, 1, n)
    w = torch.where(torch.isfinite(w), w, 0.0)
    dev = series - (w * series).sum(-1, keepdim=True)
    h = w * dev
    variance = (h * dev).sum(-1)  # (K, summaries): each chain's weighted variance
    tau = integrated_autocorrelation_time(h)
    error = tau * h.square().sum(-1)  # each chain's mean's variance (delta method)
    chains, n = series.shape[0], series.shape[-1]
    ess = variance.mean(0) * chains**2 / error.sum(0).clamp(min=torch.finfo(h.dtype).tiny)
    ess = torch.where(error.sum(0) > 0, ess, float(chains * n))  # a constant: nothing to err
    return torch.where(usable.all(), ess, torch.zeros_like(ess))
