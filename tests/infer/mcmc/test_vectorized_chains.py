"""Vectorised chains of every kernel: ``vectorized_chains=K`` runs K chains of a Pyro model in
one kernel (``torch.func.vmap`` over the chains), each following its single-chain rule.

Without noise (``temperature=0``) chain ``k`` must be the single-chain run seeded with
``initial_seed + k`` (its initial values and minibatches come from that stream), up to the
rounding of batched against unbatched matrix products: compared at a relative tolerance of
1e-4 after 8 draws of 3 steps. With noise, the pooled chains must sample the exact stationary
law of the (unadjusted) Langevin chain on a conjugate regression, within Monte Carlo error.
"""

import fixed_seed_runs
import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroSample

import pyro_flat
from pyro_flat.infer import L2E, SASGLD, SGHMC, SGLD, ContourSGLD, CyclicalSGLD, EntropyMCMC
from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet

K = 3
SEED = 11


def _meta() -> MetaNet:
    return MetaNet.init(torch.Generator().manual_seed(0), planted=3.0, descent=30.0)


#: name -> kernel factory (model, **kwargs); every one at temperature 0, 3 SG steps per draw
KERNELS = {
    "SGLD": lambda m, **kw: SGLD(m, 1e-3, **kw),
    "SGHMC": lambda m, **kw: SGHMC(m, 1e-2, friction=10.0, **kw),
    "CyclicalSGLD": lambda m, **kw: CyclicalSGLD(m, 1e-3, cycle_length=6, **kw),
    "EntropyMCMC": lambda m, **kw: EntropyMCMC(m, 1e-3, eta=0.05, **kw),
    "EntropyMCMC-underdamped": lambda m, **kw: EntropyMCMC(
        m, 1e-2, eta=0.5, dynamics="underdamped", friction=10.0, **kw),
    "ContourSGLD": lambda m, **kw: ContourSGLD(m, 1e-3, num_bins=8, auto_bins=True, zeta=0.5,
                                               **kw),
    "SASGLD": lambda m, **kw: SASGLD(m, 1e-3, rho=0.05, **kw),
    "SASGLD-geometry": lambda m, **kw: SASGLD(m, 1e-3, rho=0.05, geometry=True, **kw),
    "L2E": lambda m, **kw: L2E(m, 1e-2, meta_params=_meta(), **kw),
}


def _run(name, seed, num_samples=8, warmup=4, **kw):
    model = fixed_seed_runs.mlp_model()
    steps = {} if name == "CyclicalSGLD" else {"num_steps_per_sample": 3}
    kernel = KERNELS[name](model, temperature=0.0, **steps, **kw)
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(*fixed_seed_runs.mlp_data())
    return mcmc


@pytest.mark.parametrize("name", list(KERNELS))
def test_noiseless_chains_are_the_separate_runs(name):
    together = _run(name, SEED, vectorized_chains=K)
    draws = pyro_flat.get_samples(together, group_by_chain=True)
    stats = pyro_flat.sample_stats(together, group_by_chain=True)
    for k in range(K):
        alone = _run(name, SEED + k)
        for site, value in alone.get_samples().items():
            torch.testing.assert_close(draws[site][k], value, rtol=1e-4, atol=1e-5,
                                       msg=f"{site}, chain {k}")
        for stat, value in pyro_flat.sample_stats(alone).items():
            torch.testing.assert_close(stats[stat][k].to(value.dtype), value, rtol=1e-4,
                                       atol=1e-4, msg=f"{stat}, chain {k}")
    # the chains differ (their minibatches do), so the comparison could fail
    weights = draws["net.0.weight"]
    assert not torch.allclose(weights[0], weights[1], rtol=1e-3)


@pytest.mark.parametrize("name", list(KERNELS))
def test_one_vectorized_chain_runs_as_the_single_chain(name):
    """``vectorized_chains=1`` evaluates its one chain's potential as a single chain does (no
    vmap): without noise its draws and statistics are the single chain's, bit for bit, with
    the chain dimension kept."""
    one = _run(name, SEED, vectorized_chains=1)
    alone = _run(name, SEED)
    assert one.kernel.potential_chains is None
    for site, value in alone.get_samples().items():
        assert one.get_samples()[site].shape == (value.shape[0], 1, *value.shape[1:])
        assert torch.equal(one.get_samples()[site][:, 0], value), site
    stats = pyro_flat.sample_stats(one, group_by_chain=True)
    for stat, value in pyro_flat.sample_stats(alone).items():
        assert torch.equal(stats[stat][0].to(value.dtype), value), stat


def test_chains_sample_the_exact_langevin_law_of_a_conjugate_regression():
    """16 vectorised SGLD chains on the full-batch Bayesian linear regression: pooled mean and
    covariance of (w1, w2, b) within Z = 4.5 Monte Carlo standard errors of the exact
    stationary law of the unadjusted Langevin chain (and within 0.1 of the posterior's, KL
    below 0.01; the step is a tenth of the stability limit, so the chain's own law is within
    about 5% of the posterior's)."""
    x, y = harness.linear_regression_data(n=100)
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=None)
    eps = 1e-3
    kernel = SGLD(model, eps, num_steps_per_sample=5, vectorized_chains=16)
    mcmc = harness.run(kernel, 300, 50, 0, x, y)
    draws = pyro_flat.get_samples(mcmc, group_by_chain=True)
    chains = torch.cat([draws["net.weight"].reshape(16, 300, -1),
                        draws["net.bias"].reshape(16, 300, -1)], -1)
    mean, cov = harness.linear_regression_posterior(x, y, 2.0, 1.0)
    exact = harness.langevin_exact_cov(torch.linalg.inv(cov), eps)
    harness.check_gaussian(chains, mean, cov, exact_cov=exact)


def test_to_arviz_and_the_statistics_have_k_chains():
    mcmc = _run("EntropyMCMC", SEED, vectorized_chains=K)
    idata = pyro_flat.to_arviz(mcmc)
    assert idata.posterior["net.0.weight"].shape[:2] == (K, 8)
    assert idata.posterior["net.0.weight__guide"].shape[:2] == (K, 8)
    assert idata.sample_stats["coupling_distance"].shape == (K, 8)
    assert idata.sample_stats["lp"].shape == (K, 8)
    assert idata.log_likelihood["obs"].shape == (K, 8, 64)
    assert tuple(mcmc.get_samples()["net.0.bias"].shape) == (8, K, 8)  # Pyro's own view
    assert pyro_flat.sample_stats(mcmc)["lp"].shape == (K * 8,)


@pytest.mark.parametrize("name", ["SGLD", "EntropyMCMC", "ContourSGLD", "L2E"])
def test_resume_is_bitwise(name):
    """4 + 12 draws at once, and 4 + 6 draws, a checkpoint, 6 more in a new kernel: equal."""
    x, y = fixed_seed_runs.mlp_data()

    def make():
        return KERNELS[name](fixed_seed_runs.mlp_model(), num_steps_per_sample=2,
                             vectorized_chains=K)

    whole = harness.run(make(), 12, 4, 5, x, y)
    first = harness.run(make(), 6, 4, 5, x, y)
    resumed = make()
    resumed.load_state_dict(first.kernel.state_dict())
    second = harness.run(resumed, 6, 0, 99, x, y)
    for site, value in whole.get_samples().items():
        assert torch.equal(value[6:], second.get_samples()[site]), site
    with pytest.raises(ValueError, match="vectorized_chains"):
        single = KERNELS[name](fixed_seed_runs.mlp_model(), num_steps_per_sample=2)
        single.load_state_dict(first.kernel.state_dict())
        harness.run(single, 2, 0, 0, x, y)


def _bad_second_chain(params):
    """Chain 0: U = x^2 / 2; chain 1: U = sqrt(1 - x) x^2 / 2, whose value and gradient are
    NaN wherever x > 1."""
    x = params["x"][:, 0]
    return torch.stack([0.5 * x[0] ** 2, 0.5 * x[1] ** 2 * torch.sqrt(1 - x[1])])


def test_a_non_finite_chain_falls_back_alone_and_stops_by_name():
    start = {"x": torch.tensor([[3.0], [3.0]])}
    kernel = SGLD(potential_fn=_bad_second_chain, initial_params=start, step_size=0.1,
                  temperature=0.0, vectorized_chains=2, max_nonfinite_steps=5)
    message = r"chain 1 of 2 diverged: .* 5 of the last 5 SG steps .* step 4 .* sites \['x'\]"
    with pytest.raises(RuntimeError, match=message):
        harness.run(kernel, 10, 0, 0)
    kernel = SGLD(potential_fn=_bad_second_chain, initial_params=start, step_size=0.1,
                  temperature=0.0, vectorized_chains=2, max_nonfinite_steps=100)
    mcmc = harness.run(kernel, 4, 0, 0)
    x = mcmc.get_samples()["x"][:, :, 0]
    assert torch.allclose(x[:, 0], 3.0 * 0.9 ** torch.arange(1, 5.0))  # gradient descent
    assert torch.equal(x[:, 1], torch.full((4,), 3.0))  # stays, every step refused
    diverging = pyro_flat.sample_stats(mcmc, group_by_chain=True)["diverging"]
    assert diverging[1].all() and not diverging[0].any()


def test_a_blown_up_chain_is_named():
    """Chain 2's gradient is 1e6 where the others' are about 1: the run warns, naming it."""

    def potential(params):
        x = params["x"][:, 0]
        return torch.stack([0.5 * x[0] ** 2, 0.5 * x[1] ** 2, 1e6 * x[2]])

    kernel = SGLD(potential_fn=potential, initial_params={"x": torch.ones(3, 1)},
                  step_size=1e-9, temperature=0.0, vectorized_chains=3)
    with pytest.warns(RuntimeWarning, match=r"at draw 0 of chain 2 is 1e\+06"):
        harness.run(kernel, 6, 0, 0)


def test_adaptation_takes_the_smallest_step_of_the_chains():
    x, y = harness.linear_regression_data(n=100)
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=20)
    kernel = SGLD(model, num_steps_per_sample=2, vectorized_chains=4, preconditioner="diag")
    mcmc = harness.run(kernel, 10, 20, 0, x, y)
    record = mcmc.diagnostics()["step_size_adaptation"]["chain 0"][-1]
    stable = 0.2 * record["stability_limit"]  # and smaller where the minibatch noise is large
    if record["noise_limited"]:
        assert record["step_size"] < stable
    else:
        assert record["step_size"] == pytest.approx(stable)
    inverse_mass = mcmc.diagnostics()["inverse_mass"]["chain 0"]["net.weight"]
    assert inverse_mass.shape == (4, 1, 2)  # one metric per chain
    step = pyro_flat.sample_stats(mcmc, group_by_chain=True)["step_size"]
    assert step.shape == (4, 10) and bool((step == record["step_size"]).all())


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="vectorized_chains must be an integer >= 1"):
        SGLD(fixed_seed_runs.mlp_model(), 1e-3, vectorized_chains=0)
    kernel = SGLD(potential_fn=lambda p: p["x"].sum(), initial_params={"x": torch.zeros(3)},
                  step_size=0.1, vectorized_chains=2)
    with pytest.raises(ValueError, match="leading dimension of size 2"):
        harness.run(kernel, 2, 0, 0)

    with pytest.raises(ValueError, match="potential_fn must return one energy per chain"):
        harness.run(SGLD(potential_fn=lambda p: p["x"].sum(),
                         initial_params={"x": torch.zeros(2, 1)}, step_size=0.1,
                         vectorized_chains=2), 2, 0, 0)


# ------------------------------------------------------------- BatchNorm in training mode


class BatchNormRegression(PyroModule):
    """A 3-8-1 regression network with BatchNorm (training mode), written as a Pyro user
    writes it, minibatched by its plate (16 of 64 points)."""

    def __init__(self):
        super().__init__()
        self.fc1 = PyroModule[torch.nn.Linear](3, 8)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([8, 3]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([8]).to_event(1))
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = PyroModule[torch.nn.Linear](8, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 8]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        plate = pyro.plate("data", len(x), subsample_size=16)
        with plate as i:
            pass
        mean = self.fc2(torch.tanh(self.bn(self.fc1(x[i])))).squeeze(-1)
        with plate:
            pyro.sample("y", dist.Normal(mean, 0.5), obs=None if y is None else y[i])


def _batchnorm_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    return x, torch.tanh(x.sum(-1)) + 0.1 * torch.randn(64, generator=g)


def _batchnorm_run(seed, **kw):
    model = BatchNormRegression()
    pyro.set_rng_seed(seed)
    kernel = SGLD(model, 1e-3, temperature=0.0, num_steps_per_sample=3, **kw)
    mcmc = MCMC(kernel, num_samples=6, warmup_steps=2, disable_progbar=True)
    mcmc.run(*_batchnorm_data())
    return mcmc, model


def test_batchnorm_in_training_mode_normalises_each_chain_with_its_own_minibatch():
    """Before: torch.func's raw error ("Batch norm got a batched tensor as input while the
    running_mean or running_var ... were not batched"). Now each chain uses its minibatch's
    statistics, as its single-chain run does: chain k equals the single-chain run seeded with
    SEED + k (its own minibatches), at the tolerance of the tests above. The vectorised steps
    leave the running statistics alone: only the setup's trace of each chain moved them."""
    together, model = _batchnorm_run(SEED, vectorized_chains=K)
    assert model.bn.training and int(model.bn.num_batches_tracked) == K
    draws = pyro_flat.get_samples(together, group_by_chain=True)
    for k in range(K):
        alone, single = _batchnorm_run(SEED + k)
        assert int(single.bn.num_batches_tracked) > 8 * 3  # a single chain updates them
        for site, value in alone.get_samples().items():
            torch.testing.assert_close(draws[site][k], value, rtol=1e-4, atol=1e-5,
                                       msg=f"{site}, chain {k}")
    assert not torch.allclose(draws["fc1.weight"][0], draws["fc1.weight"][1], rtol=1e-3)


NETWORKS = {"net": torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8),
                                       torch.nn.Tanh(), torch.nn.Linear(8, 1))}


def hidden_network_model(x, y):
    """A BatchNorm network the kernel cannot reach (in a dict, not an attribute or global)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    mean = NETWORKS["net"](x * w).squeeze(-1)
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(mean, 0.5), obs=y)


def test_an_unreachable_batchnorm_layer_is_a_clear_error():
    kernel = SGLD(hidden_network_model, 1e-3, vectorized_chains=2)
    with pytest.raises(ValueError, match=r"vectorized_chains: a BatchNorm layer in training "
                                         r"mode that is not reachable from the model"):
        MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(
            *_batchnorm_data())
