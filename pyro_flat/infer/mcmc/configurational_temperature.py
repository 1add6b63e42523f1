r"""The temperature a chain's draws sample at, read from the draws and their gradients.

Target: for :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)` on :math:`\mathbb{R}^d` whose
density vanishes at infinity, integration by parts gives, for every coordinate :math:`i` and
any constant :math:`c_i`,

.. math:: \mathbb{E}_{\pi_T}\big[(\theta_i - c_i)\,\partial_i U(\theta)\big] = T,

the configurational temperature of molecular dynamics (Rugh 1997; Jepps, Ayton & Evans
2000). A minibatch gradient
:math:`\nabla\hat U = \nabla U + \eta` with :math:`\mathbb{E}[\eta \mid \theta] = 0` has the
same expectation, so each draw of an SG-MCMC chain and a minibatch gradient there give an
unbiased term. The kernels' own batches do not qualify: they run through epochs, so the
batch after a draw is made of the points the epoch's earlier batches (which moved the chain
to the draw) left out, and its noise is correlated with the draw (:mod:`.epoch_noise`); on a
noise-dominated chain that reads as several times hotter than it is. So a minibatched run
evaluates the gradient at a draw on a batch of its own, ``B`` points drawn uniformly without
replacement from a generator seeded by the SG step count (no random stream of the chain is
touched and BatchNorm's running statistics are kept), at most once every
:data:`SPACING` SG steps (one gradient more per :data:`SPACING` steps); a full-batch run
reads the gradient the step after the draw takes there, at no cost.

Per site :math:`s` of :math:`d_s` coordinates, over :math:`n` draws of :math:`K` chains
centred on each chain's mean :math:`\bar\theta_k`,

.. math:: \hat T_s = \frac{1}{K n d_s} \sum_{k, t} (\theta_{kt} - \bar\theta_k)_s \cdot
          \nabla \hat U(\theta_{kt})_s .

(Any fixed centre gives :math:`T` under :math:`\pi_T`; the chain's own mean also keeps a
chain whose mean is off from reading as hot or cold: for a Gaussian target
:math:`\mathcal N(\mu, \Sigma)` and draws of :math:`\mathcal N(m, \Sigma_q)` it gives
:math:`\mathrm{tr}(\Sigma_s^{-1}\Sigma_{q,s})/d_s` whatever :math:`m`. ContourSGLD's
reweighted estimate is centred on the first draw after warmup instead: the weights are known
only at the end.)

A chain that samples :math:`\pi_T` has :math:`\hat T_s / T \approx 1` on every site (to the
discretisation bias: a Langevin step :math:`\epsilon` at curvature :math:`h` gives
:math:`1/(1 - \epsilon h/2)`); a chain whose draws are too narrow by a factor :math:`a` in a
direction has :math:`a^2` there, and one that runs hot has more than 1. The estimate
needs no reference posterior and costs, per draw read, one product over the position and a
sum per site (and, minibatched, the gradient on the draw's own batch); it holds in the
unconstrained space where the chain moves (the potential includes the Jacobians).

The kernels report :math:`\hat T_s/T` for each site and for the whole position, with a
standard error from the draws' autocorrelation
(:func:`~.thinning.integrated_autocorrelation_time`), in
``diagnostics()["configurational_temperature"]``. A kernel whose draws are meant to
follow :math:`\pi_T` warns at the end of a run when a site's ratio lies outside
:data:`LOW_RATIO` to :data:`HIGH_RATIO` by more than :data:`Z` standard errors: its posterior
standard deviations are then off by a factor :math:`\sqrt{2}` or more there. A kernel whose
draws follow another law says so (``follows_target = False``: SASGLD's tilted law) and only
reports; ContourSGLD's draws are read with their importance weights, EntropyMCMC's
:math:`\theta` (whose marginal is :math:`\pi_T`) as they are.

Examples
--------
>>> import torch
>>> from pyro_flat.target.layout import FlatLayout
>>> layout = FlatLayout.from_shapes({"w": torch.Size([3])})
>>> watch = ConfigurationalTemperature(layout.sites, num_chains=1)
>>> g = torch.Generator().manual_seed(0)
>>> for _ in range(2000):  # exact draws of N(0, 0.5^2 I) read with U = |w|^2 / 2: T = 0.25
...     w = 0.5 * torch.randn(1, 3, generator=g)
...     watch.record(w, w)  # grad U(w) = w
>>> round(watch.estimate(temperature=1.0)["all"]["ratio"], 2)
0.25

References
----------
Rugh, H. H. (1997). Dynamical approach to temperature. Physical Review Letters 78, 772.
Jepps, O. G., Ayton, G. & Evans, D. J. (2000). Microscopic expressions for the thermodynamic
temperature. Physical Review E 62, 4757.
"""

from __future__ import annotations

import math
import warnings

import torch

from pyro_flat.infer.mcmc.halving_buffer import HalvingBuffer
from pyro_flat.infer.mcmc.thinning import integrated_autocorrelation_time
from pyro_flat.target.layout import Site

__all__ = ["HIGH_RATIO", "LOW_RATIO", "MAX_KEPT", "MIN_DRAWS", "SPACING", "Z",
           "ConfigurationalTemperature", "warn_if_temperature_off"]

#: A run warns when a site's ratio is surely below this (its sds about 0.7 of the target's).
LOW_RATIO = 0.5
#: ... or surely above this (its sds about 1.4 times the target's).
HIGH_RATIO = 2.0
#: "Surely": by more than this many standard errors.
Z = 3.0
#: The fewest draws (per chain) a run's estimate is made from.
MIN_DRAWS = 40
#: A minibatched run reads a draw at most once every this many SG steps (an extra gradient
#: each time: at most 4% more).
SPACING = 25
#: The most draws' terms a run keeps for the standard error (then every second one, ...);
#: the estimate itself reads every draw.
MAX_KEPT = 4096
#: Seeds the independent batches (offset by the SG step count).
_SEED = 0x7E3_9E7A


class ConfigurationalTemperature:
    """The terms :math:`(\\theta - c)_s \\cdot \\nabla\\hat U_s` of a run's draws, per chain and
    site, and the estimate :math:`\\hat T_s / T` they give (see the module).

    Parameters
    ----------
    sites : list of Site
        The sites of the flat position's layout.
    num_chains : int
        ``K``: rows of the position (1 for a single chain).
    """

    def __init__(self, sites: list[Site], num_chains: int):
        self.sites = list(sites)
        self.num_chains = num_chains
        self._site_of: torch.Tensor | None = None
        self._reference: torch.Tensor | None = None
        #: Sums over the usable draws (every chain finite), on the device: the terms, theta - c
        #: and the gradient (to centre on each chain's mean), and their number.
        self._sum_terms: torch.Tensor | None = None
        self._sum_offset: torch.Tensor | None = None
        self._sum_grad: torch.Tensor | None = None
        self._count: torch.Tensor | None = None
        #: The terms of evenly spaced draws, for the standard error (and the weighted
        #: estimate): at most MAX_KEPT.
        self._buffer = HalvingBuffer(MAX_KEPT)
        self._last_step: int | None = None

    @property
    def num_draws(self) -> int:
        """The draws read so far."""
        return self._buffer.seen

    def kept_terms(self) -> tuple[torch.Tensor, int]:
        """The kept draws' terms, ``(kept, K, sites)`` (NaN where a chain was not finite), and
        the stride between them in draws read."""
        kept = self._buffer.kept
        if kept is None:
            kept = torch.zeros(0, self.num_chains, len(self.sites))
        return kept, self._buffer.stride

    def wants(self, step: int) -> bool:
        """Whether a minibatched run reads its draw at SG step ``step`` (:data:`SPACING`)."""
        return self._last_step is None or step - self._last_step >= SPACING

    def independent_batch(self, num_data: int, batch_size: int, step: int, vectorized: bool,
                          device: torch.device) -> torch.Tensor:
        """``B`` of the ``N`` indices uniformly without replacement per chain (``(K, B)``, or
        ``(B,)`` for one chain), from a generator seeded by ``step``; the draw read at
        ``step`` is marked as read."""
        self._last_step = step
        generator = torch.Generator().manual_seed(_SEED + step)
        rows = torch.stack([torch.randperm(num_data, generator=generator)[:batch_size]
                            for _ in range(self.num_chains)]).to(device)
        return rows if vectorized else rows[0]

    def record(self, position: torch.Tensor, grad: torch.Tensor,
               finite: torch.Tensor | None = None) -> None:
        """Read one draw: ``position`` and the minibatch gradient there, ``(K, d)`` (or
        ``(d,)``); ``finite``: which chains' gradients are finite (``None``: all). A draw
        with a chain not finite is left out. No host synchronisation."""
        position = position.detach().reshape(self.num_chains, -1)
        grad = grad.detach().reshape(self.num_chains, -1)
        if self._reference is None:
            self._start(position)
        offset = position - self._reference
        keep = None
        if finite is not None:
            keep = finite.reshape(-1, 1).all()
            offset = torch.where(keep, offset, 0.0)
            grad = torch.where(keep, grad, 0.0)
        terms = offset.new_zeros(self.num_chains, len(self.sites)).index_add_(
            -1, self._site_of, offset * grad)
        self._sum_terms += terms
        self._sum_offset += offset
        self._sum_grad += grad
        self._count += 1.0 if keep is None else keep.to(self._count.dtype)
        slot = self._buffer.next_slot(
            lambda: terms.new_empty(MAX_KEPT, self.num_chains, len(self.sites)))
        if slot is not None:
            slot.copy_(terms if keep is None else torch.where(keep, terms, math.nan))

    def _start(self, position: torch.Tensor) -> None:
        self._reference = position.clone()
        device, rows, sites = position.device, self.num_chains, len(self.sites)
        self._site_of = torch.repeat_interleave(
            torch.arange(sites, device=device),
            torch.tensor([s.numel for s in self.sites], device=device))
        self._sum_terms = position.new_zeros(rows, sites)
        self._sum_offset = torch.zeros_like(position)
        self._sum_grad = torch.zeros_like(position)
        self._count = position.new_zeros(())

    def estimate(self, temperature: float, log_weight: torch.Tensor | None = None
                 ) -> dict[str, dict[str, float]]:
        r"""Per site (and ``"all"``, the whole position): ``ratio`` :math:`\hat T_s / T`, its
        standard error ``se`` and the effective number of draws ``ess`` behind it (of the
        kept ones). Empty with fewer than :data:`MIN_DRAWS` usable draws. ``log_weight``: the
        draws' log importance weights (``(draws,)`` or ``(draws, K)``, the last as many as
        were read are used): the estimate is then the self-normalised weighted one over the
        kept draws, each chain's weights normalised alone."""
        kept, stride = self.kept_terms()
        kept = kept.to("cpu", torch.float64)
        usable = torch.isfinite(kept).all(-1).all(-1)  # draws where every chain is finite
        n = int(usable.sum())
        if n < MIN_DRAWS or not self.sites:
            return {}
        sizes = torch.tensor([s.numel for s in self.sites] + [sum(s.numel for s in self.sites)],
                             dtype=torch.float64)

        def per_coordinate(terms: torch.Tensor) -> torch.Tensor:  # (..., sites + 1)
            return torch.cat([terms, terms.sum(-1, keepdim=True)], -1) / sizes

        series = per_coordinate(kept[usable]).permute(1, 2, 0)  # (K, sites + 1, n)
        if log_weight is not None:
            # the weighted law is the target's: any fixed centre c gives T (see the module)
            lw = torch.as_tensor(log_weight, dtype=torch.float64).cpu()
            lw = lw.reshape(len(lw), -1)[len(lw) - self.num_draws:][::stride][: len(usable)]
            w = torch.softmax(lw[usable].T, -1).unsqueeze(1)  # (K, 1, n)
            means = (w * series).sum(-1)  # (K, sites + 1)
            h = w * (series - means.unsqueeze(-1))
            tau = integrated_autocorrelation_time(h)
            variance = (tau * h.square().sum(-1)).sum(0) / self.num_chains**2
            mean = means.mean(0)
            ess = torch.full_like(mean, math.nan)
        else:
            # every usable draw, centred on each chain's own mean: (theta - theta_bar) . grad,
            # so that a chain whose mean is off does not read as hot or cold
            count = float(self._count)
            offset = self._sum_offset.to("cpu", torch.float64) / count
            grad = self._sum_grad.to("cpu", torch.float64) / count
            shift = offset.new_zeros(self.num_chains, len(self.sites)).index_add_(
                -1, self._site_of.cpu(), offset * grad)
            terms = self._sum_terms.to("cpu", torch.float64) / count
            mean = (per_coordinate(terms) - per_coordinate(shift)).mean(0)
            pooled = self.num_chains > 1
            tau = integrated_autocorrelation_time(series if pooled else series[0], pooled=pooled)
            ess = self.num_chains * n / tau.reshape(-1)  # of the kept draws: conservative
            variance = series.var((0, 2)) / ess
        names = [s.name for s in self.sites] + ["all"]
        se = variance.clamp(min=0).sqrt()
        return {name: {"ratio": float(m) / temperature, "se": float(s) / temperature,
                       "ess": float(e)}
                for name, m, s, e in zip(names, mean, se, ess, strict=True)}


def warn_if_temperature_off(kernel_name: str, estimate: dict[str, dict[str, float]],
                            temperature: float) -> None:
    """Warn, naming the site, when a site's (or the whole position's) ratio is surely outside
    :data:`LOW_RATIO` to :data:`HIGH_RATIO`."""
    off = [(name, e) for name, e in estimate.items()
           if e["ratio"] + Z * e["se"] < LOW_RATIO or e["ratio"] - Z * e["se"] > HIGH_RATIO]
    if not off:
        return
    name, e = max(off, key=lambda item: abs(math.log(max(item[1]["ratio"], 1e-12))))
    cold = e["ratio"] < 1
    where = "the whole position" if name == "all" else f"site {name!r}"
    why = ("its draws are narrower than the target's: the posterior standard deviations it "
           f"gives are about {math.sqrt(max(e['ratio'], 0.0)):.2g} times the true ones there"
           if cold else
           "its draws are wider than the target's (minibatch gradient noise far above the "
           "injected noise, or too large a step)")
    warnings.warn(
        f"{kernel_name}: the draws' configurational temperature for {where} is "
        f"{e['ratio']:.3g} +- {e['se']:.2g} times the target's T = {temperature:g} (1 for a "
        f"chain that samples the target; the accepted range is {LOW_RATIO:g} to "
        f"{HIGH_RATIO:g}): {why}. See diagnostics()['configurational_temperature']",
        RuntimeWarning, stacklevel=4)
