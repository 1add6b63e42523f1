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
:data:`LOW_ESS_FRACTION` of its :math:`Kn` draws warns, naming the site. A run of fewer than
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

from pyro_flat.infer.mcmc.thinning import SMALL_SITE, integrated_autocorrelation_time
from pyro_flat.target.layout import FlatLayout

__all__ = ["LOW_ESS_FRACTION", "MIN_DRAWS", "DrawMixing", "LowestESS",
           "warn_if_draws_mix_slowly"]

#: A run warns when its smallest effective sample size is below this fraction of its draws.
LOW_ESS_FRACTION = 0.05
#: The fewest draws (per chain) the check reads: fewer give no usable estimate of ``tau``.
MIN_DRAWS = 40


@dataclass(frozen=True)
class LowestESS:
    """The summary with the smallest effective sample size of a run's draws."""

    ess: float
    site: str
    element: int | None  # in the site's unconstrained flat vector; None: a one-element site
    num_draws: int  # over all chains

    @property
    def fraction(self) -> float:
        return self.ess / self.num_draws


class DrawMixing:
    """The summaries of a run's draws after warmup, and their smallest ESS.

    Parameters
    ----------
    layout : FlatLayout
        The flat position's layout.
    weight_sites : set of str
        Sites that are a network's weights (:func:`~.thinning.network_weight_sites`): not
        monitored.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.target.layout import FlatLayout
    >>> mixing = DrawMixing(FlatLayout.from_shapes({"scale": torch.Size([])}), set())
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.zeros(1)
    >>> for _ in range(400):  # AR(1) with coefficient 0.99: tau = 199, an ESS of about 2
    ...     x = 0.99 * x + torch.randn(1, generator=g)
    ...     mixing.record(x)
    >>> lowest = mixing.lowest_ess()
    >>> lowest.site, lowest.num_draws, lowest.fraction < LOW_ESS_FRACTION
    ('scale', 400, True)
    """

    def __init__(self, layout: FlatLayout, weight_sites: set[str]):
        self._names: list[tuple[str, int | None]] = []
        columns = []
        for site in layout.sites:
            if 0 < site.numel <= SMALL_SITE and site.name not in weight_sites:
                columns += range(site.offset, site.stop)
                self._names += [(site.name, i if site.numel > 1 else None)
                                for i in range(site.numel)]
        self._columns = torch.tensor(columns, dtype=torch.long)
        self._draws: list[torch.Tensor] = []

    @property
    def monitors(self) -> bool:
        """Whether the model has a summary to check."""
        return bool(self._names)

    def record(self, position: torch.Tensor) -> None:
        """Keep a draw's summaries (``position``: ``(D,)``, or ``(K, D)`` for ``K`` vectorised
        chains); they stay on the position's device until :meth:`lowest_ess`."""
        if self._names:
            columns = self._columns.to(position.device, non_blocking=True)
            self._draws.append(position.detach().index_select(-1, columns))

    def lowest_ess(self) -> LowestESS | None:
        """The smallest ESS over the summaries (``None``: fewer than :data:`MIN_DRAWS` draws or
        nothing monitored); the draws kept so far are released."""
        draws, self._draws = self._draws, []
        if not self._names or len(draws) < MIN_DRAWS:
            return None
        series = torch.stack(draws, -1).to("cpu", torch.float64)  # ([K,] summaries, draws)
        finite = torch.isfinite(series).all(-1, keepdim=True)
        series = torch.where(finite, series, torch.zeros_like(series))
        chains = series.shape[0] if series.dim() > 2 else 1
        tau = integrated_autocorrelation_time(series, pooled=chains > 1)
        if tau.dim() > 1:  # a single vectorised chain: (1, summaries)
            tau = tau.max(0).values
        worst = int(tau.argmax())
        num_draws = chains * len(draws)
        site, element = self._names[worst]
        return LowestESS(num_draws / float(tau[worst]), site, element, num_draws)


def warn_if_draws_mix_slowly(kernel_name: str, lowest: LowestESS | None) -> None:
    """Warn when the smallest ESS of a run's draws is below :data:`LOW_ESS_FRACTION` of them."""
    if lowest is None or lowest.fraction >= LOW_ESS_FRACTION:
        return
    element = "" if lowest.element is None else f" (element {lowest.element})"
    warnings.warn(
        f"{kernel_name}: the draws' effective sample size for site {lowest.site!r}{element} is "
        f"about {lowest.ess:.0f} of {lowest.num_draws} draws ({lowest.fraction:.1%}), below "
        f"{LOW_ESS_FRACTION:.0%}: the chain had not settled when warmup ended, or it mixes more "
        "slowly than warmup measured. Run a longer warmup (MCMC's warmup_steps) or more SG "
        "steps per draw, and check the draws with arviz.ess and arviz.rhat",
        RuntimeWarning, stacklevel=4)
