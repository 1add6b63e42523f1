"""SG steps per draw chosen in warmup (``num_steps_per_sample="auto"``) and the warning when a
given thinning is far too small.

The target of the kernel tests is ``N(0, 1)`` in one coordinate, sampled full-batch by SGLD at a
given step ``eps``: the chain is the AR(1) ``x <- (1 - eps) x + sqrt(2 eps) xi``, so the
coordinate's integrated autocorrelation time is ``(1 + a) / (1 - a)`` with ``a = 1 - eps``
(39 SG steps at ``eps = 0.05``), and the energy ``x^2 / 2`` has the shorter
``(1 + a^2) / (1 - a^2)``.
"""

import math
import warnings

import harness
import pytest
import torch
from harness import Z

from pyro_flat.infer import SGHMC, SGLD
from pyro_flat.infer.mcmc.thinning import integrated_autocorrelation_time

EPS = 0.05
TAU = (2 - EPS) / EPS  # 39


def ar1(a: float, n: int, series: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(series, n, dtype=torch.float64, generator=g)
    x = torch.empty_like(e)
    x[:, 0] = e[:, 0] / math.sqrt(1 - a * a)  # start in the stationary law
    for t in range(1, n):
        x[:, t] = a * x[:, t - 1] + e[:, t]
    return x


@pytest.mark.parametrize("a", [0.0, 0.5, 0.9])
def test_integrated_autocorrelation_time_of_an_ar1(a):
    """The mean over 64 series of 4,000 steps is within Z standard errors (from the spread of
    the 64 estimates) of ``(1 + a) / (1 - a)``, plus 5% for the estimator's own bias at
    n / tau >= 200 (Geyer's truncated sum, the drift removed)."""
    tau = integrated_autocorrelation_time(ar1(a, 4000, 64), detrend=True)
    exact = (1 + a) / (1 - a)
    se = float(tau.std()) / math.sqrt(len(tau))
    assert abs(float(tau.mean()) - exact) <= Z * se + 0.05 * exact


def test_a_drift_is_not_an_autocorrelation():
    x = ar1(0.5, 2000, 16) + torch.linspace(0, 50, 2000, dtype=torch.float64)
    assert float(integrated_autocorrelation_time(x, detrend=True).mean()) < 4
    assert float(integrated_autocorrelation_time(x).mean()) > 100


def gaussian_kernel(thin, k=64):
    return SGLD(potential_fn=lambda p: 0.5 * p["x"].square().sum(-1),
                initial_params={"x": torch.zeros(k, 1)}, step_size=EPS,
                num_steps_per_sample=thin, vectorized_chains=k)


def test_auto_keeps_five_draws_per_autocorrelation_time():
    """64 chains, a last window of 100 draws: the mean of 64 estimates of tau = 39 has a
    relative standard error of about 0.03, so ceil(tau / 5) is 8 within 4.5 standard errors
    and the drift removal's downward bias of a few percent: 7 to 9."""
    kernel = gaussian_kernel("auto")
    mcmc = harness.run(kernel, 50, 400, 0)
    diag = kernel.diagnostics()
    assert 7 <= diag["num_steps_per_sample"] <= 9
    assert abs(diag["autocorrelation_time"] / TAU - 1) < 0.15
    draws = harness.chains_of(mcmc).squeeze(-1)  # (chains, draws)
    # the kept draws are an AR(1) with coefficient a^k: lag-1 autocorrelation below 0.7
    a_k = (1 - EPS) ** diag["num_steps_per_sample"]
    assert a_k < 0.7
    lag1 = float((draws[:, 1:] * draws[:, :-1]).mean() / draws.square().mean())
    assert abs(lag1 - a_k) <= Z * math.sqrt((1 - a_k**2) / draws.numel()) * 2


def test_a_given_thinning_far_below_the_autocorrelation_time_warns():
    with pytest.warns(RuntimeWarning, match="autocorrelation time of about .* SG steps"):
        harness.run(gaussian_kernel(1), 20, 2000, 0)  # a last window of 500 steps
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        harness.run(gaussian_kernel(8), 20, 200, 0)
    assert gaussian_kernel(8).auto_thinning is False


def test_auto_resumes_bitwise():
    harness.assert_resume_continues(lambda: SGHMC(
        potential_fn=lambda p: 0.5 * p["x"].square().sum(), initial_params={"x": torch.ones(2)},
        step_size=0.1, num_steps_per_sample="auto"))


def test_bad_thinning_is_named():
    with pytest.raises(ValueError, match="num_steps_per_sample must be an integer >= 1 or 'auto'"):
        gaussian_kernel("often")
    with pytest.raises(ValueError, match="warmup_steps=2: give"):
        harness.run(gaussian_kernel("auto"), 5, 2, 0)
