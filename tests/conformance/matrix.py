r"""The conformance matrix: every model of the zoo through every kernel, data mode, step mode
and chain mode, each cell checked against NUTS or the exact posterior.

A cell is data (:class:`Cell`: model, kernel, data mode, step mode, chains); :func:`run_cell`
executes any cell and :func:`classify` turns its result into ``pass``, ``expected-error``,
``known-limitation`` (a check a kernel fails by its design, and warns of), ``known-broken``,
``fixed`` (a known-broken cell that now meets its check), ``fail`` or ``error``.

**Data modes.** ``full``: the full-batch model, exact gradients. ``plate``: the model written
with ``pyro.plate("data", N, subsample_size=B)``. ``subsample``: the full-batch model with the
kernel's ``subsample_size=B``. ``B`` is about ``N / 8`` (``SETTINGS``).

**Step modes.** ``given``: the step size below. ``adapted``: no ``step_size`` (warmup chooses
it; L2E uses its own rule :math:`\sqrt{\text{step\_mult}/N}`), every other argument at the
kernel's default except those a kernel requires (``eta``, ``num_bins``, the cycle), and the
same thinning as ``given``.

**Chains.** ``single``: one chain; ``vectorized``: ``vectorized_chains=4``.

**Given step sizes** come from the curvature :math:`\lambda` of the potential at the posterior
(the median largest Hessian eigenvalue at NUTS draws, ``reference.json``): a Langevin step of
:math:`\epsilon = f \cdot 2/\lambda` with :math:`f` = ``GIVEN_FRACTION`` = 0.1 of the
stability limit; with minibatches :math:`f/(1 + N/B)`, because the minibatch gradient noise of
a likelihood whose per-point gradients have the Fisher information as covariance (about the
Hessian) adds :math:`\epsilon N/(2B)\,\lambda_i` to the relative variance of direction
:math:`i`, as the discretisation adds :math:`\epsilon\lambda_i/2`: dividing by
:math:`1 + N/B` keeps their sum at the full-batch value. Minibatched cells therefore run
``1 + N/B`` times more steps per draw. Per kernel:

* SGLD, ContourSGLD, SASGLD, EntropyMCMC: :math:`\epsilon`.
* SGHMC: unit mass, friction :math:`C = \alpha/\epsilon_h` with a per-step momentum decay
  :math:`\alpha` = ``SGHMC_DECAY`` = 0.1 (SGD momentum 0.9), and
  :math:`\epsilon_h = \sqrt{\alpha\epsilon}`, so that its overdamped limit, a Langevin step of
  :math:`\epsilon_h^2/\alpha = \epsilon`, is SGLD's.
* CyclicalSGLD: :math:`\epsilon_0 = 2\epsilon` (the cosine cycle's mean is :math:`\epsilon`),
  cycles of ``4 * thin`` steps, ``exploration_fraction=0.25``, 3 draws per cycle.
* EntropyMCMC: ``eta`` = 40 full-batch given steps (the authors' :math:`\epsilon/\eta = 1/40`).
* ContourSGLD: ``num_bins=20``, ``auto_bins=True``, every other argument at its default;
  estimates are reweighted with ``log_weight`` (each chain self-normalised).
* SASGLD: ``rho`` = :math:`0.2/\sqrt{\lambda}` (see its tilt below).
* L2E: the shipped meta-parameters and the step its own rule chooses,
  :math:`\sqrt{2/N}` (the learned kinetic energy reads features normalised per site, so
  SGHMC's stability limit does not carry over).

**The check** of each summary statistic ``s`` with reference mean :math:`m`, sd :math:`\sigma`
and Monte Carlo errors :math:`se_{ref}` (of the mean) and :math:`se^{sd}_{ref}` (of the sd):

.. math:: |\hat m - m| \le z\sqrt{se^2 + se_{ref}^2} + b\,\sigma, \qquad
          |\hat\sigma - \sigma| \le z\sqrt{(se^{sd})^2 + (se^{sd}_{ref})^2} + b\,\sigma

with :math:`z` = ``Z`` = 4, :math:`se = \hat\sigma/\sqrt{\mathrm{ESS}}` from the run's bulk ESS
(ArviZ), :math:`se^{sd}` from the ESS of the squared deviations, and the bias allowance
:math:`b` (in posterior sds) of :func:`bias_allowance`. A check whose Monte Carlo part
:math:`z\sqrt{\cdot}` exceeds ``MAX_MC_TOLERANCE`` posterior sds (1 for slow cells, 1.5 for
fast ones) fails as *inconclusive*: too few effective draws to detect a shift of that size.

**Bias allowances** (:func:`bias_allowance`). For a Gaussian target the Langevin chain at step
:math:`\epsilon` inflates the variance of the direction of curvature :math:`\lambda_i` by
:math:`1 + \delta_i`, :math:`\delta_i = \epsilon\lambda_i/(2 - \epsilon\lambda_i) \le
\delta(f) = f/(1 - f)` at a fraction :math:`f` of the stability limit. By Cauchy-Schwarz the
mean of any statistic moves by at most its sd times :math:`\sqrt{\chi^2(\pi_\epsilon\|\pi)}`,
and for these Gaussians :math:`\chi^2 \approx \sum_i \delta_i^2/2 \le K\delta(f)^2/2` when at
most ``K_STIFF`` = 10 directions (or the number of parameters, if fewer) lie near the top of
the spectrum: :math:`b = \sqrt{K/2}\,\delta(f)`, 0.25 at the given :math:`f = 0.1` and 0.56
at the adapted :math:`f = 0.2` (the kernels' ``stability_fraction``; 0.14 and 0.31 for the
three parameters of ``linreg``); CyclicalSGLD's cycle starts at
:math:`2\epsilon` (:math:`f = 0.2`) in both modes; EntropyMCMC's coupling adds
:math:`\epsilon/(2\eta) = 1/80` to :math:`f` given, 1/40 adapted. Targets that are not the
posterior:

* EntropyMCMC: the :math:`\theta`-marginal of its joint target is the posterior itself (the
  guide's draws, :math:`\theta_a`, are left out).
* ContourSGLD: samples a flattened target; the ``log_weight`` reweighting is consistent for the
  posterior, so the same allowance applies.
* SASGLD: the sharpness-aware target :math:`\propto e^{-U(\theta + \rho g/\|g\|)}
  \approx \pi\, e^{-\rho\|\nabla U\|}`, a tilt of the posterior; by the same Cauchy-Schwarz
  bound a mean moves by at most :math:`\sigma\rho\,\mathrm{sd}(\|\nabla U\|) \le
  \sigma\rho\sqrt{\lambda}` (Poincare: :math:`\|\nabla U\|` is :math:`\sqrt{\lambda}`-Lipschitz
  in the posterior's units), so ``rho`` = :math:`0.2/\sqrt\lambda` adds ``SASGLD_TILT`` = 0.2.
* L2E: a meta-learned sampler whose invariant law is not known (its learned kinetic energy is
  not constrained to be one); the matrix allows ``L2E_ALLOWANCE`` = 1 posterior sd on the
  mean and ``L2E_SD_ALLOWANCE`` = 0.5 on the sd: "within a posterior sd of the posterior,
  with a spread between half and one and a half times the posterior's". On a full batch it
  does not meet it (sds of 0.01-0.1 times the posterior's, ``LIMITATIONS``), and warns; on
  the minibatched networks it is too narrow too (sds 0.07-0.5 of NUTS's), which the draws'
  configurational temperature shows and warns of (``LIMITATIONS``).

``cnn_train`` (BatchNorm with batch statistics, Dropout on) has no posterior to compare with:
its cells check only that the run completes with finite draws.

**The compiled potential** (``PYRO_FLAT_CONFORMANCE_COMPILE=auto``, ``benchmarks/conformance.py
--compile auto``): every kernel gets ``compile="auto"`` instead of the default ``False``, so a
model whose structure pyro_flat reads (a ``BNN`` with a built-in likelihood,
:func:`~pyro_flat.target.network_potential.read_network`) runs the compiled potential where
its trial finds it faster, and any other model the eager path. The update and every other
setting are the same; the compiled potential is checked against the eager one at the chain's
start, and the draws equal the eager path's to float rounding. It serves the slow cells of the
small networks, whose eager SG step is mostly Pyro's per-site overhead (4-16 times faster
compiled). What a cell ran is in its ``settings["compile"]``.

**Export.** Every cell also exports its run with :func:`pyro_flat.to_arviz`, as a user would,
and checks that each observed site's log-likelihood holds one value per data point and that
the export left a module model's buffers and training flags as they were.

**Budgets.** ``slow``: 100 warmup draws and 200 draws per vectorised chain (a single chain
runs 4 times the draws, the same total) at the model's ``thin`` steps per draw; ``fast`` (the
CI cells, ``linreg``): 25 and 100 at ``fast_thin``. A cell with an inconclusive check continues
its chains (bitwise, from the kernel's checkpoint, no further warmup), doubling its draws, until
every check is conclusive or it holds ``MAX_DRAWS_FACTOR`` = 8 times the budget's draws. Whether
it continues depends only on the ESS (the Monte Carlo part of the tolerances), never on how far
an estimate is from its reference, and the continued chains are bitwise those of one longer
run: a continued cell is checked as a run that asked for all its draws at the start would be.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import time
import warnings
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import arviz as az
import numpy as np
import pyro
import torch
from pyro.infer import MCMC

import pyro_flat
from pyro_flat.infer import (
    L2E,
    SASGLD,
    SGHMC,
    SGLD,
    ContourSGLD,
    CyclicalSGLD,
    EntropyMCMC,
)
from pyro_flat.infer.mcmc import registry

from .models import PROBLEMS, Problem

#: Every registered kernel (:data:`pyro_flat.infer.mcmc.registry.KERNELS`); a new one needs its
#: settings in :func:`make_kernel`.
KERNELS = tuple(registry.KERNELS)
DATA_MODES = ("full", "plate", "subsample")
STEP_MODES = ("given", "adapted")
CHAIN_MODES = ("single", "vectorized")
#: ``vectorized_chains`` of the vectorised cells.
NUM_VECTORIZED = 4

#: The environment variable that sets the kernels' ``compile=`` (``"off"``: the default
#: ``False``; ``"auto"``); see the module's text.
COMPILE_VARIABLE = "PYRO_FLAT_CONFORMANCE_COMPILE"
COMPILE_MODES = {"off": False, "auto": "auto"}

#: Standard errors of the check (a false failure of one check: about 6e-5 for a Gaussian).
Z = 4.0
#: The given step's fraction of the Langevin stability limit (full batch).
GIVEN_FRACTION = 0.1
#: The adapted step's fraction: the kernels' default ``stability_fraction``.
ADAPTED_FRACTION = 0.2
#: At most this many directions near the top of the spectrum (bias allowance).
K_STIFF = 10
#: SGHMC's momentum decay per given step, ``step_size * friction / mass``.
SGHMC_DECAY = 0.1
#: EntropyMCMC's ``eta`` in full-batch given steps.
ENTROPY_ETA_STEPS = 40
#: ContourSGLD's energy bins (placed by ``auto_bins``).
CONTOUR_BINS = 20
#: SASGLD's tilt allowance in posterior sds; ``rho = SASGLD_TILT / sqrt(curvature)``.
SASGLD_TILT = 0.2
#: L2E's allowance on the mean and on the sd, in posterior sds (stated before any run).
L2E_ALLOWANCE = 1.0
L2E_SD_ALLOWANCE = 0.5
#: L2E's given step is ``sqrt(L2E_STEP_MULT / N)``, its own rule's value.
L2E_STEP_MULT = 2.0
#: The largest Monte Carlo part of a tolerance, in posterior sds, for a conclusive check.
MAX_MC_TOLERANCE = {"slow": 1.0, "fast": 1.5}
#: An inconclusive cell continues its chains, doubling its draws, up to this many times the
#: budget's draws.
MAX_DRAWS_FACTOR = 8


@dataclass(frozen=True)
class Setting:
    """Sampling settings of one model: minibatch size, SG steps per draw on the full batch
    (minibatched cells take ``1 + N/B`` times more), and warmup draws and draws per chain of
    the slow and the fast budget (``fast_thin``: the fast budget's steps per draw, default
    ``thin``). A single chain runs ``NUM_VECTORIZED`` times the draws of one vectorised
    chain, so that both cells check the same number of draws."""

    batch: int
    thin: int
    warmup: int = 100
    draws: int = 200
    fast_thin: int | None = None
    fast_warmup: int = 25
    fast_draws: int = 100


#: Per model. ``thin`` gives the slowest statistic of a full-batch SGLD run at the given step an
#: ESS of about a tenth of the draws or more (pilot runs of 4 x 200 draws, by hand), enough for
#: a conclusive check (Monte Carlo part under one posterior sd) with the slow budget.
SETTINGS: dict[str, Setting] = {
    "linreg": Setting(batch=25, thin=5, fast_thin=2),
    "linreg_col": Setting(batch=25, thin=5, fast_thin=2),
    "two_outputs": Setting(batch=25, thin=40),
    "dirichlet_lkj": Setting(batch=25, thin=40),
    "horseshoe": Setting(batch=25, thin=50),
    "mlp_hier": Setting(batch=20, thin=200),
    "bnn_categorical": Setting(batch=15, thin=50),
    "bnn_bernoulli": Setting(batch=25, thin=100),
    "bnn_homoskedastic": Setting(batch=25, thin=100),
    "bnn_heteroskedastic": Setting(batch=20, thin=100),
    "cnn": Setting(batch=19, thin=150),
    "cnn_train": Setting(batch=19, thin=20),  # runs only: no mixing needed
    "float64": Setting(batch=20, thin=200),
    "bnn_col": Setting(batch=20, thin=200),
}


@dataclass(frozen=True, order=True)
class Cell:
    """One cell: ``model/kernel/data/step/chains``."""

    model: str
    kernel: str
    data: str
    step: str
    chains: str

    @property
    def id(self) -> str:
        return "/".join((self.model, self.kernel, self.data, self.step, self.chains))

    def __str__(self) -> str:
        return self.id

    @classmethod
    def parse(cls, cell_id: str) -> Cell:
        return cls(*cell_id.split("/"))


def all_cells(models: Iterable[str] | None = None) -> list[Cell]:
    """Every cell of the matrix (of ``models``), in a fixed order."""
    return [Cell(m, k, d, s, c) for m in (models or PROBLEMS) for k in KERNELS
            for d in DATA_MODES for s in STEP_MODES for c in CHAIN_MODES]


#: Fast cells that CI runs with the slow budget, a longer check of the adapted SGHMC (about
#: 20 s on ``linreg``). They were put there when the default friction, 1, needed thousands of
#: steps of warmup to shed the start's energy; both pass the fast budget now, at friction 1
#: and at today's default.
FAST_AT_SLOW_BUDGET = ("linreg/SGHMC/full/adapted/vectorized",
                       "linreg/SGHMC/plate/adapted/vectorized")


def budget_in_ci(cell: Cell) -> str:
    """The budget a fast cell runs with in CI (``"fast"`` but for ``FAST_AT_SLOW_BUDGET``)."""
    return "slow" if cell.id in FAST_AT_SLOW_BUDGET else "fast"


def fast_cells() -> list[Cell]:
    """The cells CI runs, with the fast budget (about 2 minutes on 2 cores), all on ``linreg``
    (exact posterior, the cheapest model) unless said: every kernel in every data mode with
    the given step, vectorised (but L2E on the full batch, whose meta-learned steps need far
    more than the fast budget to reach the mode); every kernel adapted on the full batch,
    vectorised (SGHMC with the slow budget, ``FAST_AT_SLOW_BUDGET``); one chain for SGLD
    (full, plate) and SGHMC (plate); the adapted SGLD and SGHMC minibatched by the plate
    (issue 31, item 1); L2E adapted on the full batch, one chain (a known limitation: it must
    warn); the error cells (instant): the ``(N, 1)`` targets of ``linreg_col`` (item 4); and
    SGLD on the full batch of
    ``two_outputs`` (two observed sites) and ``dirichlet_lkj`` (simplex and correlation
    latents)."""
    cells = [Cell("linreg", k, d, "given", "vectorized") for k in KERNELS for d in DATA_MODES
             if (k, d) != ("L2E", "full")]
    cells += [Cell("linreg", k, "full", "adapted", "vectorized") for k in KERNELS]
    cells += [Cell("linreg", k, d, "given", "single")
              for k, d in (("SGLD", "full"), ("SGLD", "plate"), ("SGHMC", "plate"))]
    cells += [Cell("linreg", k, "plate", "adapted", "vectorized") for k in ("SGLD", "SGHMC")]
    cells += [Cell("linreg", "L2E", "full", "adapted", "single")]
    cells += [Cell("linreg_col", "SGLD", d, "given", "vectorized") for d in ("full", "plate")]
    cells += [Cell(m, "SGLD", "full", "given", "vectorized")
              for m in ("two_outputs", "dirichlet_lkj")]
    return list(dict.fromkeys(cells))


# --------------------------------------------------------------------------- expectations


@dataclass(frozen=True)
class Expected:
    """A cell that must raise ``error`` with a message matching ``match``."""

    error: type[BaseException]
    match: str
    reason: str


@dataclass(frozen=True)
class Broken:
    """A cell that fails today because of a bug of issue 31 being fixed (``item``). Once the
    fix lands it meets its check, or (``resolution``) raises that clear error; then move it
    out (to ``EXPECTED`` for the latter)."""

    item: int
    reason: str
    resolution: tuple[type[BaseException], str] | None = None


#: Cells (``fnmatch`` patterns of cell ids, the first match counts) that must raise a clear
#: error, with the reason.
EXPECTED: dict[str, Expected] = {
    "linreg_col/*": Expected(
        ValueError, r"(?s)observed site 'obs': the value of shape \(\d+, 1\).*broadcast",
        "targets (N, 1) against a mean (B,) would broadcast into a (B, B) log-density; the "
        "kernels refuse it, naming the site and both shapes (issue 31, item 4)"),
    "two_outputs/SASGLD/full/given/vectorized": Expected(
        RuntimeError, r"(?s)chain 1 of 4 diverged.*non-finite gradient at sites.*'sigma'.*"
                      r"smaller step_size",
        "the given step, 0.1 of the stability limit at the posterior's curvature, is far too "
        "large where chain 1 starts (a gradient norm of 2e5 after its first step): each step "
        "sends the noise scale from 450 to 1e-44, falls back and repeats, and the kernel "
        "stops the chain naming its sites, as it must; SGLD's cell escapes the same start"),
}

@dataclass(frozen=True)
class Limitation:
    """Cells whose check a kernel cannot meet by its design, and which it says so for: a
    failing check is a ``known-limitation`` only with a warning matching ``warning``
    (``fail`` without it); the cell may also pass."""

    warning: str
    reason: str


#: Cells (patterns, the first match counts) that fail their check by a kernel's design, warned.
LIMITATIONS: dict[str, Limitation] = {
    "*/L2E/full/*": Limitation(
        r"L2E on a full batch",
        "L2E's meta-learned dynamics rely on minibatch gradient noise: on the full batch the "
        "draws keep the posterior mean but sds of 0.01-0.1 times the posterior's; the kernel "
        "warns"),
    "*/L2E/*": Limitation(
        r"L2E: the draws' configurational temperature .* narrower than the target's",
        "L2E's meta-learned dynamics leave minibatched networks' draws narrower than the "
        "posterior (sds 0.07-0.5 of NUTS's on the BNNs); the kernel measures the draws' "
        "configurational temperature and warns (issue 31)"),
}

#: Cells (patterns) failing because of a bug of issue 31 still being fixed, with the item.
#: Empty since the fixes landed (6d484c0, 3b728d2, b679ab0). On abccfe7, before them, these
#: were recorded and failed as stated: ``linreg_col/*`` and ``bnn_col/*`` (item 4: the
#: (N, 1) targets broadcast silently), ``float64/*`` (item 6: dtype error),
#: ``cnn_train/*/*/*/vectorized`` (item 6: torch.func's raw BatchNorm error),
#: ``cnn_train/*/*/*/single`` (item 5: the export changed BatchNorm's running statistics),
#: ``*/SGHMC/{plate,subsample}/adapted/*`` (item 1: the adapted SGHMC ran hot on minibatches).
KNOWN_BROKEN: dict[str, Broken] = {}


def expectation(cell: Cell) -> tuple[Expected | None, Broken | None]:
    """The ``EXPECTED`` and ``KNOWN_BROKEN`` entries matching ``cell`` (the first of each)."""
    exp = next((v for k, v in EXPECTED.items() if fnmatch.fnmatchcase(cell.id, k)), None)
    broken = next((v for k, v in KNOWN_BROKEN.items() if fnmatch.fnmatchcase(cell.id, k)),
                  None)
    return exp, broken


# --------------------------------------------------------------------------- estimates


@dataclass
class Moments:
    """A Monte Carlo estimate of a statistic's mean and sd with their standard errors."""

    mean: float
    sd: float
    se: float
    sd_se: float
    ess: float


def _chain_ess(x: np.ndarray) -> float:
    return max(float(az.ess(x[None], method="bulk")), 1.0)


def moments(x: np.ndarray, log_weight: np.ndarray | None = None) -> Moments:
    """Mean and sd of draws ``x`` of shape ``(chains, draws)`` with Monte Carlo errors.

    Unweighted: ``se = sd / sqrt(ESS)`` with ArviZ's bulk ESS over the chains, and the sd's
    error from the ESS of the squared deviations (``sd(d^2) / (2 sd sqrt(ESS_d2))``).
    Weighted (``log_weight`` of the same shape, ContourSGLD): each chain's draws are
    self-normalised (``softmax``) and the chains averaged; the error of a chain's weighted
    mean is the delta-method :math:`\\sum_k w_k^2 (f_k - \\hat m)^2` times its
    autocorrelation factor ``draws / ESS``.
    """
    x = np.asarray(x, dtype=np.float64)
    if log_weight is None:
        mean = float(x.mean())
        dev2 = (x - mean) ** 2
        sd = float(math.sqrt(dev2.sum() / max(x.size - 1, 1)))
        ess = max(float(az.ess(x, method="bulk")), 1.0)
        ess2 = max(float(az.ess(dev2, method="bulk")), 1.0)
        sd_se = float(dev2.std()) / (2 * max(sd, 1e-300) * math.sqrt(ess2))
        return Moments(mean, sd, sd / math.sqrt(ess), sd_se, ess)
    lw = np.asarray(log_weight, dtype=np.float64)
    w = np.exp(lw - lw.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    chains, draws = x.shape
    means = (w * x).sum(1)
    mean = float(means.mean())
    dev2 = (x - mean) ** 2
    var = float((w * dev2).sum(1).mean())
    sd = math.sqrt(var)
    v_mean = v_var = 0.0
    for c in range(chains):
        tau = draws / _chain_ess(x[c])
        v_mean += tau * float((w[c] ** 2 * (x[c] - means[c]) ** 2).sum())
        var_c = float((w[c] * dev2[c]).sum())
        v_var += draws / _chain_ess(dev2[c]) * float((w[c] ** 2 * (dev2[c] - var_c) ** 2).sum())
    se = math.sqrt(v_mean) / chains
    sd_se = math.sqrt(v_var) / chains / (2 * max(sd, 1e-300))
    return Moments(mean, sd, se, sd_se, var / se**2 if se > 0 else math.inf)


# --------------------------------------------------------------------------- kernels


def _fraction(cell: Cell, num_data: int, batch: int) -> float:
    """The given step's fraction of the Langevin stability limit (minibatches: divided by
    ``1 + N/B``)."""
    return GIVEN_FRACTION / (1 + num_data / batch) if cell.data != "full" else GIVEN_FRACTION


def steps_per_draw(cell: Cell, num_data: int, budget: str = "slow") -> int:
    """SG steps per draw: the model's ``thin`` (``fast_thin``), ``1 + N/B`` times more with
    minibatches."""
    s = SETTINGS[cell.model]
    thin = s.fast_thin if budget == "fast" and s.fast_thin is not None else s.thin
    return thin * (1 + round(num_data / s.batch)) if cell.data != "full" else thin


def compile_setting() -> bool | str:
    """The kernels' ``compile=`` from :data:`COMPILE_VARIABLE` (default ``"off"``: ``False``)."""
    value = os.environ.get(COMPILE_VARIABLE, "off")
    if value not in COMPILE_MODES:
        raise ValueError(f"{COMPILE_VARIABLE} must be one of {sorted(COMPILE_MODES)}, got "
                         f"{value!r}")
    return COMPILE_MODES[value]


def make_kernel(cell: Cell, model: Any, curvature: float, num_data: int,
                budget: str = "slow") -> Any:
    """The kernel of a cell (see the module docstring for every setting)."""
    s = SETTINGS[cell.model]
    given = cell.step == "given"
    lam = float(curvature)
    eps = _fraction(cell, num_data, s.batch) * 2.0 / lam
    thin = steps_per_draw(cell, num_data, budget)
    common: dict[str, Any] = {
        "subsample_size": s.batch if cell.data == "subsample" else None,
        "vectorized_chains": NUM_VECTORIZED if cell.chains == "vectorized" else None,
        "compile": compile_setting(),
    }
    step = {"step_size": eps} if given else {}
    k = cell.kernel
    if k == "SGLD":
        return SGLD(model, num_steps_per_sample=thin, **step, **common)
    if k == "SGHMC":
        if given:
            eps_h = math.sqrt(SGHMC_DECAY * eps)
            return SGHMC(model, step_size=eps_h, friction=SGHMC_DECAY / eps_h, mass=1.0,
                         num_steps_per_sample=thin, **common)
        return SGHMC(model, num_steps_per_sample=thin, **common)
    if k == "CyclicalSGLD":
        step = {"step_size": 2 * eps} if given else {}
        return CyclicalSGLD(model, cycle_length=4 * thin, exploration_fraction=0.25,
                            draws_per_cycle=3, **step, **common)
    if k == "EntropyMCMC":
        eta = ENTROPY_ETA_STEPS * GIVEN_FRACTION * 2.0 / lam
        return EntropyMCMC(model, eta=eta, num_steps_per_sample=thin, **step, **common)
    if k == "ContourSGLD":
        return ContourSGLD(model, num_bins=CONTOUR_BINS, auto_bins=True,
                           num_steps_per_sample=thin, **step, **common)
    if k == "SASGLD":
        return SASGLD(model, rho=SASGLD_TILT / math.sqrt(lam), num_steps_per_sample=thin,
                      **step, **common)
    if k == "L2E":
        step = {"step_size": math.sqrt(L2E_STEP_MULT / num_data)} if given else {}
        return L2E(model, num_steps_per_sample=thin, **step, **common)
    raise ValueError(f"unknown kernel {k!r}; expected one of {KERNELS}")


def _delta(f: float) -> float:
    return f / (1 - f)


def bias_allowance(cell: Cell, quantity: str = "mean", dim: int = K_STIFF) -> float:
    """The stated bias allowance ``b`` of a cell's ``quantity`` (``"mean"`` or ``"sd"``), in
    posterior sds (module docstring), for a model of ``dim`` unconstrained parameters (fewer
    than ``K_STIFF`` directions can be stiff)."""
    if cell.kernel == "L2E":
        return L2E_ALLOWANCE if quantity == "mean" else L2E_SD_ALLOWANCE
    f = GIVEN_FRACTION if cell.step == "given" else ADAPTED_FRACTION
    if cell.kernel == "CyclicalSGLD":
        f = 2 * GIVEN_FRACTION if cell.step == "given" else ADAPTED_FRACTION
    if cell.kernel == "EntropyMCMC":
        f += 1 / (2 * ENTROPY_ETA_STEPS) if cell.step == "given" else 1 / ENTROPY_ETA_STEPS
    b = math.sqrt(min(K_STIFF, dim) / 2) * _delta(f)
    if cell.kernel == "SASGLD":
        b += SASGLD_TILT
    return b


# --------------------------------------------------------------------------- running


@dataclass
class Row:
    """One check of one statistic: ``value`` against ``reference`` within ``tolerance``."""

    statistic: str
    quantity: str  # "mean" or "sd"
    value: float
    reference: float
    tolerance: float
    mc_tolerance: float
    bias: float
    ess: float
    ok: bool
    note: str = ""


@dataclass
class CellResult:
    """What :func:`run_cell` measured; ``outcome`` is set by :func:`classify`."""

    cell: str
    budget: str
    seconds: float = 0.0
    rows: list[Row] = field(default_factory=list)
    error: str | None = None
    error_type: str | None = None
    warnings: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    outcome: str = ""
    reason: str = ""
    _exception: BaseException | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.rows) and all(r.ok for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("_exception")
        return out


def seed_of(cell: Cell) -> int:
    return zlib.crc32(cell.id.encode()) % 2**31


def _chain_draws(mcmc: MCMC) -> dict[str, torch.Tensor]:
    """Draws ``(chains, draws, ...)`` of the model's sites (EntropyMCMC's guide left out)."""
    draws = pyro_flat.get_samples(mcmc, group_by_chain=True)
    return {k: v for k, v in draws.items() if not k.endswith("__guide")}


def summarize_run(problem: Problem, draws: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The problem's statistics of draws ``(chains, draws, ...)``: ``{stat: (chains, draws)}``."""
    chains, n = next(iter(draws.values())).shape[:2]
    flat = {k: v.reshape(chains * n, *v.shape[2:]) for k, v in draws.items()}
    stats = problem.summarize(problem.build(None), flat, problem.data())
    return {k: np.asarray(v).reshape(chains, n) for k, v in stats.items()}


def _module_state(model: Any) -> dict[str, Any] | None:
    """Copies of a ``torch.nn.Module`` model's buffers and training flags (``None`` for a
    function model)."""
    if not isinstance(model, torch.nn.Module):
        return None
    return {"buffers": {k: v.detach().clone() for k, v in model.named_buffers()},
            "training": {k: m.training for k, m in model.named_modules()}}


def export_rows(mcmc: MCMC, problem: Problem, model: Any, num_chains: int, num_draws: int
                ) -> list[Row]:
    """Export the run with :func:`pyro_flat.to_arviz`, as a user would, and check it: each
    observed site's ``log_likelihood`` has one value per data point, ``(chains, draws, N)``,
    and the export leaves a module model as it was (buffers such as BatchNorm's running
    statistics, and every module's training flag)."""
    data = problem.data()
    before = _module_state(model)
    idata = pyro_flat.to_arviz(mcmc)
    rows = []
    with torch.no_grad():
        trace = pyro.poutine.trace(problem.build(None)).get_trace(*data.args)
    for name, site in trace.nodes.items():
        if site["type"] == "sample" and site["is_observed"]:
            shape = tuple(idata["log_likelihood"][name].shape)
            want = (num_chains, num_draws, data.num_data)
            rows.append(Row(f"to_arviz log_likelihood[{name}]", "shape", float(shape == want),
                            1.0, 0.0, 0.0, 0.0, 0.0, shape == want,
                            "" if shape == want else f"shape {shape}, expected {want}"))
    if before is not None:
        after = _module_state(model)
        changed = [k for k, v in before["buffers"].items()
                   if not torch.equal(v, after["buffers"][k])]
        changed += [f"{k or 'model'}.training" for k, v in before["training"].items()
                    if v != after["training"][k]]
        rows.append(Row("to_arviz leaves the model as it was", "state", float(not changed),
                        1.0, 0.0, 0.0, 0.0, 0.0, not changed,
                        "" if not changed else "changed: " + ", ".join(changed[:5])))
    return rows


def check(cell: Cell, stats: dict[str, np.ndarray], reference: dict[str, Any],
          log_weight: np.ndarray | None, budget: str, dim: int = K_STIFF) -> list[Row]:
    """The rows of the statistical check of a run's statistics against the reference (a
    model of ``dim`` unconstrained parameters)."""
    rows = []
    for name, ref in sorted(reference["statistics"].items()):
        x = stats[name]
        if not np.all(np.isfinite(x)):
            rows.append(Row(name, "mean", math.nan, ref["mean"], 0.0, 0.0, 0.0, 0.0, False,
                            f"{int((~np.isfinite(x)).sum())} non-finite values"))
            continue
        m = moments(x, log_weight)
        for quantity, value, se, se_ref, target in (
                ("mean", m.mean, m.se, ref["se"], ref["mean"]),
                ("sd", m.sd, m.sd_se, ref["sd_se"], ref["sd"])):
            b = bias_allowance(cell, quantity, dim)
            mc = Z * math.sqrt(se**2 + se_ref**2)
            tol = mc + b * ref["sd"]
            ok = abs(value - target) <= tol
            note = ""
            if mc > MAX_MC_TOLERANCE[budget] * ref["sd"]:
                ok, note = False, (f"inconclusive: the Monte Carlo tolerance is "
                                   f"{mc / ref['sd']:.2f} posterior sds (ESS {m.ess:.0f})")
            rows.append(Row(name, quantity, value, target, tol, mc, b * ref["sd"], m.ess, ok,
                            note))
    return rows


def _run_draws(cell: Cell, mcmc: MCMC) -> tuple[dict[str, torch.Tensor], np.ndarray | None]:
    """A run's draws ``(chains, draws, ...)`` and, for ContourSGLD, their ``log_weight``."""
    if cell.kernel != "ContourSGLD":
        return _chain_draws(mcmc), None
    log_weight = pyro_flat.sample_stats(mcmc, group_by_chain=True)["log_weight"]
    return _chain_draws(mcmc), log_weight.double().numpy()


def _inconclusive(rows: list[Row]) -> bool:
    return any(r.note.startswith("inconclusive") for r in rows)


def continue_run(cell: Cell, kernel: Any, args: tuple, num_draws: int,
                 draws: dict[str, torch.Tensor], log_weight: np.ndarray | None
                 ) -> tuple[dict[str, torch.Tensor], np.ndarray | None]:
    """Continue a finished run's chains by ``num_draws`` draws, bitwise (the kernel's
    checkpoint, no warmup), and return every draw so far (and ContourSGLD's ``log_weight``)."""
    kernel.load_state_dict(kernel.state_dict())
    more = MCMC(kernel, num_samples=num_draws, warmup_steps=0, disable_progbar=True)
    more.run(*args)
    new_draws, new_weight = _run_draws(cell, more)
    draws = {k: torch.cat([v, new_draws[k]], 1) for k, v in draws.items()}
    if log_weight is not None:
        log_weight = np.concatenate([log_weight, new_weight], 1)
    return draws, log_weight


def run_cell(cell: Cell, budget: str = "slow", reference: dict[str, Any] | None = None
             ) -> CellResult:
    """Run one cell and check it (without classifying it; see :func:`classify`)."""
    from .reference import load_reference

    problem = PROBLEMS[cell.model]
    setting = SETTINGS[cell.model]
    result = CellResult(cell.id, budget)
    refs = (reference or load_reference())["problems"]
    ref = refs.get(problem.reference_name)
    if ref is None:  # cnn_train has no reference: take the curvature of the eval-mode cnn's
        ref = refs.get(problem.reference_name.removesuffix("_train"))
    if ref is None:
        result.error_type, result.error = "MissingReference", (
            f"no reference for {problem.reference_name}: run tests/conformance/reference.py")
        return result
    data = problem.data()
    warmup = setting.warmup if budget == "slow" else setting.fast_warmup
    num_draws = setting.draws if budget == "slow" else setting.fast_draws
    if cell.chains == "single":
        num_draws *= NUM_VECTORIZED
    result.settings = {"warmup_draws": warmup, "draws_per_chain": num_draws,
                       "steps_per_draw": steps_per_draw(cell, data.num_data, budget),
                       "batch": setting.batch, "seed": seed_of(cell),
                       "bias_allowance_sd": {q: bias_allowance(cell, q) for q in ("mean", "sd")}}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pyro.set_rng_seed(seed_of(cell))
            model = problem.build(setting.batch if cell.data == "plate" else None)
            kernel = make_kernel(cell, model, ref["curvature"], data.num_data, budget)
            mcmc = MCMC(kernel, num_samples=num_draws, warmup_steps=warmup,
                        disable_progbar=True)
            mcmc.run(*data.args)
            result.settings["compile"] = _compilation(kernel)
            draws, log_weight = _run_draws(cell, mcmc)
            chains, n = next(iter(draws.values())).shape[:2]
            exported = export_rows(mcmc, problem, model, chains, n)
            while True:
                stats = summarize_run(problem, draws)
                if not problem.has_posterior:
                    bad = [k for k, v in stats.items() if not np.all(np.isfinite(v))]
                    result.rows = [Row("finite draws", "all", float(not bad), 1.0, 0.0, 0.0,
                                       0.0, 0.0, not bad, "no posterior: runs only")]
                else:
                    result.rows = check(cell, stats, ref, log_weight, budget,
                                        kernel.layout.size)
                held = next(iter(draws.values())).shape[1]
                if not _inconclusive(result.rows) or held >= MAX_DRAWS_FACTOR * num_draws:
                    break
                draws, log_weight = continue_run(cell, kernel, data.args, held, draws,
                                                 log_weight)
                result.settings["draws_per_chain"] = 2 * held
            result.rows += exported
        except Exception as e:  # noqa: BLE001 (every error is a result of the cell)
            result.error_type, result.error = type(e).__name__, str(e)
            result._exception = e
    result.seconds = round(time.perf_counter() - start, 2)
    seen = []
    for w in caught:
        msg = f"{w.category.__name__}: {w.message}"[:300]
        if msg not in seen and not issubclass(w.category, DeprecationWarning):
            seen.append(msg)
    result.warnings = seen[:10]
    return result


def _compilation(kernel: Any) -> dict[str, Any]:
    """What the kernel's ``compile=`` chose for its run (its ``diagnostics()["compile"]``)."""
    chosen = kernel.compilation
    if chosen is None:
        return {"requested": kernel.compile, "used": False, "reason": "not set up"}
    return chosen.as_dict()


def classify(cell: Cell, result: CellResult) -> CellResult:
    """Set ``result.outcome`` (and ``reason``) from ``EXPECTED``, ``KNOWN_BROKEN`` and
    ``LIMITATIONS``."""
    exp, broken = expectation(cell)
    err = result._exception
    if exp is not None:
        if result.error is None:
            result.outcome, result.reason = "fail", (
                f"expected {exp.error.__name__} matching {exp.match!r} ({exp.reason}); the "
                "cell ran")
        elif (err is None or isinstance(err, exp.error)) and re.search(exp.match, result.error):
            result.outcome, result.reason = "expected-error", exp.reason
        else:
            result.outcome, result.reason = "error", (
                f"expected {exp.error.__name__} matching {exp.match!r}, got "
                f"{result.error_type}: {result.error[:200]}")
        return result
    if broken is not None:
        resolved = broken.resolution is not None and result.error is not None and (
            isinstance(err, broken.resolution[0]) if err is not None else True) and bool(
            re.search(broken.resolution[1], result.error))
        if result.passed or resolved:
            result.outcome, result.reason = "fixed", (
                f"KNOWN_BROKEN (issue 31 item {broken.item}) now "
                + ("raises the clear error" if resolved else "meets its check")
                + ": move it out of KNOWN_BROKEN")
        else:
            result.outcome = "known-broken"
            result.reason = f"issue 31 item {broken.item}: {broken.reason}"
        return result
    limitation = next((v for k, v in LIMITATIONS.items() if fnmatch.fnmatchcase(cell.id, k)),
                      None)
    if result.error is not None:
        result.outcome, result.reason = "error", f"{result.error_type}: {result.error[:300]}"
    elif result.passed:
        result.outcome, result.reason = "pass", ""
    elif limitation is not None and any(re.search(limitation.warning, w)
                                        for w in result.warnings):
        result.outcome, result.reason = "known-limitation", limitation.reason
    else:
        bad = [r for r in result.rows if not r.ok]
        result.outcome = "fail"
        result.reason = "; ".join(
            f"{r.statistic} {r.quantity} {r.value:.4g} vs {r.reference:.4g} "
            f"(tol {r.tolerance:.3g}{', ' + r.note if r.note else ''})" for r in bad[:4])
    return result


def run_and_classify(cell: Cell, budget: str = "slow",
                     reference: dict[str, Any] | None = None) -> CellResult:
    return classify(cell, run_cell(cell, budget, reference))
