"""Adapted underdamped kernels on a user's minibatched model: from warmup's first estimate on, the
friction at which the minibatch noise heats the chain by at most 5% (SGHMC, and the underdamped
forms of SASGLD and EntropyMCMC).

The model is a conjugate Bayesian linear regression written as a Pyro user writes it (a
``pyro.plate`` with ``subsample_size=10`` of ``N = 500`` points), so its posterior is exact.
Ten of 500 points give a minibatch gradient noise tens of thousands of times the injected
noise at the default friction. Four faults made the default ``SGHMC(model)``, and the
underdamped SASGLD and EntropyMCMC, fail here:

* the noise correction waited for the second half of warmup, and the chain, many thousand
  times too hot, left for regions where its step diverged (a ``RuntimeError``);
* the friction that holds the correction was found by an iteration that overshot (about 40
  times the smallest one here), which damped the chain to a standstill (posterior means off by
  tens of posterior sds, sds a tenth of the posterior's);
* the underdamped SASGLD and EntropyMCMC had no correction: their chains, as hot, went off
  by about 1e10 posterior sds in the first half of warmup, and the step that warmup then shrank
  (to hold the noise at the given friction) kept them there, without an error.

* SGHMC subtracted the noise correction of Chen et al. (2014) from its injected noise. That
  assumes independent batches; the kernels' epoch-wise batches' noise sums to zero over an
  epoch, so a chain that moves slowly against an epoch feels little of it, and the correction
  took away noise it needed: posterior sds 10-21% too narrow at ``B = 100``
  (``test_sghmc_is_not_too_cold``). Warmup now injects the full noise and raises the friction
  until the share of the minibatch noise that reaches the position
  (:mod:`pyro_flat.infer.mcmc.epoch_noise`) heats it by at most 5%.
"""

import sys
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from harness import Z, assert_resume_continues, moments_with_errors, sqrt_ratio_tolerance

from pyro_flat.infer import SASGLD, SGHMC, EntropyMCMC
from pyro_flat.infer.mcmc import adaptation, gradient_noise
from pyro_flat.infer.mcmc.epoch_noise import epoch_share
from pyro_flat.infer.mcmc.friction import NoiseFriction

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
    # the friction held the noise from warmup's first estimate on
    first = kernel.warmup.noise_log[0]
    assert first["draw"] == 0 and first["temperature_excess"] <= gradient_noise.EXCESS_BOUND


def test_the_raised_friction_is_the_smallest_that_bounds_the_heat():
    """At the chosen friction ``C`` the minibatch noise heats the position by the target (5%),
    counting the share that epoch-wise batches let through, and at ``0.99 C`` by more: a larger
    friction damps the chain more than the noise needs. Where the given friction holds it, it
    is kept."""
    x, y = data()
    kernel = SGHMC(model, num_steps_per_sample=1)
    pyro.set_rng_seed(0)
    pyro.infer.MCMC(kernel, num_samples=1, warmup_steps=1, disable_progbar=True).run(x, y)
    per_epoch = N // B

    def heat(friction: float, top: float, curvature: float) -> float:
        step = 0.2 * adaptation.underdamped_limit(curvature, friction, 1.0)
        share = epoch_share(curvature, step, friction, batches_per_epoch=per_epoch)
        return share * step * top / 2 / friction

    for top, curvature in ((3.6e6, 3.0e3), (3.6e6, 1.0e5), (2.0e4, 2.0e3)):
        kernel.friction = 1.0
        fit = NoiseFriction(1.0)
        step = fit.fit(kernel, curvature, torch.tensor([top, top / 10]))
        friction = kernel.friction
        assert step == 0.2 * adaptation.underdamped_limit(curvature, friction, 1.0)
        assert heat(friction, top, curvature) <= gradient_noise.TARGET_RATIO * (1 + 1e-6)
        assert heat(0.99 * friction, top, curvature) > gradient_noise.TARGET_RATIO, (
            top, curvature, friction)
    kernel.friction = 1.0
    NoiseFriction(1.0).fit(kernel, 2.0e3, torch.tensor([1e-3]))
    assert kernel.friction == 1.0


def test_sghmc_is_not_too_cold(monkeypatch):
    """At ``B = 100`` (5 batches an epoch) and 400 draws, each posterior sd within its Monte
    Carlo error plus the 5% that warmup's 10% excess-temperature bound allows. With the
    correction of Chen et al. subtracted (before) the sds were 0.79-0.88 of the exact ones."""
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
def test_a_checkpoint_keeps_the_chosen_friction(name, tmp_path):
    """Stopped after warmup and resumed from a file, the chain continues bit for bit: the
    checkpoint carries the raised friction (without it the resumed run would take the given
    friction, at which the minibatch noise is thousands of times the injected noise)."""
    x, y = data()
    whole, second = assert_resume_continues(
        lambda: KERNELS[name](num_steps_per_sample=5), x, y, through_file=tmp_path / "ck.pt")
    assert second.kernel.momentum_friction() > 1.0  # raised above the given friction
    assert second.kernel.noise_fit.share is not None


def test_a_checkpoint_with_the_old_correction_is_refused():
    """A checkpoint whose warmup subtracted a per-coordinate correction (written before the
    friction rule) would resume a chain that runs cold: a clear error, not a silent mix."""
    x, y = data()
    kernel = SGHMC(model, num_steps_per_sample=1)
    pyro.set_rng_seed(0)
    pyro.infer.MCMC(kernel, num_samples=1, warmup_steps=1, disable_progbar=True).run(x, y)
    state = kernel.warmup.state_dict()
    kernel.warmup.load_state_dict(state)  # today's loads
    state["noise_correction"] = torch.ones(D)
    with pytest.raises(ValueError, match="noise correction"):
        kernel.warmup.load_state_dict(state)
