"""The draws' configurational temperature (pyro_flat.infer.mcmc.configurational_temperature):
exact on exact draws (also reweighted), recorded at the draws with the gradient there, near 1
for a chain that samples the target full-batch and minibatched, and a warning naming the
site for one that does not (L2E's narrow minibatched draws, an SGLD step near its
stability limit)."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_flat.infer import L2E, SGLD
from pyro_flat.infer.mcmc.configurational_temperature import (
    HIGH_RATIO,
    LOW_RATIO,
    MAX_KEPT,
    ConfigurationalTemperature,
    Z,
)
from pyro_flat.target.layout import FlatLayout

PRECISION = torch.tensor([[2.0, 0.6, 0.0], [0.6, 1.0, 0.3], [0.0, 0.3, 0.5]],
                         dtype=torch.float64)
MEAN = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)


def _gaussian_draws(n: int, scale: float, seed: int) -> torch.Tensor:
    """``n`` exact draws of N(MEAN, scale^2 PRECISION^-1), as ``(n, 1, 3)``."""
    g = torch.Generator().manual_seed(seed)
    chol = torch.linalg.cholesky(torch.linalg.inv(PRECISION))
    z = torch.randn(n, 3, dtype=torch.float64, generator=g)
    return (MEAN + scale * z @ chol.T).unsqueeze(1)


def _record(watch: ConfigurationalTemperature, draws: torch.Tensor, noise: float,
            seed: int) -> None:
    """Record ``draws`` with U's gradient there plus independent Gaussian 'minibatch' noise of
    sd ``noise``."""
    g = torch.Generator().manual_seed(seed)
    for theta in draws:
        grad = (theta - MEAN) @ PRECISION
        watch.record(theta, grad + noise * torch.randn(grad.shape, dtype=grad.dtype,
                                                      generator=g))


def _layout() -> FlatLayout:
    return FlatLayout.from_shapes({"a": torch.Size([1]), "b": torch.Size([2])})


@pytest.mark.parametrize(("scale", "noise"), [(1.0, 0.0), (1.0, 3.0), (0.6, 3.0), (1.5, 0.0)])
def test_exact_draws_give_the_square_of_their_scale(scale, noise):
    """On exact draws of the target with every sd times ``scale`` the estimate of every site is
    ``scale^2``, also with independent noise on the gradient (a minibatch's): within ``Z``
    of the standard errors it reports, which are the Monte Carlo error of 4,000 independent
    draws."""
    watch = ConfigurationalTemperature(_layout().sites, num_chains=1)
    _record(watch, _gaussian_draws(4000, scale, seed=1), noise, seed=2)
    estimate = watch.estimate(temperature=1.0)
    assert set(estimate) == {"a", "b", "all"}
    for e in estimate.values():
        assert abs(e["ratio"] - scale**2) < Z * e["se"], estimate
        assert e["se"] < 0.1 * scale**2  # informative
    # read at another temperature, the ratio is over it
    assert watch.estimate(temperature=2.0)["all"]["ratio"] == pytest.approx(
        estimate["all"]["ratio"] / 2)


def test_the_reported_standard_error_is_the_spread_over_repeats():
    """The standard error a run reports is the sd of its estimate over independent runs (within
    25%, the error of an sd from 40 repeats is about 11%)."""
    ratios, ses = [], []
    for seed in range(40):
        watch = ConfigurationalTemperature(_layout().sites, num_chains=1)
        _record(watch, _gaussian_draws(400, 1.0, seed=100 + seed), 2.0, seed=200 + seed)
        e = watch.estimate(temperature=1.0)["all"]
        ratios.append(e["ratio"])
        ses.append(e["se"])
    spread = torch.tensor(ratios).std().item()
    assert spread == pytest.approx(sum(ses) / len(ses), rel=0.25)


def test_reweighted_draws_give_the_targets_temperature():
    """Draws of a law twice as wide, reweighted to the target, give 1 (raw: 4): the estimate
    reads a kernel's importance weights."""
    draws = _gaussian_draws(20000, 2.0, seed=3)
    centred = (draws[:, 0] - MEAN)
    quad = ((centred @ PRECISION) * centred).sum(-1)
    log_weight = -0.5 * quad + 0.5 * quad / 4.0  # pi(theta) / q(theta), up to a constant
    watch = ConfigurationalTemperature(_layout().sites, num_chains=1)
    _record(watch, draws, 0.0, seed=4)
    raw = watch.estimate(1.0)["all"]
    weighted = watch.estimate(1.0, log_weight=log_weight)["all"]
    assert abs(raw["ratio"] - 4.0) < Z * raw["se"]
    assert abs(weighted["ratio"] - 1.0) < Z * weighted["se"]


def test_a_long_run_keeps_bounded_memory_and_reads_every_draw():
    """10,000 draws: at most MAX_KEPT draws' terms are kept (every 4th here), the estimate still
    reads every draw's, and is right within its standard error."""
    watch = ConfigurationalTemperature(_layout().sites, num_chains=1)
    _record(watch, _gaussian_draws(10_000, 0.8, seed=9), 1.0, seed=10)
    kept, stride = watch.kept_terms()
    assert watch.num_draws == 10_000 and len(kept) <= MAX_KEPT and stride == 4
    e = watch.estimate(1.0)["all"]
    assert abs(e["ratio"] - 0.64) < Z * e["se"]


def test_too_few_draws_give_no_estimate():
    watch = ConfigurationalTemperature(_layout().sites, num_chains=1)
    _record(watch, _gaussian_draws(39, 1.0, seed=5), 0.0, seed=6)
    assert watch.estimate(1.0) == {}


# --------------------------------------------------------------------------- in the kernels

X = torch.randn(400, 2, generator=torch.Generator().manual_seed(7))
Y = X @ torch.tensor([1.0, -2.0]) + 0.5 * torch.randn(400, generator=torch.Generator()
                                                         .manual_seed(8))


def regression(x, y, subsample_size=None):
    """Bayesian linear regression with a learned noise scale."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    with pyro.plate("data", len(x), subsample_size=subsample_size) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, s), obs=y[i])


def _run(kernel, num_samples=300, warmup_steps=200, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps,
                    disable_progbar=True)
        mcmc.run(X, Y, *args)
    said = [str(w.message) for w in caught if "configurational temperature" in str(w.message)]
    return mcmc, kernel.diagnostics()["configurational_temperature"], said


def test_the_terms_are_read_at_the_draws_with_the_gradient_there():
    """Full batch, one chain: each recorded term is ``(theta_t - theta_0) . grad U(theta_t)``
    at the run's draws ``theta_t`` (in the unconstrained space), computed here again from the
    draws MCMC returns."""
    pyro.set_rng_seed(0)
    kernel = SGLD(regression, step_size=2e-4, num_steps_per_sample=3)
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=20, disable_progbar=True)
    mcmc.run(X, Y)
    draws = mcmc.get_samples()
    z = torch.cat([draws["w"], torch.log(draws["s"]).unsqueeze(-1)], -1).double()
    grads = []
    for theta in z:
        theta = theta.clone().requires_grad_(True)
        w, log_s = theta[:2], theta[2]
        u = -(dist.Normal(0.0, 1.0).log_prob(w).sum()
              + dist.HalfNormal(1.0).log_prob(log_s.exp()) + log_s
              + dist.Normal(X.double() @ w, log_s.exp()).log_prob(Y.double()).sum())
        grads.append(torch.autograd.grad(u, theta)[0])
    grads = torch.stack(grads)
    expected = ((z - z[0]) * grads)
    watch = kernel.configurational_temperature
    kept, stride = watch.kept_terms()
    assert stride == 1 and watch.num_draws == 50
    recorded = kept[:, 0].double()  # (draws, sites: w, s)
    torch.testing.assert_close(recorded[:, 0], expected[:, :2].sum(-1), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(recorded[:, 1], expected[:, 2], rtol=2e-3, atol=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("subsample_size", [None, 50])
def test_a_chain_that_samples_the_target_reads_about_one(subsample_size):
    """SGLD with warmup's step, 4 vectorised chains, full batch and minibatched (B = N/8): every
    site within ``Z`` standard errors of 1 plus the Langevin step's bias (1/(1 - eps h / 2)
    along a direction of curvature h: at most 25% at the adapted step, eps h = 0.4 at the top
    curvature), and no warning."""
    pyro.set_rng_seed(1)
    kernel = SGLD(regression, num_steps_per_sample=10, vectorized_chains=4)
    _, estimate, said = _run(kernel, 400, 300, subsample_size)
    for e in estimate.values():
        assert -Z * e["se"] < e["ratio"] - 1.0 < Z * e["se"] + 0.25, estimate
    assert not said


@pytest.mark.slow
def test_l2e_minibatched_draws_too_narrow_warn_naming_a_site():
    """L2E with its shipped meta-parameters on the minibatched regression (B = N/4): its draws
    read a temperature far below 1 (0.15-0.16 on two seeds, se 0.03: their sds about 0.4 of
    the posterior's, 0.0098 against 0.025) and the run warns, naming the site and the
    accepted range."""
    pyro.set_rng_seed(2)
    kernel = L2E(regression, num_steps_per_sample=10, vectorized_chains=4)
    _, estimate, said = _run(kernel, 400, 200, 100)
    assert estimate["all"]["ratio"] + Z * estimate["all"]["se"] < LOW_RATIO
    assert len(said) == 1 and "site '" in said[0] and f"{LOW_RATIO:g} to {HIGH_RATIO:g}" in said[0]
    assert "narrower than the target's" in said[0]


@pytest.mark.slow
def test_a_step_near_its_stability_limit_runs_hot_and_warns():
    """SGLD with a given step at 0.95 of the stability limit 2/h along the likelihood's stiffest
    direction (h = lambda_max(X^T X) / 0.25): the draws' variance is about 1/(1 - 0.95) times
    the target's there, and the run warns that they are wider."""
    pyro.set_rng_seed(3)
    h = float(torch.linalg.eigvalsh(X.T @ X / 0.25).max())
    kernel = SGLD(regression, step_size=0.95 * 2 / h, num_steps_per_sample=5,
                  initial_params={"w": torch.tensor([1.0, -2.0]), "s": torch.tensor(0.5)})
    _, estimate, said = _run(kernel, 400, 100)
    assert estimate["w"]["ratio"] - Z * estimate["w"]["se"] > HIGH_RATIO
    assert len(said) == 1 and "wider than the target's" in said[0]
    assert not math.isnan(estimate["all"]["ratio"])


@pytest.mark.parametrize("chains", [None, 2])
def test_reading_a_minibatched_draw_leaves_the_chain_as_it_was(monkeypatch, chains):
    """The reading's own batch touches no random stream of the chain: the draws of a
    minibatched run are the same to the bit with and without it."""
    def draws(read: bool) -> dict[str, torch.Tensor]:
        if not read:
            monkeypatch.setattr(ConfigurationalTemperature, "wants", lambda self, step: False)
        pyro.set_rng_seed(4)
        kernel = SGLD(regression, step_size=2e-4, num_steps_per_sample=13,
                      vectorized_chains=chains)
        mcmc = MCMC(kernel, num_samples=60, warmup_steps=10, disable_progbar=True)
        mcmc.run(X, Y, 50)
        assert kernel.configurational_temperature.num_draws == (30 if read else 0)
        return mcmc.get_samples()

    read, unread = draws(True), draws(False)
    for name in read:
        assert torch.equal(read[name], unread[name]), name  # (30 reads: every 2nd draw)


NOISE = 0.5


def fixed_noise_regression(x, y, subsample_size=None):
    """Bayesian linear regression with a known noise scale: a Gaussian posterior."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", len(x), subsample_size=subsample_size) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, NOISE), obs=y[i])


@pytest.mark.slow
def test_a_minibatched_reading_is_the_spread_of_the_draws():
    """On a Gaussian posterior (precision P = I + X^T X / sigma^2) the reading of a chain's draws
    is tr(P Sigma_q) / d, Sigma_q their covariance within each chain: checked on L2E's too
    narrow minibatched draws (B = N/4, 4 vectorised chains), where the kernel's own epoch-wise
    batches would read about twice too hot. Tolerance: 3 standard errors of the reading plus
    20% for the sample covariance of the draws (each chain's 600 draws, ESS about 100-200)."""
    pyro.set_rng_seed(5)
    kernel = L2E(fixed_noise_regression, num_steps_per_sample=10, vectorized_chains=4)
    mcmc = MCMC(kernel, num_samples=600, warmup_steps=200, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(X, Y, 100)
        reading = kernel.diagnostics()["configurational_temperature"]["w"]
    w = mcmc.get_samples()["w"].double().transpose(0, 1)  # (chains, draws, 2)
    centred = w - w.mean(1, keepdim=True)
    covariance = torch.einsum("cti,ctj->ij", centred, centred) / (w.shape[0] * (w.shape[1] - 1))
    precision = torch.eye(2, dtype=torch.float64) + X.double().T @ X.double() / NOISE**2
    spread = float(torch.trace(precision @ covariance)) / 2
    assert spread < 0.5  # the draws are narrow: the case the reading is for
    assert abs(reading["ratio"] - spread) < 3 * reading["se"] + 0.2 * spread, (reading, spread)
