"""The draws' check of a kernel whose draws are reweighted (ContourSGLD's ``log_weight``): the
effective sample size is that of the self-normalised weighted means a user computes
(``pyro_flat.infer.mcmc.draw_mixing``, "Reweighted draws").

The statistical tests compare the ESS's predicted variance of a chain's weighted mean with the
variance of that mean over many independent chains. The chains are AR(1) series with ``N(0, 1)``
margins and log weights ``c f`` (the weights tilt ``N(0, 1)`` to ``N(c, 1)``): the weighted
mean estimates ``c``.
"""

import math
import warnings

import arviz as az
import harness
import pytest
import torch
from harness import Z

from pyro_flat.infer import ContourSGLD
from pyro_flat.infer.mcmc.draw_mixing import (
    LOW_ESS_FRACTION,
    MAX_KEPT,
    DrawMixing,
    LowestESS,
    _reweighted_ess,
    warn_if_draws_mix_slowly,
)
from pyro_flat.target.layout import FlatLayout


def ar1(a: float, n: int, chains: int, seed: int) -> torch.Tensor:
    """``(chains, n)`` stationary AR(1) series with coefficient ``a`` and ``N(0, 1)`` margins."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(chains, n, dtype=torch.float64, generator=g) * math.sqrt(1 - a * a)
    x = torch.empty_like(e)
    x[:, 0] = e[:, 0] / math.sqrt(1 - a * a)
    for t in range(1, n):
        x[:, t] = a * x[:, t - 1] + e[:, t]
    return x


@pytest.mark.parametrize(("a", "tilt"), [(0.0, 1.0), (0.8, 1.0), (0.8, 0.0)])
def test_the_ess_predicts_the_variance_of_a_weighted_mean(a, tilt):
    """400 chains of 1,000 draws. The predicted variance of one chain's weighted mean,
    ``sigma^2 K / ESS`` for the ESS of ``K`` chains, against the variance of the 400 chains'
    weighted means: that variance's relative sd is sqrt(2 / 399) = 0.071 (Gaussian means), so
    the ratio is within Z = 4 of them, plus 0.10 for the delta method's and Geyer's truncated
    sum's biases at an importance ESS of about 370 and ``n / tau`` of about 50. Ignoring the
    weights would predict e^{c^2} = 2.7 times too small a variance at ``c = 1``, ignoring the
    autocorrelation ``(1 + a)/(1 - a) = 9`` times."""
    chains, n = 400, 1000
    f = ar1(a, n, chains, seed=3)
    log_weight = tilt * f
    ess = _reweighted_ess(f.unsqueeze(1), log_weight)  # one summary
    w = torch.softmax(log_weight, -1)
    means = (w * f).sum(-1)
    variance = (w * (f - means.unsqueeze(-1)).square()).sum(-1).mean()
    predicted = float(variance * chains / ess[0])
    observed = float(means.var())
    assert abs(predicted / observed - 1) <= Z * math.sqrt(2 / (chains - 1)) + 0.10
    assert abs(float(means.mean()) - tilt) <= Z * math.sqrt(observed / chains)


def test_equal_weights_give_the_draws_ess():
    """Equal weights: ``K n / tau`` with ``tau = (1 + a) / (1 - a) = 19`` (64 chains of 4,000
    draws; each chain's estimate of ``tau`` has a relative sd of about sqrt(2 (2M + 1) / n) =
    0.24 for a window M of 3 tau, their mean 0.03; within Z of it, plus 5% for the truncated
    sum's bias)."""
    f = ar1(0.9, 4000, 64, seed=4)
    ess = float(_reweighted_ess(f.unsqueeze(1), torch.zeros_like(f))[0])
    exact = 64 * 4000 / 19
    assert abs(ess / exact - 1) <= Z * math.sqrt(2 * (2 * 3 * 19 + 1) / 4000) / 8 + 0.05


def _mixing(f: torch.Tensor) -> DrawMixing:
    mixing = DrawMixing(FlatLayout.from_shapes({"scale": torch.Size([])}).sites)
    for t in range(f.shape[-1]):
        mixing.record(f[:, t].unsqueeze(-1).float())
    return mixing


def test_a_long_run_reads_the_weights_of_the_kept_draws():
    """10,000 draws of 8 chains: the buffer keeps every second, then every fourth draw (2,500
    kept). Log weights ``-inf`` on every draw the buffer dropped change nothing: the kept draws
    are read with their own weights."""
    f = ar1(0.5, 10_000, 8, seed=5)
    log_weight = f.T.clone()  # (draws, chains)
    every = _mixing(f).lowest_ess(log_weight)
    dropped = torch.full_like(log_weight, -math.inf)
    dropped[::4] = log_weight[::4]
    kept_only = _mixing(f).lowest_ess(dropped)
    assert every.reweighted and kept_only.reweighted
    assert kept_only.ess == pytest.approx(every.ess, rel=1e-6)
    assert every.num_draws == 8 * 10_000 and 10_000 > 2 * MAX_KEPT


def test_weights_shorter_than_the_draws_fall_back_to_the_draws_ess():
    f = ar1(0.5, 200, 4, seed=6)
    lowest = _mixing(f).lowest_ess(torch.zeros(100, 4))
    assert not lowest.reweighted
    assert lowest.ess == pytest.approx(_mixing(f).lowest_ess().ess)


def test_the_warning_says_the_draws_are_reweighted():
    low = LowestESS(12.0, "scale", None, 1000, 0.012, reweighted=True)
    with pytest.warns(RuntimeWarning, match=r"ContourSGLD: the reweighted draws' effective "
                      r"sample size for site 'scale' is about 12 of 1000 draws \(1\.2%\)"):
        warn_if_draws_mix_slowly("ContourSGLD", low)


def _contour(seed: int) -> tuple[ContourSGLD, torch.Tensor, list[str]]:
    """ContourSGLD on ``N(0, 1)`` with 20 bins of 5 nats from 0: the flattened chain roams
    energies up to 100 nats (``|x|`` up to about 14) that the weights take back. 16 chains,
    800 draws of 40 SG steps, 2 warmup draws (too short for warmup to measure)."""
    kernel = ContourSGLD(potential_fn=lambda p: 0.5 * p["x"].square().sum(-1),
                         initial_params={"x": torch.zeros(16, 1)}, step_size=0.05,
                         num_bins=20, bin_width=5.0, min_energy=0.0, zeta=1.0,
                         num_steps_per_sample=40, vectorized_chains=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = harness.run(kernel, 800, 2, seed)
    draws = harness.chains_of(mcmc).squeeze(-1)  # (chains, draws)
    return kernel, draws, [str(w.message) for w in caught]


def test_contour_sgld_checks_its_reweighted_draws():
    """The draws of the flattened chain are autocorrelated far beyond 5% of their number (their
    own ESS, measured here with ArviZ, is 1-4% of them on four seeds tried: the tails of the
    flattened law mix slowly), but the reweighted estimates keep 16-19% (measured the same
    way): the draws' check reads the weights and does not warn. An unweighted check would."""
    kernel, draws, messages = _contour(seed=0)
    assert not [m for m in messages if "effective sample size" in m]
    unweighted = float(az.ess(draws.numpy(), method="bulk")) / draws.numel()
    assert unweighted < LOW_ESS_FRACTION
    stats = kernel.recorder.tensors(["log_weight"])["log_weight"]
    reweighted = _reweighted_ess(draws.double().unsqueeze(1), stats.T.double())[0]
    assert float(reweighted) / draws.numel() > 2 * LOW_ESS_FRACTION
