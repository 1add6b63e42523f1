"""EntropyMCMC: the stationary joint on Gaussian targets, the smoothed marginal of the guide on a
two-mode target, reduction to SGLD without coupling, draws, checkpoints and bad input."""

import math

import harness
import pyro
import pytest
import torch

from pyro_flat import kernel_diagnostics
from pyro_flat.infer import EntropyMCMC
from pyro_flat.infer.mcmc.entropy import GUIDE_SUFFIX, select_draws


def joint_hessian(target, eta, temperature, tempered=True):
    """Hessian of the joint energy U(theta) + k ||theta - theta_a||^2 / 2 (k = 1/eta, or T/eta
    untempered), whose Langevin law at temperature T is the kernel's target."""
    k = (1.0 if tempered else temperature) / eta
    a = target.precision.double()
    i = torch.eye(len(a), dtype=torch.double)
    return torch.cat([torch.cat([a + k * i, -k * i], 1), torch.cat([-k * i, k * i], 1)])


def joint_chains(mcmc):
    s = mcmc.get_samples()
    return torch.cat([s["x"], s["x" + GUIDE_SUFFIX]], dim=-1).transpose(0, 1)


@pytest.mark.parametrize("friction, temperature, tempered", [
    (None, 1.0, True), (None, 0.5, False), (3.0, 0.5, True),
], ids=["langevin", "langevin-untempered", "underdamped-cold"])
def test_gaussian_joint(friction, temperature, tempered):
    """1024 chains x 600 draws (every 5 steps): means within 0.05 and every covariance within
    10% (of sqrt(C_ii C_jj)) of the paper's stationary joint (theta ~ T Sigma, theta_a ~
    T Sigma + eta T I, or + eta I untempered, Cov(theta, theta_a) = T Sigma), and within Monte
    Carlo error of the exact law of the discretised sampler."""
    target = harness.correlated_2d(num_chains=1024)
    eta = 0.5
    eps = 0.02 if friction is None else 0.1
    kernel = EntropyMCMC(potential_fn=target, initial_params=target.initial_params(),
                         step_size=eps, eta=eta, friction=friction, temperature=temperature,
                         dynamics="langevin" if friction is None else "underdamped",
                         tempered_coupling=tempered, num_steps_per_sample=5)
    mcmc = harness.run(kernel, num_samples=600, warmup_steps=60)
    h = joint_hessian(target, eta, temperature, tempered)
    if friction is None:
        exact = harness.langevin_exact_cov(h, eps, temperature)
    else:
        exact = harness.underdamped_exact_cov(h, eps, friction, 1.0, temperature)
    m, c, se_m, se_c = harness.moments_with_errors(joint_chains(mcmc))
    t_sigma = temperature * target.cov.double()
    width = eta * (temperature if tempered else 1.0)
    paper = torch.cat([torch.cat([t_sigma, t_sigma], 1),
                       torch.cat([t_sigma, t_sigma + width * torch.eye(2)], 1)])
    mean = target.mean.double().repeat(2)
    assert torch.all((m - mean).abs() <= harness.Z * se_m)
    assert torch.all((c - exact).abs() <= harness.Z * se_c), (c, exact, se_c)
    assert torch.all((m - mean).abs() <= 0.05)
    scale = paper.diagonal().sqrt()
    scale = scale.unsqueeze(0) * scale.unsqueeze(1)
    assert torch.all((c - paper).abs() <= 0.1 * scale)
    assert float(((harness.Z * se_c + (exact - paper).abs()) / scale).max()) < 0.1, "too short"


def test_guide_marginal_is_the_smoothed_density():
    """x ~ 0.5 N(-2, 0.1^2) + 0.5 N(2, 1): the guide's histogram matches the density smoothed by
    N(0, eta) (computed by quadrature), which flattens the sharp peak and keeps the wide one.
    1024 chains start exactly in the target, half in each mode (no barrier crossing is needed)."""
    k = 1024
    sd = torch.tensor([0.1, 1.0])
    loc = torch.tensor([-2.0, 2.0])

    def potential(p):
        x = p["x"].unsqueeze(-1)
        log = torch.distributions.Normal(loc, sd).log_prob(x) + math.log(0.5)
        return -torch.logsumexp(log, -1).sum()

    g = torch.Generator().manual_seed(0)
    comp = torch.arange(k) >= k // 2
    x0 = torch.where(comp, loc[1] + sd[1] * torch.randn(k, generator=g),
                     loc[0] + sd[0] * torch.randn(k, generator=g))
    eta = 0.25
    kernel = EntropyMCMC(potential_fn=potential, initial_params={"x": x0}, step_size=1e-3,
                         eta=eta, num_steps_per_sample=20)
    mcmc = harness.run(kernel, num_samples=200, warmup_steps=100)
    guide = mcmc.get_samples()["x" + GUIDE_SUFFIX].T  # (chains, draws)
    n_eff = float(harness.ess(guide.unsqueeze(-1)).min())
    edges = torch.linspace(-5.0, 6.0, 23, dtype=torch.double)
    grid = torch.linspace(-5.0, 6.0, 22001, dtype=torch.double)
    smoothed = sum(0.5 * torch.distributions.Normal(m, math.sqrt(s**2 + eta)).log_prob(grid).exp()
                   for m, s in zip(loc.double(), sd.double(), strict=True))
    cdf = torch.cumulative_trapezoid(smoothed, grid)
    cdf = torch.cat([torch.zeros(1, dtype=torch.double), cdf])
    expected = torch.diff(torch.tensor([float(cdf[int(i)]) for i in
                                        ((edges + 5) / 11 * 22000).round()]))
    observed = torch.histc(guide.double().flatten(), bins=22, min=-5.0, max=6.0) / guide.numel()
    tol = harness.Z * (expected * (1 - expected) / n_eff).sqrt() + 2e-3
    assert torch.all((observed - expected).abs() <= tol), (observed, expected, tol)
    # the sharp mode is erased in the guide: its peak bin holds far less than theta's
    theta = mcmc.get_samples()["x"].double().flatten()
    peak = ((theta > -2.25) & (theta < -1.75)).double().mean()
    assert float(((guide > -2.25) & (guide < -1.75)).double().mean()) < 0.6 * float(peak)


@pytest.mark.parametrize("friction", [None, 100.0])
def test_prefetched_guide_noise_gives_the_same_draws(friction):
    """The guide's noise drawn ahead on a worker thread, in blocks, or in line: same draws."""
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=50)
    runs = []
    for prefetch in (True, False):
        kernel = EntropyMCMC(model, step_size=1e-4, eta=1e-2, friction=friction,
                             dynamics="langevin" if friction is None else "underdamped",
                             num_steps_per_sample=3)
        kernel.prefetch_noise = prefetch
        runs.append(harness.run(kernel, 30, 5, 4, x, y).get_samples())
    assert runs[0].keys() == runs[1].keys()
    for site, values in runs[0].items():
        assert torch.equal(values, runs[1][site]), site


def test_draws_stats_and_select_draws():
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=50)
    mcmc = harness.run(EntropyMCMC(model, step_size=1e-4, eta=1e-2), 20, 5, 0, x, y)
    samples = mcmc.get_samples()
    assert set(samples) == {"net.weight", "net.bias", "net.weight__guide", "net.bias__guide"}
    stats = kernel_diagnostics(mcmc)[0]["sample_stats"]
    dist = torch.cat([(samples["net.weight"] - samples["net.weight__guide"]).flatten(1),
                      (samples["net.bias"] - samples["net.bias__guide"]).flatten(1)], 1).norm(dim=1)
    assert torch.allclose(stats["coupling_distance"], dist, rtol=1e-5)
    both = select_draws(samples, "both")
    assert both["net.weight"].shape == (40, 1, 2)
    assert torch.equal(select_draws(samples, "guide")["net.bias"], samples["net.bias__guide"])
    predictive = pyro.infer.Predictive(model, posterior_samples=select_draws(samples, "guide"))
    assert predictive(x, y)["obs"].shape[0] == 20
    with pytest.raises(ValueError, match="which must be"):
        select_draws(samples, "all")


def test_kernel_pickles_after_a_run():
    # the guide's noise is drawn on a worker thread; the kernel must still pickle (spawn workers)
    import pickle

    x, y = torch.randn(50, 2), (torch.randn(50) > 0).float()
    kernel = EntropyMCMC(harness.logistic_model, step_size=1e-3, eta=0.1)
    pyro.infer.MCMC(kernel, num_samples=3, warmup_steps=0, disable_progbar=True).run(x, y)
    clone = pickle.loads(pickle.dumps(kernel))
    pyro.infer.MCMC(clone, num_samples=3, warmup_steps=0, disable_progbar=True).run(x, y)
