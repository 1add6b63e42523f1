"""The HMC reference against a posterior known in closed form."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops.stats import effective_sample_size

from pyro_flat.evaluation.hmc_reference import (
    HMCReference,
    ReferenceWarning,
    hmc_reference,
    reference_predictive,
)
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Bernoulli, Categorical, HomoskedasticGaussian

Z = 4.0  # tolerances are Z Monte Carlo standard errors
NOISE, PRIOR = 0.5, 1.0


def _linear_data():
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, 8).unsqueeze(1)
    y = 0.3 + 1.5 * x.squeeze(1) + NOISE * torch.randn(8, generator=g)
    return x, y


def _linear_bnn():
    return BNN(torch.nn.Linear(1, 1), HomoskedasticGaussian(scale=NOISE), prior_scale=PRIOR)


def _closed_form(x, y, x_test):
    """Posterior of (weight, bias) ~ N(0, PRIOR^2 I) under y ~ N(w x + b, NOISE^2):
    Sigma = (Phi'Phi / NOISE^2 + I / PRIOR^2)^-1, mu = Sigma Phi'y / NOISE^2; the latent
    f* = phi*'theta has mean phi*'mu and variance phi*'Sigma phi*, y* adds NOISE^2."""
    phi = torch.cat([x, torch.ones_like(x)], 1).double()
    precision = phi.T @ phi / NOISE**2 + torch.eye(2, dtype=torch.float64) / PRIOR**2
    cov = torch.linalg.inv(precision)
    mean = cov @ phi.T @ y.double() / NOISE**2
    phi_test = torch.cat([x_test, torch.ones_like(x_test)], 1).double()
    return phi_test @ mean, (phi_test @ cov * phi_test).sum(1)


def _check_moments(draws, mean, var, num_chains):
    """Mean and variance of each column of chain-major draws against the exact values, within
    Z standard errors: se(mean) = sd / sqrt(ESS) with ESS of the draws, se(var) = var
    sqrt(2 / ESS') (Gaussian draws: Var s^2 = 2 sigma^4 / n) with ESS' of the squared
    deviations; ESS by pyro.ops.stats.effective_sample_size over the chains."""
    d = draws.double()
    chains = d.reshape(num_chains, -1, d.shape[1])
    ess = effective_sample_size(chains, chain_dim=0, sample_dim=1)
    ess_sq = effective_sample_size((chains - mean) ** 2, chain_dim=0, sample_dim=1)
    se_mean = var.sqrt() / ess.sqrt()
    se_var = var * (2 / ess_sq).sqrt()
    assert bool(((d.mean(0) - mean).abs() <= Z * se_mean).all()), (d.mean(0), mean, se_mean)
    assert bool(((d.var(0) - var).abs() <= Z * se_var).all()), (d.var(0), var, se_var)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:FutureWarning")
def test_conjugate_linear_regression_matches_the_closed_form():
    """A linear BNN with a Normal prior and known noise: posterior and predictive are Gaussian
    in closed form (see _closed_form). Checked: the draws of f* = w x* + b and the reference
    predictive draws of y* (noise included) at inputs inside and outside the data, mean and
    variance within Z = 4 ESS-based standard errors (_check_moments); R-hat < 1.01 and bulk
    ESS >= 100 per chain. 2 chains of 200 + 1000 steps: R-hat's own sampling noise shrinks
    like 1 / draws; with 400 draws per chain, R-hat exceeded 1.01 for 2 of seeds 0-7 by that
    noise alone (the moments passed), with 1000 it stayed <= 1.0034 for seeds 0-11, a third of
    the threshold. jit_compile (passed to NUTS) halves the time."""
    x, y = _linear_data()
    x_test = torch.tensor([[-2.0], [0.0], [0.5], [3.0]])
    mean, var_f = _closed_form(x, y, x_test)
    ref = hmc_reference(_linear_bnn(), x, y, num_chains=2, num_samples=1000, warmup_steps=200,
                        seed=0, jit_compile=True, ignore_jit_warnings=True)
    assert isinstance(ref, HMCReference) and ref.converged and ref.problems == []
    assert ref.max_rhat < 1.01 and ref.min_ess_bulk >= 200 and ref.divergences == [0, 0]
    assert set(ref.rhat) == set(ref.ess_bulk) == {"net.weight", "net.bias"}
    assert ref.samples["net.weight"].shape == (2000, 1, 1)
    assert ref.samples_by_chain["net.bias"].shape == (2, 1000, 1)
    w, b = ref.samples["net.weight"].reshape(-1, 1), ref.samples["net.bias"].reshape(-1, 1)
    _check_moments(w * x_test.T + b, mean, var_f, num_chains=2)
    draws = ref.predictive(x_test)
    assert draws.shape == (2000, 4)
    _check_moments(draws, mean, var_f + NOISE**2, num_chains=2)


def _tiny_run(seed, model=None, **kwargs):
    x, y = _linear_data()
    return hmc_reference(model or _linear_bnn(), x, y, num_chains=2, num_samples=10,
                         warmup_steps=10, seed=seed, on_failure="ignore", **kwargs)


def test_same_seed_same_draws_and_the_global_random_state_is_kept():
    model = _linear_bnn()  # (building it draws the initial weights of nn.Linear)
    pyro.set_rng_seed(123)
    ref = _tiny_run(3, model)
    after = torch.rand(3)
    pyro.set_rng_seed(123)
    expected = torch.rand(3)
    assert torch.equal(after, expected)  # the run left the caller's random stream alone
    again, other = _tiny_run(3), _tiny_run(4)
    for site, value in ref.samples_by_chain.items():
        assert torch.equal(value, again.samples_by_chain[site])
        assert not torch.equal(value, other.samples_by_chain[site])
        assert not torch.equal(value[0], value[1])  # the chains are independent
    assert ref.chain_seeds == again.chain_seeds and len(set(ref.chain_seeds)) == 2


def _stuck_run(on_failure):
    """Chains that cannot move (tiny fixed step, no adaptation): they stay near their
    different starting points, so R-hat is huge and the ESS tiny, whatever the seed."""
    x, y = _linear_data()
    return hmc_reference(_linear_bnn(), x, y, num_chains=2, num_samples=8, warmup_steps=0,
                         on_failure=on_failure, step_size=1e-5, adapt_step_size=False,
                         max_tree_depth=1)


def test_chains_start_at_prior_draws():
    """Chains that cannot move stay at their starts: each a different draw from a prior of
    scale 0.01, not Pyro's uniform(-2, 2) (which puts |w| > 0.05 with probability 0.975 per
    element, so 20 elements all that small has probability 0.025**20 under it); under the
    prior, |w| > 0.05 (5 sd) has probability 6e-7 per element."""

    def model():
        pyro.sample("w", dist.Normal(0.0, 0.01).expand([10]).to_event(1))

    ref = hmc_reference(model, num_chains=2, num_samples=4, warmup_steps=0,
                        on_failure="ignore", step_size=1e-7, adapt_step_size=False,
                        adapt_mass_matrix=False, max_tree_depth=1)
    w = ref.samples_by_chain["w"]  # (2 chains, 4 draws, 10)
    assert bool(w.abs().max() < 0.05)
    assert not torch.allclose(w[0, 0], w[1, 0], atol=1e-4)  # different starts


def test_an_unconverged_reference_is_flagged_and_warned_about():
    with pytest.warns(ReferenceWarning, match=r"max R-hat .* > max_rhat = 1.01.*min bulk ESS"):
        ref = _stuck_run("warn")
    assert not ref.converged and ref.max_rhat > 1.5 and ref.min_ess_bulk < 200
    assert len(ref.problems) == 2
    with pytest.raises(RuntimeError, match="failed its convergence checks"):
        _stuck_run("raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceWarning)
        assert not _stuck_run("ignore").converged
    # the thresholds are arguments, and the checks cut exactly at them
    ref = _tiny_run(0)
    assert ref.max_rhat > 1 and ref.min_ess_bulk > 0
    below = _tiny_run(0, max_rhat=ref.max_rhat * (1 - 1e-9), min_ess=ref.min_ess_bulk * 1.001)
    assert [p.split(" ")[1] for p in below.problems] == ["R-hat", "bulk"]
    above = _tiny_run(0, max_rhat=ref.max_rhat * (1 + 1e-9), min_ess=ref.min_ess_bulk * 0.999)
    assert above.converged and above.problems == []
    # a step far too large for the posterior diverges (and sticks: R-hat is inf too)
    wild = dict(step_size=50.0, adapt_step_size=False)
    diverged = _tiny_run(0, **wild)
    assert min(diverged.divergences) > 0 and not diverged.converged
    assert diverged.problems[-1].startswith("divergent transitions per chain")
    unchecked = _tiny_run(0, max_divergences=None, **wild)
    assert not any(p.startswith("divergent") for p in unchecked.problems)


def test_reference_predictive_of_classifiers():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 2, generator=g)
    samples = {"net.weight": torch.randn(5, 3, 2, generator=g),
               "net.bias": torch.randn(5, 3, generator=g)}
    expected = torch.softmax(torch.einsum("sij,nj->sni", samples["net.weight"], x)
                             + samples["net.bias"][:, None], -1).mean(0)
    # a BNN goes through bma_probs
    model = BNN(torch.nn.Linear(2, 3), Categorical())
    assert torch.allclose(reference_predictive(model, samples, x), expected, atol=1e-6)

    # any Pyro model with a Categorical site, through its distribution per draw
    def plain(x):
        w = pyro.sample("net.weight", dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
        b = pyro.sample("net.bias", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with pyro.plate("data", len(x)):
            return pyro.sample("y", dist.Categorical(logits=x @ w.T + b))

    assert torch.allclose(reference_predictive(plain, samples, x, obs_site="y"), expected,
                          atol=1e-6)
    # Bernoulli: two classes [1 - p, p]
    bern = BNN(torch.nn.Linear(2, 1), Bernoulli())
    draws = {"net.weight": samples["net.weight"][:, :1], "net.bias": samples["net.bias"][:, :1]}
    p = torch.sigmoid(x @ draws["net.weight"][:, 0].T + draws["net.bias"][:, 0]).mean(1)
    probs = reference_predictive(bern, draws, x)
    assert torch.allclose(probs, torch.stack([1 - p, p], 1), atol=1e-6)
    with pytest.raises(ValueError, match=r"is a Normal, not a Categorical or Bernoulli"):
        reference_predictive(_linear_bnn(), {"net.weight": torch.zeros(3, 1, 1),
                                             "net.bias": torch.zeros(3, 1)},
                             x[:, :1], kind="classification")


def test_reference_predictive_of_regression_includes_the_noise_and_is_seeded():
    """Every draw is the point w = 2, b = 1: y* ~ N(2 x + 1, NOISE^2) exactly, so the mean and
    variance of S = 1000 iid draws are within Z standard errors NOISE / sqrt(S) and
    NOISE^2 sqrt(2 / S)."""
    s = 1000
    samples = {"net.weight": torch.full((s, 1, 1), 2.0), "net.bias": torch.full((s, 1), 1.0)}
    x = torch.tensor([[-1.0], [0.0], [2.0]])
    model = _linear_bnn()
    pyro.set_rng_seed(7)
    draws = reference_predictive(model, samples, x, seed=1)
    after = torch.rand(2)
    pyro.set_rng_seed(7)
    assert torch.equal(after, torch.rand(2))  # the caller's random stream is untouched
    assert draws.shape == (s, 3)
    few = {k: v[:20] for k, v in samples.items()}
    assert torch.equal(draws[:20], reference_predictive(model, few, x, seed=1))
    assert not torch.equal(draws[:20], reference_predictive(model, few, x, seed=2))
    mean = 2 * x.squeeze(1) + 1
    assert bool(((draws.mean(0) - mean).abs() <= Z * NOISE / math.sqrt(s)).all())
    assert bool(((draws.var(0) - NOISE**2).abs() <= Z * NOISE**2 * math.sqrt(2 / s)).all())


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_chains=1), r"num_chains must be an integer >= 2"),
    (dict(num_samples=3), r"num_samples must be an integer >= 4"),
    (dict(warmup_steps=-1), r"warmup_steps must be an integer >= 0"),
    (dict(seed=-1), r"seed must be an integer >= 0"),
    (dict(max_rhat=1.0), r"max_rhat must be a number > 1"),
    (dict(min_ess=0), r"min_ess must be a finite number in \(0, inf\)"),
    (dict(max_divergences=-1), r"max_divergences must be an integer >= 0"),
    (dict(on_failure="skip"), r"on_failure must be 'warn', 'raise' or 'ignore'"),
    (dict(model_kwargs=[1]), r"model_kwargs must be a dict"),
    (dict(step_sise=0.1), r"nuts_kwargs are not arguments of pyro.infer.NUTS"),
])
def test_bad_hmc_reference_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hmc_reference(_linear_bnn(), *_linear_data(), **kwargs)


def test_bad_model_and_predictive_arguments():
    x = torch.zeros(3, 1)
    good = {"net.weight": torch.zeros(4, 1, 1), "net.bias": torch.zeros(4, 1)}
    with pytest.raises(ValueError, match=r"model must be a Pyro model \(a callable\)"):
        hmc_reference("model", x)
    bad = [
        (dict(samples={}), r"samples must be a non-empty dict"),
        (dict(samples={"net.weight": torch.zeros(4, 1, 1)}),
         r"samples has no draws of the model's latent sites \['net.bias'\]"),
        (dict(samples={"net.weight": torch.zeros(4, 1, 1), "net.bias": torch.zeros(5, 1)}),
         r"same number \(>= 1\) of draws"),
        (dict(kind="ranking"), r"kind must be 'auto', 'classification' or 'regression'"),
        (dict(obs_site="y"), r"obs_site 'y' is not a sampled site .* \['net.bias', "),
        (dict(seed=1.5), r"seed must be an integer >= 0"),
    ]
    for change, match in bad:
        kwargs = {"samples": good, **change}
        with pytest.raises(ValueError, match=match):
            reference_predictive(_linear_bnn(), kwargs.pop("samples"), x, **kwargs)
    with pytest.raises(ValueError, match=r"obs_site 'obs' is not a sampled site"):
        reference_predictive(_linear_bnn(), good, x, torch.zeros(3))  # targets passed
