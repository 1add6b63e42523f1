"""Adapted underdamped kernels on a user's minibatched model: the noise correction from warmup's
start, at the smallest friction that holds it (SGHMC, and the underdamped forms of SASGLD and
EntropyMCMC).

The model is a conjugate Bayesian linear regression written as a Pyro user writes it (a
``pyro.plate`` with ``subsample_size=10`` of ``N = 500`` points), so its posterior is exact.
Ten of 500 points give a minibatch gradient noise tens of thousands of times the injected
noise at the default friction. Three faults made the default ``SGHMC(model)``, and the
underdamped SASGLD and EntropyMCMC, fail here:

* the noise correction waited for the second half of warmup, and the chain, many thousand
  times too hot, left for regions where its step diverged (a ``RuntimeError``);
* the friction that holds the correction was found by an iteration that overshot (about 40
  times the smallest one here), which damped the chain to a standstill (posterior means off by
  tens of posterior sds, sds a tenth of the posterior's);
* the underdamped SASGLD and EntropyMCMC had no correction: their chains, as hot, went off
  by about 1e10 posterior sds in the first half of warmup, and the step that warmup then shrank
  (to hold the noise at the given friction) kept them there, without an error.

A fourth is known and not fixed: with epoch-wise batches the correction makes the chains run
cold (``test_corrected_sghmc_is_not_too_cold``, an expected failure).
"""

import math
import sys
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from harness import Z, assert_resume_continues, moments_with_errors, sqrt_ratio_tolerance

from pyro_flat.infer import SASGLD, SGHMC, EntropyMCMC
from pyro_flat.infer.mcmc import adaptation, gradient_noise

N, D, B, SIGMA = 500, 5, 10, 0.5


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = x @ torch.randn(D, generator=g) + SIGMA * torch.randn(N, generator=g)
    return x, y


def model(x: torch.Tensor, y: torch.Tensor) -> None:
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with pyro.plate("data", N, subsample_size=B) as i:
        pyro.sample("obs", dist.Normal(x[i] @ w, SIGMA), obs=y[i])


def exact_posterior(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = x.double(), y.double()
    cov = torch.linalg.inv(torch.eye(D, dtype=torch.float64) + x.T @ x / SIGMA**2)
    return cov @ (x.T @ y / SIGMA**2), cov.diagonal().sqrt()


#: The kernels, adapted (no step size), underdamped. SASGLD's ``rho = 0`` takes the plain
#: gradient, whose chain has the exact posterior; EntropyMCMC's theta has it as its marginal.
KERNELS = {
    "SGHMC": lambda **kw: SGHMC(model, **kw),
    "SASGLD": lambda **kw: SASGLD(model, rho=0.0, dynamics="underdamped", **kw),
    "EntropyMCMC": lambda **kw: EntropyMCMC(model, eta=0.05, dynamics="underdamped", **kw),
}


@pytest.mark.parametrize("name", KERNELS)
def test_adapted_underdamped_kernel_on_a_minibatched_regression_samples_the_exact_posterior(
        name):
    x, y = data()
    kernel = KERNELS[name](num_steps_per_sample=20, vectorized_chains=8)
    pyro.set_rng_seed(0)
    mcmc = pyro.infer.MCMC(kernel, num_samples=100, warmup_steps=200, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mcmc.run(x, y)  # before: the chains diverged in the first half of warmup
    mean, sd = exact_posterior(x, y)
    chains = mcmc.get_samples()["w"].transpose(0, 1)  # (chains, draws, D)
    m, c, se_mean, _ = moments_with_errors(chains)
    # the check is conclusive: Z Monte Carlo errors are within a posterior sd, the conformance
    # matrix's rule (before: the over-damped chains stood still where they started, far apart,
    # at 5-9 sds of error)
    assert torch.all(Z * se_mean <= sd), (se_mean / sd)
    # the mean of a linear chain with zero-mean gradient noise is exact
    assert torch.all((m - mean).abs() <= Z * se_mean), ((m - mean) / sd)
    # sd: Monte Carlo error, plus 5% for the excess temperature warmup allows (10%) and the
    # discretisation at a fifth of the stability limit
    ess = (c.diagonal() / se_mean**2)
    tolerance = sqrt_ratio_tolerance(ess) + 0.05 + 0.05
    assert torch.all((c.diagonal().sqrt() / sd - 1).abs() <= tolerance), (c.diagonal().sqrt() / sd)
    # the correction held from warmup's first estimate on
    first = kernel.warmup.noise_log[0]
    assert first["draw"] == 0 and first["temperature_excess"] <= gradient_noise.EXCESS_BOUND


def test_the_raised_friction_is_the_smallest_that_holds_the_correction():
    """At the returned friction ``C`` the largest correction is at most the share of ``C``
    (:data:`~pyro_flat.infer.mcmc.gradient_noise.CORRECTION_SHARE`) and at ``0.99 C`` it is not:
    a larger friction damps the chain more than the noise needs."""
    variance = torch.tensor([3.6e6, 1.0e6, 2.0e4])
    for curvature in (3.0e3, 1.0e5):
        def step_for(friction: float, curvature: float = curvature) -> float:
            return 0.2 * adaptation.underdamped_limit(curvature, friction, 1.0)

        def needed(friction: float) -> float:
            return step_for(friction) * float(variance.max()) / 2 / gradient_noise.CORRECTION_SHARE

        friction, step, correction = gradient_noise.corrected_friction(
            variance, 1.0, 1.0, step_for)
        assert step == step_for(friction)
        assert torch.allclose(correction, step * variance / 2)
        assert float(correction.max()) <= gradient_noise.CORRECTION_SHARE * friction * (1 + 1e-9)
        assert needed(0.99 * friction) > 0.99 * friction, (curvature, friction)
    # where the given friction holds it, it is kept
    assert gradient_noise.corrected_friction(torch.tensor([1e-3]), 1.0, 1.0, step_for)[0] == 1.0
    assert math.isfinite(friction)


@pytest.mark.xfail(strict=True, reason=(
    "known bug (issue 31): the correction assumes independent minibatch noise, but the kernel "
    "draws batches epoch-wise, whose noise sums to zero over an epoch; when the position relaxes "
    "over many epochs the correction takes away injected noise the chain needs, and it runs "
    "cold (sd ratio 0.79-0.88 here, benchmarks/underdamped_minibatch_warmup.py)"))
def test_corrected_sghmc_is_not_too_cold(monkeypatch):
    """At ``B = 100`` (5 batches an epoch) and 400 draws, each posterior sd within its Monte
    Carlo error plus the 5% that warmup's 10% excess-temperature bound allows."""
    monkeypatch.setattr(sys.modules[__name__], "B", 100)
    x, y = data()
    kernel = SGHMC(model, num_steps_per_sample=20, vectorized_chains=8)
    pyro.set_rng_seed(0)
    mcmc = pyro.infer.MCMC(kernel, num_samples=400, warmup_steps=200, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mcmc.run(x, y)
    _, sd = exact_posterior(x, y)
    chains = mcmc.get_samples()["w"].transpose(0, 1)
    _, c, se_mean, _ = moments_with_errors(chains)
    ess = c.diagonal() / se_mean**2
    ratio = c.diagonal().sqrt() / sd
    assert torch.all((ratio - 1).abs() <= sqrt_ratio_tolerance(ess) + 0.05), ratio


@pytest.mark.parametrize("name", KERNELS)
def test_a_checkpoint_keeps_the_chosen_friction_and_correction(name, tmp_path):
    """Stopped after warmup and resumed from a file, the chain continues bit for bit: the
    checkpoint carries the raised friction and the correction (without them the resumed run
    would take the given friction and inject the uncorrected noise)."""
    x, y = data()
    whole, second = assert_resume_continues(
        lambda: KERNELS[name](num_steps_per_sample=5), x, y, through_file=tmp_path / "ck.pt")
    assert second.kernel.momentum_friction() > 1.0  # raised above the given friction
    assert second.kernel.chosen_noise_correction() is not None
