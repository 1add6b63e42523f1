"""SGLD, SGHMC and cyclical SGLD on Gaussian targets, against their exact stationary laws.

Each run samples 256 independent chains at once (the target is vectorised, see
``harness.GaussianTarget``), so every moment has a Monte Carlo standard error of about 0.01 and
the checks in ``harness.check_gaussian`` use 4.5 standard errors.
"""

import math

import harness
import pytest
import torch

from pyro_flat import kernel_diagnostics
from pyro_flat.infer import SGHMC, SGLD, CyclicalSGLD


def sgld_exact_cov(target, step_size, temperature=1.0, grad_noise=0.0):
    return harness.langevin_exact_cov(target.precision, step_size, temperature, grad_noise)


def sghmc_exact_cov(target, eps, friction, mass, temperature=1.0):
    return harness.underdamped_exact_cov(target.precision, eps, friction, mass, temperature)


@pytest.mark.parametrize("grad_noise", [0.0, 1.0])
def test_sgld_gaussian(grad_noise):
    target = harness.correlated_2d(grad_noise)
    eps = 0.05
    kernel = SGLD(potential_fn=target, initial_params=target.initial_params(), step_size=eps,
                  num_steps_per_sample=5)
    mcmc = harness.run(kernel, num_samples=600, warmup_steps=40)
    exact = sgld_exact_cov(target, eps, grad_noise=grad_noise)
    harness.check_gaussian(harness.chains_of(mcmc), target.mean, target.cov, exact_cov=exact)


def make_kernel(name, target, temperature):
    common = dict(potential_fn=target, initial_params=target.initial_params(),
                  temperature=temperature)
    if name == "sgld":
        return SGLD(step_size=0.05, num_steps_per_sample=5, **common)
    if name == "sghmc":
        return SGHMC(step_size=0.1, friction=3.0, num_steps_per_sample=5, **common)
    return CyclicalSGLD(step_size=0.4, cycle_length=40, exploration_fraction=0.25, **common)


@pytest.mark.parametrize("name", ["sgld", "sghmc", "csgld"])
def test_spread_scales_as_sqrt_temperature(name):
    target = harness.correlated_2d()
    stds = {}
    for t in (0.25, 1.0, 4.0):
        kernel = make_kernel(name, target, t)
        # a cyclical draw costs a whole 40-step cycle; the others draw every 5 steps
        draws, warmup = (120, 4) if name == "csgld" else (300, 40)
        chains = harness.chains_of(harness.run(kernel, num_samples=draws, warmup_steps=warmup))
        stds[t] = chains.reshape(-1, 2).std(0)
        n_eff = harness.ess(chains)
    tol = harness.sqrt_ratio_tolerance(n_eff) * math.sqrt(2)  # a ratio of two estimates
    assert tol < 0.1, "chains too short for the 10% target"
    for t in (0.25, 4.0):
        ratio = stds[t] / stds[1.0] / math.sqrt(t)
        assert torch.all((ratio - 1).abs() < 0.1), f"T={t}: std ratio / sqrt(T) = {ratio}"


def test_sghmc_gaussian():
    target = harness.correlated_2d()
    eps, friction, mass = 0.1, 3.0, 1.0
    kernel = SGHMC(potential_fn=target, initial_params=target.initial_params(), step_size=eps,
                   friction=friction, mass=mass, num_steps_per_sample=5)
    mcmc = harness.run(kernel, num_samples=600, warmup_steps=40)
    exact = sghmc_exact_cov(target, eps, friction, mass)
    harness.check_gaussian(harness.chains_of(mcmc), target.mean, target.cov, exact_cov=exact)


@pytest.mark.parametrize("compensate", [False, True])
def test_sghmc_gradient_noise_and_noise_estimate(compensate):
    """Gradient noise N(0, s^2) adds eps^2 s^2 to the momentum noise; the noise estimate
    B = eps s^2 / 2 removes exactly that, restoring the noiseless stationary law."""
    s = 2.0
    target = harness.correlated_2d(grad_noise=s)
    eps, friction = 0.1, 3.0
    b_hat = eps * s**2 / 2 if compensate else 0.0
    kernel = SGHMC(potential_fn=target, initial_params=target.initial_params(), step_size=eps,
                   friction=friction, noise_estimate=b_hat, num_steps_per_sample=5)
    mcmc = harness.run(kernel, num_samples=600, warmup_steps=40)
    # the exact law with momentum noise variance 2 (C - B) eps + eps^2 s^2
    effective_friction_noise = friction - b_hat + eps * s**2 / 2
    exact = sghmc_exact_cov(target, eps, friction, 1.0,
                            temperature=effective_friction_noise / friction)
    if compensate:
        assert torch.allclose(exact, sghmc_exact_cov(target, eps, friction, 1.0))
    tol, kl_max = (0.1, 0.01) if compensate else (0.25, 0.05)  # uncompensated: inflated law
    harness.check_gaussian(harness.chains_of(mcmc), target.mean, target.cov, exact_cov=exact,
                           target_tol=tol, kl_max=kl_max)


def test_sghmc_gaussian_at_temperature_with_mass():
    target = harness.correlated_2d()
    eps, friction, mass, temp = 0.1, 4.0, 2.0, 0.5
    kernel = SGHMC(potential_fn=target, initial_params=target.initial_params(), step_size=eps,
                   friction=friction, mass=mass, temperature=temp, num_steps_per_sample=5)
    mcmc = harness.run(kernel, num_samples=600, warmup_steps=60)
    exact = sghmc_exact_cov(target, eps, friction, mass, temp)
    harness.check_gaussian(harness.chains_of(mcmc), target.mean, temp * target.cov,
                           exact_cov=exact)


def cyclical_exact_cov(kernel, target, cycles=30, grad_noise=0.0):
    """Covariance at the draws, by running the covariance recursion through whole cycles."""
    a = target.precision.double()
    i = torch.eye(2, dtype=torch.double)
    p = torch.zeros(2, 2, dtype=torch.double)
    at_draw = None
    for t in range(cycles * kernel.cycle_length):
        eps = kernel.step_size_schedule(t)
        temp = 0.0 if kernel.in_exploration(t) else kernel.temperature
        f = i - eps * a
        p = f @ p @ f.T + (2 * eps * temp + eps**2 * grad_noise**2) * i
        if t % kernel.cycle_length == kernel.cycle_length - 1:
            at_draw = p
    return at_draw


def test_cyclical_sgld_schedule_and_draw_positions():
    target = harness.correlated_2d(num_chains=1)
    kernel = CyclicalSGLD(potential_fn=target, initial_params=target.initial_params(),
                          step_size=0.2, cycle_length=10, exploration_fraction=0.5,
                          draws_per_cycle=2)
    assert kernel.step_size_schedule(0) == pytest.approx(0.2)
    assert kernel.step_size_schedule(5) == pytest.approx(0.1)
    assert kernel.step_size_schedule(13) == pytest.approx(0.1 * (math.cos(math.pi * 0.3) + 1))
    assert [kernel.in_exploration(t) for t in range(10)] == [True] * 5 + [False] * 5
    mcmc = harness.run(kernel, num_samples=6, warmup_steps=0)
    assert kernel.num_steps == 30  # 3 cycles, 2 draws each, the last at the end of a cycle
    stats = kernel_diagnostics(mcmc)[0]["sample_stats"]
    expected = [kernel.step_size_schedule(t) for t in (7, 9, 17, 19, 27, 29)]
    assert torch.allclose(stats["step_size"], torch.tensor(expected))


@pytest.mark.parametrize("grad_noise", [0.0, 1.0])
def test_cyclical_sgld_gaussian(grad_noise):
    target = harness.correlated_2d(grad_noise)
    kernel = CyclicalSGLD(potential_fn=target, initial_params=target.initial_params(),
                          step_size=0.4, cycle_length=100, exploration_fraction=0.5)
    mcmc = harness.run(kernel, num_samples=60, warmup_steps=2)
    exact = cyclical_exact_cov(kernel, target, grad_noise=grad_noise)
    # gradient noise inflates the law by eps s^2 / 2 relative: the exact law is the sharp check
    tol, kl_max = (0.1, 0.01) if grad_noise == 0 else (0.25, 0.05)
    harness.check_gaussian(harness.chains_of(mcmc), target.mean, target.cov, exact_cov=exact,
                           target_tol=tol, kl_max=kl_max)


def test_sghmc_from_sgd_matches_momentum_form():
    k = SGHMC.from_sgd(lambda: None, lr=0.1, momentum=0.9, num_data=1000)
    # eta = eps^2 / M = lr / N and alpha = eps C / M = 1 - momentum
    assert k.step_size**2 / k.mass == pytest.approx(0.1 / 1000)
    assert k.step_size * k.friction / k.mass == pytest.approx(0.1)

