"""ContourSGLD: SGLD on a flattened target that learns the energy PDF as it samples, and
:func:`reweight`, which turns its draws into estimates under the original target."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from pyro_flat import validation
from pyro_flat.infer.mcmc import adaptation
from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.energy_noise import NOISE_BOUND, energy_noise
from pyro_flat.infer.mcmc.estimators import Estimate
from pyro_flat.infer.mcmc.integrators import langevin_step_
from pyro_flat.infer.mcmc.sgld import NOISE
from pyro_flat.infer.mcmc.state import KernelState, StateField

#: Margin added on each side of the warmup energies when ``auto_bins=True``, as a fraction of
#: their range (the flattened chain climbs above the warmup energies, hence more room on top).
AUTO_MARGIN_BELOW = 0.1
AUTO_MARGIN_ABOVE = 1.0
#: ``auto_bins`` reads the energies of this last fraction of warmup: the chain's descent from
#: its initial values, which depends on where it started and not on the target, is left out.
AUTO_SETTLED_FRACTION = 0.5

#: A chain's importance weights have collapsed when their effective sample size is below this
#: many draws (half the draws for a run of fewer than ten): :func:`weights_ess_threshold`.
WEIGHTS_ESS_FLOOR = 5.0


class ContourSGLD(SGMCMCKernel):
    r"""Contour stochastic gradient Langevin dynamics (CSGLD).

    Samples the flattened target :math:`\varpi(\theta) \propto \pi_T(\theta)/\Psi(U(\theta))^\zeta`,
    with :math:`\pi_T \propto \exp(-U/T)` and :math:`\Psi` the (piecewise-constant in log)
    energy PDF, learned on the fly by stochastic approximation; draws are reweighted back to
    :math:`\pi_T` by :math:`w_k = \Psi_k(\hat U_k)^\zeta` (see *Weights* below and
    :func:`reweight`). With ``zeta = 0`` the kernel is :class:`~pyro_flat.infer.SGLD` exactly
    (same draws at the same seed).

    Energy partition: ``m`` bins of width :math:`\Delta u` from :math:`u_{\min}`, edges
    :math:`e_i = u_{\min} + i\Delta u`; bin ``i`` (0-based) covers :math:`[e_i, e_{i+1})`,
    and for the SA update energies below :math:`e_0` count in bin 0 and those at or above
    :math:`e_m` in bin ``m - 1``:
    :math:`J(u) = \operatorname{clip}(\lfloor (u - u_{\min})/\Delta u \rfloor, 0, m-1)`.
    One gradient per SG step, at the current :math:`\theta` with stochastic energy
    :math:`\hat U = \hat U(\theta)` and :math:`J = J(\hat U)`:

    .. math::

        g_i &\leftarrow g_i + \omega_k\, g_J^\zeta\,(\mathbb{1}\{i = J\} - g_i), \qquad
              \omega_k = \min\!\big(\omega_0,\ 10/(k^{0.8} + 100)\big) \\
        \mu &= \begin{cases}
              1 + \zeta T\,(\log g_{J^-} - \log g_{J^- - 1}) / \Delta u, \quad
              J^- = \max(J, 1), & e_0 \le \hat U < e_m \\
              1 & \text{otherwise}
              \end{cases} \\
        \theta &\leftarrow \theta - \epsilon\,\mu\,\nabla \hat U(\theta) + \sqrt{2\epsilon T}\,\xi

    with :math:`g` starting at :math:`(m, m-1, \dots, 1)/\sum` (so :math:`\mu < 1` at first)
    and ``k`` the number of SA updates so far (1-based). :math:`\mu < 0` is the "bouncy" move
    out of a trap; ``multiplier_clip`` bounds it (the author's ICSGLD code uses ``(-5, 5)``).
    Outside the partition the step is plain SGLD (*Outside the partition* below).

    Choices where the paper, the authors' code and BlackJAX differ:

    * **Index convention.** The multiplier is the backward difference
      :math:`(\log g_J - \log g_{J-1})/\Delta u`, the slope of the piecewise-linear
      :math:`\log\Psi` on the interval ending in bin ``J``, as in the official solver (which
      keeps ``J`` in ``[1, m-1]``); in bin 0 there is no lower neighbour and the slope of bins
      0-1 is used (:math:`J^- = \max(J, 1)`). The SA update and the weights use ``J`` itself.
    * **Energy of the SA step.** The paper updates :math:`g` with
      :math:`J' = J(\hat U(\theta_{new}))` right after the move, which needs a second
      evaluation. Here it is deferred to the start of the next step, which evaluates
      :math:`\hat U(\theta_{new})` anyway for its gradient: the
      sequence of updates is the paper's (SA with the new energy, then a move with the updated
      :math:`g` at that same energy), with one potential and gradient per step, as the
      official code. The SA update and the multiplier thus share one minibatch energy.
    * **SA gain** is :math:`\omega_k g_J^{p}` with ``p = sa_power``; the default ``p = zeta`` is
      the paper's and the official code's :math:`g_J^\zeta`; ``sa_power=1`` is BlackJAX's
      :math:`g_J`. At the fixed point :math:`g_i^{1+\zeta-p} \propto \pi_T(\text{bin } i)`
      (for ``p = zeta``, :math:`g_i = \pi_T(\text{bin } i)`; for ``p = 1``, :math:`g^\zeta
      \propto \pi_T`: flat in energy); the weights :math:`g^\zeta` undo the flattening for any
      ``g``, so the reweighted estimates are consistent either way. Which to use is a matter
      of how far ``g`` must travel: each SA step moves :math:`\log g_J` by about
      :math:`\omega_k g_J^{p-1}`, and the SA steps of a run add up to a fixed budget, so a
      target whose bins span :math:`\Delta` nats of :math:`\pi_T` needs :math:`\log g` to
      span :math:`\Delta` with the paper's gain but only :math:`\Delta/\zeta` with
      ``sa_power=1`` and a large :math:`\zeta` (the flattened target is then flat in energy,
      as with the paper's gain at :math:`\zeta = 1`). For a barrier of tens of nats use a
      large ``zeta`` with ``sa_power=1`` (for a 76-nat barrier at T = 50, ``zeta=20``, so that
      :math:`\log g` spans only 3.8 nats); for barriers of a few nats the paper's gain. See
      docs/methods/contour_sgld.md, "Choosing the bins".
    * **Weights (beyond the paper).** The move above is Langevin dynamics for
      :math:`\exp(-U/T - \zeta\Phi(U))`, where :math:`\Phi` is the continuous, piecewise-linear
      function whose slope on bin ``j`` is the one the multiplier uses,
      :math:`\tilde s_j = (\mu_j - 1)/(\zeta T)` (the clipped :math:`\mu_j` when
      ``multiplier_clip`` is set): :math:`\nabla[U/T + \zeta\Phi(U)] = \mu\nabla U / T`. So
      at a fixed :math:`g` the chain samples :math:`\pi_T e^{-\zeta\Phi(U)}`, and the
      consistent importance weight is :math:`e^{\zeta\Phi(\hat U_k)}`, evaluated *at the
      draw's energy*, with :math:`\Phi(e_1) = \log g_0` and
      :math:`\Phi(u) = \Phi(e_J) + \tilde s_J (u - e_J)` on bin ``J`` (lower edge
      :math:`e_J`), and :math:`\Phi` flat beyond the outer edges, as the dynamics (next
      item). Without clipping,
      :math:`\Phi(e_J) = \log g_{J-1}`: the piecewise-constant :math:`\log g[J]` of the
      paper's weight :math:`g_k[J_k]^\zeta` and this :math:`\Phi` differ inside a bin by up to
      a bin's change of :math:`\log g`, times :math:`\zeta`, and where the multiplier is
      clipped by far more, so the paper's weight is biased when the modes have unequal
      masses, where this one is consistent (see docs/papers.md). The
      draw :math:`\theta_k` gets ``log_weight`` :math:`= \zeta\Phi_k(\hat U(\theta_k))` with
      :math:`g` before the SA update with that energy. The price of consistency is variance:
      the weight tilts with the energy inside a bin, so minibatch energies that scatter by a
      bin width or more (and a steep slope, as in a catch-all bin 0 holding the modes)
      concentrate a chain's weights on few draws; check the weights' effective sample size
      (``1 / sum(softmax(log_weight)**2)``) and prefer larger minibatches for the energy.
      The weight is exact for the continuous-time dynamics at a fixed ``g``; the discretised
      chain (the clipped multiplier scales the gradient step by up to ``max(|clip|)``, and
      :math:`\Phi` has kinks at the bin edges) and the first draws, while ``g`` is still far
      from its limit, add a bias that shrinks with a smaller step and a longer run.
    * **Outside the partition (beyond the paper).** Energies below :math:`e_0` or at or
      above :math:`e_m` take the plain gradient, :math:`\mu = 1`, and a flat :math:`\Phi`,
      continuous at the edge:

      .. math::

          \Phi(u) = \Phi(e_0) \ (u < e_0), \qquad \Phi(u) = \Phi(e_m) \ (u \ge e_m),

      so that :math:`\nabla[U/T + \zeta\Phi(U)] = \nabla U / T = \mu\nabla U/T` there too:
      the dynamics sample :math:`\pi_T e^{-\zeta\Phi(e_0)}` below the partition and
      :math:`\pi_T e^{-\zeta\Phi(e_m)}` above it, and the weight
      :math:`e^{\zeta\Phi(\hat U_k)}`, constant out there, undoes exactly that. The paper and
      the official code extend the multiplier of the outer bins to every energy beyond them
      (and a consistent weight would then extend :math:`\Phi` linearly). That is unsafe by
      default: while ``g`` under-estimates the top bin its multiplier is negative and pushes
      the chain uphill, without limit on a potential that grows without bound, and the linear
      :math:`\Phi` gives a draw far above the partition a weight that takes all the mass
      (examples in docs/methods/contour_sgld.md, "Outside the partition"). With the flat rule
      the chain above the partition is plain SGLD, pulled
      back by the gradient of :math:`U`, and every weight lies within the range of
      :math:`\zeta\Phi` over :math:`[e_0, e_m]`, whatever the energy. With
      ``multiplier_clip`` the slopes inside are the clipped ones and the outside is the same;
      ``bounds`` only rejects moves and does not change :math:`\Phi`. The price: beyond the
      edges nothing is flattened, so the partition must still bracket the barriers
      (``auto_bins`` leaves room above the warmup energies). ``diagnostics()`` reports the
      weights' effective sample size and the run warns when it collapses
      (:func:`weights_ess_threshold`); the draws' check at the end of a run measures the
      effective sample size of the reweighted estimates, weights and autocorrelation
      together, and warns below 5% of the draws (:mod:`.draw_mixing`).

    Parameters
    ----------
    num_bins : int
        ``m >= 2``.
    bin_width : float
        :math:`\Delta u > 0`. Give it with ``min_energy``, or use ``auto_bins``.
    min_energy : float
        :math:`u_{\min}`, the lower edge of bin 0.
    auto_bins : bool
        Place the bins from the stochastic energies seen during warmup: during warmup the kernel
        runs plain SGLD (:math:`\mu = 1`, no SA updates) and collects :math:`\hat U`; at the
        first post-warmup step it fixes :math:`u_{\min} = \min - 0.1 r` and
        :math:`\Delta u = 2.1 r / m` with ``min``, ``max`` and the range ``r`` those of the
        energies of the last half of warmup (:data:`AUTO_SETTLED_FRACTION`), after the chain
        has left its initial values: the bins span ``[min - 0.1 r, max + r]``, and the
        flattened chain climbs up to one range of the target's energies above them. (The
        descent from a random initialisation, hundreds of nats on a BNN, would otherwise set
        the range, and the flattened chain would spend most of its time where the target has
        no mass.) Minibatched (``subsample_size`` or a subsampled plate), the same energies
        also give each chain's minibatch energy noise and the spread of its energies
        (:mod:`~pyro_flat.infer.mcmc.energy_noise`, ``diagnostics()["energy_noise"]``): a chain
        whose noise is above the spread does not flatten (it runs as SGLD, with ``log_weight``
        0; the run warns), since its draws' bins, its ``g`` and its weights would follow the
        noise. The
        partition stays fixed afterwards (also across :meth:`load_state_dict`). Needs
        ``warmup_steps >= 1``. Bins must bracket the energies the chain visits: never-visited
        bins keep their initial value and skew the multiplier (see ``diagnostics()``).
    zeta : float
        :math:`\zeta \ge 0`, the flattening; ``0`` is SGLD.
    omega0 : float
        :math:`\omega_0 \in (0, 1]`, the SA step cap (the authors' toy demo: ``3e-3``).
    sa_power : float, optional
        The power ``p`` of the SA gain :math:`\omega_k g_J^p`; ``None`` (default) is ``zeta``.
    multiplier_clip : (float, float), optional
        Clip :math:`\mu` inside the partition to ``[low, high]`` (:math:`\Phi` follows the
        clipped slopes); ``None`` (default) does not clip. Not needed for safety (outside the
        partition :math:`\mu = 1`), but it bounds the bouncy move and the factor by which
        :math:`\mu` scales the gradient step (see :meth:`stability_limit`).
    vectorized_chains : int, optional
        ``K`` chains in one kernel (an argument of every kernel, see
        :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`): of a model, or of a ``potential_fn``
        that returns ``K`` energies for parameters with a leading dimension ``K``. Each chain
        has its own bins (``auto_bins`` places them from its own warmup energies), ``g``
        (``energy_pdf`` is ``(K, m)``), SA step count, multiplier and box rejections; the
        single chain is the case ``K = 1`` of the same code. Statistics are ``(draws, K)`` in
        ``diagnostics()`` and per chain in :func:`pyro_flat.sample_stats`; reweight each
        chain's draws with its own weights (``reweight(..., chain_dim=...)``).
    bounds : (float, float), optional
        Keep the flat (unconstrained) parameters in the box ``[low, high]^d``: an SG step whose
        move would leave it is rejected and :math:`\theta` stays where it is (the SA update of
        that step is kept), as in the official toy demo. ``None``
        (default): no box. The rejected steps of a run are counted in
        ``diagnostics()["num_rejected"]`` (with ``vectorized_chains``, one per chain and
        rejected step); a start outside the box (or not a number) raises ``ValueError``.
    **kwargs
        The arguments of :class:`SGMCMCKernel` (``model``/``potential_fn``, ``step_size`` on ``U``:
        an SGD learning rate ``lr`` on the mean loss over ``N`` points is ``lr / N``, ...).

    Notes
    -----
    Per-draw statistics, besides the base ones: ``energy`` (:math:`\hat U` at the draw, the
    same minibatch as ``lp``), ``energy_bin`` (its bin) and ``log_weight``. Reweighted
    estimates: ``reweight(values, stats["log_weight"])``. ``diagnostics()`` holds
    ``"energy_pdf"`` (the learned :math:`g`), ``"energy_edges"`` (the ``m + 1`` bin edges),
    ``"num_sa_updates"`` (the SA steps so far), ``"num_rejected"`` (the SG steps rejected
    by ``bounds`` since the run started; a run resumed from a checkpoint continues its count),
    ``"weights_ess"`` (:func:`weights_ess` of the run's ``log_weight``, a list of one per chain
    for vectorised chains), ``"weights_ess_fraction"`` (the same over the draws of a chain)
    and ``"weights_ess_threshold"``; at the end of a run a chain whose weights' ESS is below
    :func:`weights_ess_threshold` (5 draws; half the draws below ten) raises a
    ``RuntimeWarning``.

    Examples
    --------
    >>> import torch
    >>> from pyro.infer import MCMC
    >>> from pyro_flat.infer import ContourSGLD, reweight
    >>> def potential(p):  # two modes at +-2
    ...     x = p["x"]
    ...     return -torch.logaddexp(-8 * (x - 2) ** 2, -8 * (x + 2) ** 2).sum()
    >>> kernel = ContourSGLD(potential_fn=potential, initial_params={"x": torch.tensor(2.0)},
    ...                      step_size=1e-2, num_bins=50, bin_width=0.5, min_energy=-1.0, zeta=1.0)
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> mcmc = MCMC(kernel, num_samples=2000, warmup_steps=100, disable_progbar=True)
    >>> mcmc.run()
    >>> from pyro_flat import sample_stats
    >>> p_left = reweight((mcmc.get_samples()["x"] < 0).double(),
    ...                   sample_stats(mcmc)["log_weight"])

    References
    ----------
    Deng, W., Lin, G. & Liang, F. (2020). A contour stochastic gradient Langevin dynamics
    algorithm for simulations of multi-modal distributions. NeurIPS.
    """

    stat_names = SGMCMCKernel.stat_names + ("energy", "energy_bin", "log_weight")
    supports_adaptation = True
    supports_preconditioner = True

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        num_bins: int,
        bin_width: float | None = None,
        min_energy: float | None = None,
        auto_bins: bool = False,
        zeta: float = 1.0,
        omega0: float = 3e-3,
        multiplier_clip: tuple[float, float] | None = None,
        sa_power: float | None = None,
        bounds: tuple[float, float] | None = None,
        **kwargs: Any,
    ):
        super().__init__(model, step_size, **kwargs)
        self.num_bins = validation.integer_at_least("num_bins", num_bins, 2)
        self.auto_bins = bool(auto_bins)
        if self.auto_bins:
            if bin_width is not None or min_energy is not None:
                raise ValueError("give either auto_bins=True or bin_width and min_energy, not both")
            self._bins_given = (None, None)
        else:
            if bin_width is None or min_energy is None:
                raise ValueError("bin_width and min_energy are required unless auto_bins=True")
            self._bins_given = (
                validation.in_range("min_energy", min_energy, -math.inf, math.inf, closed="()"),
                validation.positive("bin_width", bin_width),
            )
        self.zeta = validation.nonnegative("zeta", zeta)
        self.omega0 = validation.in_range("omega0", omega0, 0.0, 1.0, closed="(]")
        if multiplier_clip is not None:
            try:
                lo, hi = (float(v) for v in multiplier_clip)
            except (TypeError, ValueError):
                raise ValueError(
                    f"multiplier_clip must be None or a pair (low, high), got {multiplier_clip!r}"
                ) from None
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"multiplier_clip must be finite with low < high, got "
                                 f"{multiplier_clip!r}")
            multiplier_clip = (lo, hi)
        self.multiplier_clip = multiplier_clip
        self.sa_power = self.zeta if sa_power is None else validation.nonnegative(
            "sa_power", sa_power)
        if bounds is not None:
            try:
                lo, hi = (float(v) for v in bounds)
            except (TypeError, ValueError):
                raise ValueError(
                    f"bounds must be None or a pair (low, high), got {bounds!r}") from None
            if not lo < hi:  # also rejects nan
                raise ValueError(f"bounds must have low < high, got {bounds!r}")
            bounds = (lo, hi)
        self.bounds = bounds

    # ------------------------------------------------------------------ state

    stat_dtypes = {**SGMCMCKernel.stat_dtypes, "energy_bin": torch.long}
    stat_defaults = {"energy_bin": -1}

    def state_fields(self) -> tuple[StateField, ...]:
        """The chain's state: the learned energy PDF ``g`` (``energy_pdf``), the SA step count,
        the bins (placed at the end of warmup with ``auto_bins``), the warmup energies that
        place them, and the count of steps ``bounds`` rejected. One row per chain (a single
        chain is one): ``g`` is ``(rows, m)``, the others are lists of one Python value per
        chain."""
        rows = self.vectorized_chains or 1

        def per_chain(value: Any) -> Any:
            return [value] * rows

        fields = [
            NOISE,
            StateField("step_grad", "buffer for the multiplied gradient the step moves with",
                       init="scratch"),
            StateField("energy_pdf", "g, the learned energy PDF, (rows, m)",
                       init=self._initial_energy_pdf),
            StateField("num_sa_updates", "SA updates of g so far",
                       init=lambda state: per_chain(0)),
            StateField("min_energy", "lower edge of bin 0 (None until auto_bins places it)",
                       init=lambda state: per_chain(self._bins_given[0])),
            StateField("bin_width", "the bin width (None until auto_bins places it)",
                       init=lambda state: per_chain(self._bins_given[1])),
            StateField("warmup_energies", "energies of warmup, for auto_bins",
                       init=lambda state: [[] for _ in range(rows)]),
            StateField("num_rejected", "SG steps rejected by bounds",
                       init=lambda state: per_chain(0)),
            StateField("energy_noise", "(noise sd, spread sd) of the minibatch energies, "
                       "measured when auto_bins places the bins (None: not measured)",
                       init=lambda state: per_chain(None)),
        ]
        if self.bounds is not None:
            fields.append(StateField("before", "the position before a step that bounds may "
                                     "reject", init="scratch"))
        return tuple(fields)

    def _initial_energy_pdf(self, state: KernelState) -> torch.Tensor:
        self._check_start(state.position)
        g = torch.arange(self.num_bins, 0, -1, dtype=torch.float64)
        g = g / g.sum()
        return g.repeat(self.vectorized_chains or 1, 1)

    def _check_start(self, z: torch.Tensor) -> None:
        if self.bounds is None:
            return
        for c, row in enumerate(z.reshape(-1, z.shape[-1])):
            outside = ~((row >= self.bounds[0]) & (row <= self.bounds[1]))  # nan: outside
            if bool(outside.any()):
                site = next(s for s in self.layout.sites
                            if bool(outside[s.offset : s.stop].any()))
                values = row[site.offset : site.stop][outside[site.offset : site.stop]]
                chain = "" if self.vectorized_chains is None else f" (chain {c})"
                raise ValueError(
                    f"the chain starts outside bounds={self.bounds}: site {site.name!r}{chain} "
                    f"has unconstrained values {values.tolist()[:5]} outside; every step from "
                    "there would be rejected. Start inside the box or widen it"
                )

    @property
    def min_energy(self) -> float | list[float] | None:
        """The lower edge of bin 0: the chain's (placed at the end of warmup with
        ``auto_bins``; a list, one per chain, for vectorised chains), or the one given."""
        if self.state is None:
            return self._bins_given[0]
        return self.outward(self.state.min_energy)

    @property
    def bin_width(self) -> float | list[float] | None:
        """The bin width: the chain's (a list for vectorised chains), or the one given."""
        if self.state is None:
            return self._bins_given[1]
        return self.outward(self.state.bin_width)

    @property
    def _g(self) -> torch.Tensor:
        return self.state.energy_pdf

    @property
    def num_rejected(self) -> int | list[int]:
        """SG steps rejected by ``bounds`` in this chain (a list for vectorised chains);
        continues across a resume."""
        return self.outward(self.state.num_rejected)

    @property
    def bins_fixed(self) -> bool:
        """Whether the energy bins are in place (given, or placed after warmup)."""
        if self.state is None:
            return self._bins_given[1] is not None
        if getattr(self, "_bins_placed_in", None) is self.state:
            return True
        placed = self.state.bin_width[0] is not None
        if placed:  # bins never move once placed
            self._bins_placed_in = self.state
        return placed

    @property
    def energy_edges(self) -> torch.Tensor:
        """The ``m + 1`` edges of the energy bins (after warmup when ``auto_bins``); ``(K,
        m + 1)`` for vectorised chains."""
        if not self.bins_fixed:
            raise RuntimeError("the energy bins are placed at the end of warmup (auto_bins)")
        i = torch.arange(self.num_bins + 1, dtype=torch.float64)
        if self.state is None:
            return self.min_energy + self.bin_width * i
        lo = torch.tensor(self.state.min_energy, dtype=torch.float64).unsqueeze(1)
        return self.outward(lo + torch.tensor(self.state.bin_width,
                                               dtype=torch.float64).unsqueeze(1) * i)

    def _fix_bins(self) -> None:
        """Place each chain's bins from the finite energies it saw in the last
        :data:`AUTO_SETTLED_FRACTION` of warmup (all of warmup if none there is finite), and,
        minibatched, measure their noise against their spread (:mod:`.energy_noise`)."""
        lows, widths, noise = [], [], []
        energies = self.state.warmup_energies
        batches = self.minibatches
        per_epoch = None if batches is None else batches.size // batches.batch_size
        for chain_energies in energies:
            first = int(len(chain_energies) * (1 - AUTO_SETTLED_FRACTION))
            settled = chain_energies[first:]
            u = ([x for x in settled if math.isfinite(x)]
                 or [x for x in chain_energies if math.isfinite(x)])
            if not u:
                raise RuntimeError("auto_bins needs warmup_steps >= 1 with finite energies to "
                                   "place the energy bins")
            lo, hi = min(u), max(u)
            r = max(hi - lo, 1e-6 * max(abs(lo), 1.0))
            lows.append(lo - AUTO_MARGIN_BELOW * r)
            widths.append((1 + AUTO_MARGIN_BELOW + AUTO_MARGIN_ABOVE) * r / self.num_bins)
            if per_epoch is None:
                noise.append(None)
            else:  # from the first epoch in the settled part (warmup starts an epoch)
                start = -(-first // per_epoch) * per_epoch
                noise.append(energy_noise(chain_energies[start:], per_epoch))
        self.state.min_energy, self.state.bin_width = lows, widths
        self.state.energy_noise = noise
        self.state.warmup_energies = [[] for _ in energies]
        self._warn_if_energies_too_noisy()

    def flattens(self) -> list[bool]:
        """Per chain, whether it flattens: ``False`` for a minibatched chain whose energy noise
        is above :data:`~.energy_noise.NOISE_BOUND` times their spread (``auto_bins``), which
        runs as SGLD with ``log_weight`` 0 (see ``auto_bins``)."""
        return [m is None or m[0] <= NOISE_BOUND * m[1] for m in self.state.energy_noise]

    def _warn_if_energies_too_noisy(self) -> None:
        noisy = [(c, m) for c, (m, ok) in enumerate(zip(self.state.energy_noise, self.flattens(),
                                                        strict=True)) if not ok]
        if not noisy:
            return
        which = ("the chain's" if self.vectorized_chains is None else
                 f"{len(noisy)} of {len(self.state.energy_noise)} chains' (chain "
                 + ", ".join(str(c) for c, _ in noisy[:5]) + ("..." if len(noisy) > 5 else "")
                 + ")")
        c, (noise, spread) = max(noisy, key=lambda item: item[1][0] / max(item[1][1], 1e-300))
        warnings.warn(
            f"ContourSGLD: {which} minibatch energies scatter by {noise:.3g} nats (sd) around "
            f"the energy, more than the spread of the target's energies along the chain "
            f"({spread:.3g} nats; chain {c}), measured in warmup: a draw's energy bin would be "
            "mostly noise, and so would the flattening and the weights. Those chains do not "
            "flatten: they run as SGLD, with log_weight 0. Use a larger subsample_size (the "
            "noise falls as 1/sqrt(B)) or the full batch to flatten; see "
            "diagnostics()['energy_noise']",
            RuntimeWarning, stacklevel=2)

    def _observe_energies(self, energies: list[float], active: list[bool]) -> None:
        """With ``auto_bins``: keep warmup energies, place the bins at the first step after."""
        if not self.auto_bins or self.bins_fixed:
            return
        if self.in_warmup:
            for kept, u, ok in zip(self.state.warmup_energies, energies, active, strict=True):
                if ok:
                    kept.append(u)
        else:
            self._fix_bins()

    def bin_of(self, u: float, chain: int | None = None) -> int:
        """The bin ``J(u)`` of an energy (below the first edge: 0, above the last: ``m - 1``)
        in the bins of ``chain`` (vectorised chains)."""
        lo, width = self._bins(chain)
        return _bin(u, lo, width, self.num_bins)

    def _bin_tensors(self) -> tuple[Any, Any]:
        """The bins' lower edges and widths, ``(K,)`` tensors (one row per chain; floats
        before a run)."""
        if self.state is None:
            return self._bins(None)
        lows, widths = self.state.min_energy, self.state.bin_width
        cached = getattr(self, "_bin_tensors_of", None)
        if cached is None or cached[0] is not lows or cached[1] is not widths:
            cached = (lows, widths, torch.tensor(lows, dtype=torch.float64),
                      torch.tensor(widths, dtype=torch.float64))
            self._bin_tensors_of = cached
        return cached[2], cached[3]

    def _bins(self, chain: int | None) -> tuple[float, float]:
        if self.state is None:
            return self.min_energy, self.bin_width
        row = 0 if chain is None else chain
        return self.state.min_energy[row], self.state.bin_width[row]

    # ------------------------------------------------------------------ the step

    def multiplier(self, j: int, chain: int | None = None) -> float:
        """The gradient multiplier :math:`\\mu` in bin ``j`` for the current ``g`` (of
        ``chain``, for vectorised chains)."""
        if self.zeta == 0.0:
            return 1.0
        g = self._g[0 if chain is None else chain]
        jm = max(j, 1)
        return self._multiplier_of_slope(
            (math.log(g[jm]) - math.log(g[jm - 1])) / self._bins(chain)[1])

    def multiplier_at(self, u: float, chain: int | None = None) -> float:
        """The gradient multiplier at the energy ``u``: :meth:`multiplier` of its bin inside
        the partition :math:`[e_0, e_m)`, ``1`` (the plain gradient) outside it."""
        lo, width = self._bins(chain)
        if not 0 <= math.floor((u - lo) / width) < self.num_bins:
            return 1.0
        return self.multiplier(self.bin_of(u, chain), chain)

    def log_weight(self, g: torch.Tensor, u: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        r""":math:`\zeta\Phi(u)` for energies ``u`` in bins ``j`` under the PDF ``g`` (``(m,)``, or
        ``(K, m)`` with one energy per row, in the bins of the respective chain for vectorised
        chains; ``(m,)`` in chain 0's): the log importance weight (class docstring). Outside
        the partition :math:`\Phi` is flat: an energy below :math:`e_0` gets
        :math:`\Phi(e_0)`, one at or above :math:`e_m` gets :math:`\Phi(e_m)`."""
        if self.zeta == 0.0:
            return torch.zeros(u.shape, dtype=torch.float64)
        lo, width = self._bin_tensors() if g.dim() > 1 else self._bins(None)
        u = torch.minimum(torch.maximum(u.double(), torch.as_tensor(lo, dtype=torch.float64)),
                          torch.as_tensor(lo + width * self.num_bins, dtype=torch.float64))
        if torch.is_tensor(width):  # vectorised chains: each row in its own bins
            width = width.unsqueeze(-1)
        log_g = g.log()
        slope = (log_g[..., 1:] - log_g[..., :-1]) / width  # bins 1 .. m-1
        slope = torch.cat([slope[..., :1], slope], dim=-1)  # bin 0 moves with bins 0-1
        zt = self.zeta * self.temperature
        if self.multiplier_clip is not None and zt > 0:
            slope = ((1.0 + zt * slope).clamp(*self.multiplier_clip) - 1.0) / zt
        # Phi at the lower edges e_0 .. e_{m-1}, with Phi(e_1) = log g_0
        rises = torch.cumsum(slope[..., 1:-1] * width, dim=-1)
        at_e1 = log_g[..., :1]
        edges = torch.cat([at_e1 - slope[..., :1] * width, at_e1, at_e1 + rises], dim=-1)
        j = j.unsqueeze(-1)
        width_of_row = width.squeeze(-1) if torch.is_tensor(width) else width
        lower = lo + width_of_row * j.squeeze(-1).double()
        phi = edges.gather(-1, j).squeeze(-1) + slope.gather(-1, j).squeeze(-1) * (u - lower)
        flat = torch.tensor(self.flattens() if self.state is not None else [True])
        if g.dim() == 1:  # chain 0's
            flat = flat[0]
        return torch.where(flat, self.zeta * phi, 0.0)  # a chain that does not flatten: 0

    def stability_limit(self, curvature: float) -> float:
        r"""The Langevin limit at the curvature times the largest multiplier the clip allows
        (the multiplier scales the gradient; unclipped, it is taken as 1: set
        ``multiplier_clip`` when adapting with a large :math:`\zeta`)."""
        top = 1.0 if self.multiplier_clip is None else max(1.0, *map(abs, self.multiplier_clip))
        return adaptation.langevin_limit(curvature * top)

    def sa_step_size(self, k: int) -> float:
        """:math:`\\omega_k = \\min(\\omega_0, 10/(k^{0.8} + 100))`."""
        return min(self.omega0, 10.0 / (k**0.8 + 100.0))

    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        z, grad = state.position, estimate.step_grad
        active = None if self.active_chains is None else self.active_chains.tolist()
        if self.auto_bins and not self.bins_fixed:
            energies = estimate.energy.reshape(-1).tolist()
            self._observe_energies(energies, active or [True] * len(energies))
        if self.bins_fixed:
            mults = self._sa_step(estimate.energy, active)
            if any(m != 1.0 for m in mults):
                grad = torch.mul(grad, torch.tensor(mults, dtype=grad.dtype).view(
                    *z.shape[:-1], 1), out=state.step_grad)
        if self.bounds is not None:
            state.before.copy_(z)
        langevin_step_(z, grad, step_size, self.temperature, state.noise, metric=self.metric)
        if self.bounds is not None:
            outside = ~((z >= self.bounds[0]) & (z <= self.bounds[1])).all(-1)
            if bool(outside.any()):
                z.copy_(torch.where(outside.unsqueeze(-1), state.before, z))
                flags = outside.reshape(-1).tolist()
                self.state.num_rejected = [
                    n + int(out and (active is None or active[c]))
                    for c, (n, out) in enumerate(zip(self.state.num_rejected, flags, strict=True))]

    def _sa_step(self, energy: torch.Tensor, active: list[bool] | None) -> list[float]:
        """The SA update of each active chain's ``g`` with its energy; returns each chain's
        gradient multiplier (1 for a chain that skips the step). Bins, ``g`` and the
        multiplier's inputs are tensor operations over the chains (whose float64 arithmetic is
        Python's); the powers and logarithms are Python's, chain by chain, so that one chain
        computes exactly what it always has."""
        g = self.state.energy_pdf
        u = energy.double().reshape(-1)
        if active is not None:  # a chain that skips the step may have a non-finite energy
            u = torch.where(torch.tensor(active), u, 0.0)
        j = self.bins_of(u)
        counts = [n + 1 if active is None or active[c] else n
                  for c, n in enumerate(self.state.num_sa_updates)]
        self.state.num_sa_updates = counts
        omega = {n: self.sa_step_size(n) for n in set(counts)}
        rows = torch.arange(len(counts))
        gains = [omega[n] * gj ** self.sa_power for n, gj in zip(counts, g[rows, j].tolist(),
                                                                    strict=True)]
        if active is not None:
            gains = [x if ok else 0.0 for x, ok in zip(gains, active, strict=True)]
        gain = torch.tensor(gains, dtype=g.dtype)
        g.mul_((1.0 - gain).unsqueeze(1))
        g[rows, j] += gain
        if self.zeta == 0.0:
            return [1.0] * len(counts)
        jm = j.clamp(min=1)
        widths = self.state.bin_width
        mults = [self._multiplier_of_slope((math.log(hi) - math.log(lo)) / w)
                 for hi, lo, w in zip(g[rows, jm].tolist(), g[rows, jm - 1].tolist(), widths,
                                      strict=True)]
        inside = self.inside_partition(u).tolist()  # outside: the plain gradient
        inside = [ok and flat for ok, flat in zip(inside, self.flattens(), strict=True)]
        if active is not None:
            inside = [ok and a for ok, a in zip(inside, active, strict=True)]
        return [m if ok else 1.0 for m, ok in zip(mults, inside, strict=True)]

    def _multiplier_of_slope(self, slope: float) -> float:
        mult = 1.0 + self.zeta * self.temperature * slope
        if self.multiplier_clip is not None:
            mult = min(max(mult, self.multiplier_clip[0]), self.multiplier_clip[1])
        return mult

    def bins_of(self, u: torch.Tensor) -> torch.Tensor:
        """:meth:`bin_of` of each of a tensor of energies (one per chain for vectorised
        chains, each in its own bins)."""
        lo, width = self._bin_tensors()
        j = torch.floor((u.double() - lo) / width)
        return j.clamp_(0, self.num_bins - 1).long()

    def inside_partition(self, u: torch.Tensor) -> torch.Tensor:
        """Whether each energy lies in :math:`[e_0, e_m)`, the span of the bins (one energy
        per chain for vectorised chains, each in its own bins); the same arithmetic as
        :meth:`bins_of`, so that an energy is inside exactly when its unclipped bin is."""
        lo, width = self._bin_tensors()
        t = torch.floor((u.double() - lo) / width)
        return (t >= 0) & (t <= self.num_bins - 1)

    # ------------------------------------------------------------------ statistics

    def statistics_at_draw(self, energy: list[float]) -> dict[str, list[Any]]:
        """``energy``, ``energy_bin`` and ``log_weight`` of the draw, with ``g`` before the SA
        update that uses this energy (lists, one per chain)."""
        if self.auto_bins and not self.bins_fixed and not self.in_warmup:
            self._fix_bins()
        u = torch.tensor(energy, dtype=torch.float64).reshape(-1)
        finite = torch.isfinite(u)
        stats: dict[str, Any] = {"energy": u.tolist()}
        if not self.bins_fixed:
            stats["log_weight"] = [-math.inf] * len(u)  # no weights before the bins are placed
        else:
            j = self.bins_of(torch.where(finite, u, 0.0))
            weight = self.log_weight(self._g, torch.where(finite, u, 0.0), j)
            stats["energy_bin"] = torch.where(finite, j, -1).tolist()
            stats["log_weight"] = torch.where(finite, weight, -math.inf).tolist()
        return stats

    def diagnostics(self) -> dict[str, Any]:
        out = super().diagnostics()
        out["energy_pdf"] = self.outward(self._g.clone())
        out["energy_edges"] = self.energy_edges if self.bins_fixed else None
        out["num_sa_updates"] = self.outward(self.state.num_sa_updates)
        out["num_rejected"] = self.num_rejected
        out["energy_noise"] = self.outward(
            [None if m is None else {"noise": m[0], "spread": m[1]}
             for m in self.state.energy_noise])
        out.update(self._weights_ess(out["sample_stats"]
                                     or self.recorder.tensors(["log_weight"])))
        return out

    def _weights_ess(self, stats: dict[str, torch.Tensor]) -> dict[str, Any]:
        """``weights_ess`` (per chain: a list for vectorised chains), ``weights_ess_fraction``
        (of the chain's draws) and ``weights_ess_threshold`` (below it, the run warns)."""
        lw = stats.get("log_weight")
        n = 0 if lw is None else int(lw.shape[0])
        ess = weights_ess(lw) if n else torch.zeros(lw.shape[1:] if lw is not None else ())
        frac = ess / n if n else torch.full_like(ess, math.nan)
        return {"weights_ess": ess.tolist(), "weights_ess_fraction": frac.tolist(),
                "weights_ess_threshold": weights_ess_threshold(n)}

    def importance_log_weights(self) -> torch.Tensor | None:
        """The run's ``log_weight`` per draw: the draws' check at the run's end measures the
        ESS of the reweighted estimates (:mod:`.draw_mixing`). ``None`` at ``zeta = 0``."""
        if self.zeta == 0.0:
            return None
        return self.recorder.tensors(["log_weight"]).get("log_weight")

    def cleanup(self) -> None:
        """End of a run: the base class's checks, then a ``RuntimeWarning`` when a chain's
        importance weights collapsed (:func:`weights_ess_threshold`)."""
        ended = self.state is None or self.checkpoints.run_ended
        super().cleanup()
        log_weight = None if ended else self.importance_log_weights()
        if log_weight is None or len(log_weight) == 0:
            return
        n = int(log_weight.shape[0])
        threshold = weights_ess_threshold(n)
        ess = weights_ess(log_weight).reshape(-1).tolist()
        low = [(c, e) for c, e in enumerate(ess) if e < threshold]
        if not low:
            return
        if self.vectorized_chains is None:
            where, which = "", f"is {low[0][1]:.3g} of {n} draws"
        else:
            shown = ", ".join(f"chain {c}: {e:.3g}" for c, e in low[:5])
            more = f" and {len(low) - 5} more" if len(low) > 5 else ""
            where = f" in {len(low)} of {len(ess)} chains"
            which = f"of {n} draws per chain is {shown}{more}"
        warnings.warn(
            f"ContourSGLD: the importance weights collapsed{where}: their effective sample "
            f"size 1/sum(softmax(log_weight)**2) {which}, below the threshold {threshold:.3g} "
            f"(min({WEIGHTS_ESS_FLOOR:g}, draws / 2)): reweighted estimates rest on a few "
            "draws. Check that the energy bins bracket the visited "
            "energies (sample_stats 'energy' against diagnostics()['energy_edges']), or use a "
            "smaller zeta, a larger minibatch or a longer run",
            RuntimeWarning,
            stacklevel=2,
        )


def weights_ess(log_weight: torch.Tensor) -> torch.Tensor:
    r"""The effective sample size of self-normalised importance weights,
    :math:`1/\sum_k \mathrm{softmax}(\log w)_k^2`, over the draws (dimension 0), one per
    chain for ``(draws, chains)``; ``0`` for a chain without a finite weight.

    It ignores the autocorrelation of the draws: it says how many of the draws the weights
    keep, not how many independent ones there are (Kong, 1992).

    Examples
    --------
    >>> import torch
    >>> float(weights_ess(torch.zeros(12)))  # equal weights: every draw counts
    12.0
    >>> round(float(weights_ess(torch.tensor([0.0, 0.0, 884.0]))), 6)  # one draw takes all
    1.0
    """
    lw = torch.as_tensor(log_weight).double()
    finite = torch.isfinite(lw).any(0)
    w = torch.softmax(torch.where(finite, lw, 0.0), 0)
    return torch.where(finite, 1.0 / w.square().sum(0), 0.0)


def weights_ess_threshold(num_draws: int) -> float:
    r"""Below this weights' ESS a chain's weights have collapsed and the run warns:
    :math:`\min(5, n/2)` for :math:`n` draws (:data:`WEIGHTS_ESS_FLOOR`).

    Why an absolute floor and not a fraction of the draws: the weights undo the flattening,
    so a healthy run with a large :math:`\zeta` spends most of its draws at energies that
    carry little mass, and its ESS is a small fraction of the draws by design, and stays so
    however long it runs; a fraction would warn on every such run. A collapse is different:
    one or two draws carry the whole estimate (see docs/methods/contour_sgld.md, "Effective
    sample size of the weights").
    Below 5 effective draws a reweighted mean rests on a handful of draws, and its error
    cannot be judged from the weights: the variance of a self-normalised weighted mean is
    about :math:`\mathrm{Var}_\pi(f)/\mathrm{ESS}` (Kong, 1992) only when the ESS is large
    enough for that approximation, and a standard deviation estimated from :math:`e`
    effective draws has a relative error of about :math:`1/\sqrt{2(e - 1)}`, over a third
    below 5. A run of fewer than ten draws warns below half of them.
    """
    return min(WEIGHTS_ESS_FLOOR, num_draws / 2)


def _bin(u: float, min_energy: float, bin_width: float, num_bins: int) -> int:
    return min(max(math.floor((u - min_energy) / bin_width), 0), num_bins - 1)


def reweight(
    values: torch.Tensor,
    log_weight: torch.Tensor,
    method: str = "weighted",
    *,
    num_samples: int | None = None,
    generator: torch.Generator | None = None,
    chain_dim: int | None = None,
) -> torch.Tensor:
    r"""Estimates under the original target from ContourSGLD draws and their ``log_weight``.

    Parameters
    ----------
    values : torch.Tensor
        ``f(theta_k)``, with the leading dimensions of ``log_weight`` (e.g. ``(draws, ...)`` or
        ``(chains, draws, ...)``).
    log_weight : torch.Tensor
        The per-draw statistic ``log_weight`` (shape ``(draws,)``, ``(chains, draws)``, or
        ``(draws, chains)`` for ``vectorized_chains``).
    method : {"weighted", "resample"}
        ``"weighted"``: :math:`\sum_k \mathrm{softmax}(\log w)_k f(\theta_k)`. ``"resample"``:
        unbiased systematic resampling (one uniform :math:`u`, positions :math:`(u + i)/n`),
        returning ``num_samples`` (default: the number of draws) equally weighted values; each
        draw appears :math:`\lfloor n w_k \rfloor` or :math:`\lceil n w_k \rceil` times.
    generator : torch.Generator, optional
        For the uniform of ``"resample"`` (default: torch's global one).
    chain_dim : int, optional
        ``None`` (default): all draws are pooled as one concatenated run, with the weights
        :math:`\mathrm{softmax}(\log w)` over all of them. An index of a dimension of
        ``log_weight``: the draws of each chain along it are self-normalised within the chain
        and every chain gets mass ``1 / chains``. Both are consistent for chains that learned
        their own ``g``: pooled, each chain's draws enter numerator and denominator with the
        same normaliser :math:`1/Z_c` of its flattened target, so the pooled ratio still
        tends to the expectation under :math:`\pi_T`. They differ in their errors. Pooled,
        with a large :math:`\zeta`, small differences between the chains' ``g`` can let one
        chain take almost all the weight (large variance). Per chain, the estimate is a mean
        of ratios, each biased by about one over the number of independent stretches in its
        chain: with chains that cross between modes only a few times it leans towards the
        flattened chain's own proportions (docs/methods/contour_sgld.md gives an example).
        Pool short chains; use ``chain_dim`` for long ones with a large :math:`\zeta`.

    Returns
    -------
    torch.Tensor
        ``"weighted"``: the estimate, of shape ``values.shape[log_weight.dim():]``;
        ``"resample"``: ``num_samples`` resampled values.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.infer.mcmc.contour import reweight
    >>> values = torch.tensor([0.0, 1.0, 1.0])
    >>> float(reweight(values, torch.tensor([1.0, 1.0, 2.0]).log()))  # weights 1, 1, 2
    0.75
    >>> lw = torch.tensor([[0.0, 5.0], [0.0, 5.0]])  # (draws, chains): chain 1 has larger g
    >>> float(reweight(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), lw, chain_dim=1))
    0.75
    """
    log_weight = torch.as_tensor(log_weight)
    lead = log_weight.dim()
    if tuple(values.shape[:lead]) != tuple(log_weight.shape):
        raise ValueError(f"values of shape {tuple(values.shape)} do not start with the shape "
                         f"{tuple(log_weight.shape)} of log_weight")
    if not torch.isfinite(log_weight).any():
        raise ValueError("log_weight has no finite entry")
    if chain_dim is None:
        w = torch.softmax(log_weight.reshape(-1).double(), 0)
    else:
        if not -lead <= chain_dim < lead:
            raise ValueError(f"chain_dim must index a dimension of log_weight (of shape "
                             f"{tuple(log_weight.shape)}), got {chain_dim}")
        lw = log_weight.double().movedim(chain_dim, 0)
        if not torch.isfinite(lw.reshape(lw.shape[0], -1)).any(1).all():
            raise ValueError("a chain has no finite log_weight")
        w = torch.softmax(lw.reshape(lw.shape[0], -1), 1) / lw.shape[0]
        w = w.reshape(lw.shape).movedim(0, chain_dim).reshape(-1)
    vals = values.reshape(w.shape[0], *values.shape[lead:])
    if method == "weighted":
        w = w.reshape(-1, *([1] * (vals.dim() - 1)))
        return (w * vals.double()).sum(0).to(values.dtype if values.is_floating_point()
                                             else torch.float64)
    if method == "resample":
        n = len(w) if num_samples is None else validation.integer_at_least(
            "num_samples", num_samples, 1)
        u = torch.rand((), dtype=torch.float64, generator=generator)
        positions = (u + torch.arange(n, dtype=torch.float64)) / n
        cdf = torch.cumsum(w, 0)
        cdf[-1] = 1.0
        idx = torch.searchsorted(cdf, positions, right=True).clamp_(max=len(w) - 1)
        return vals[idx]
    raise ValueError(f"method must be 'weighted' or 'resample', got {method!r}")
