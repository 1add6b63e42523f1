"""The SG-MCMC kernel base through Pyro's whole user path: models, minibatches, MCMC driver,
worker processes, checkpoints, divergences and argument checks."""

import math

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide.initialization import init_to_value

from pyro_flat import kernel_diagnostics
from pyro_flat.infer import SGHMC, SGLD

SIGMA, PRIOR = 1.0, 2.0


def regression_check(mcmc, x, y, eps, batch):
    """Posterior mean within Z standard errors (SGLD's mean is unbiased on a linear-Gaussian
    model, minibatch noise included) and posterior std within Z relative standard errors plus
    the known O(eps) inflation from discretisation and minibatch gradient noise."""
    draws = harness.regression_draws(mcmc).double()
    mean, cov = harness.linear_regression_posterior(x, y, PRIOR, SIGMA)
    n_eff = harness.ess(draws.unsqueeze(0))
    se = (draws.var(0) / n_eff).sqrt()
    assert torch.all((draws.mean(0) - mean).abs() <= harness.Z * se), (draws.mean(0), mean, se)
    # inflation of the variance: eps/2 * (lambda_max(A) + lambda_max(V)) / lambda_min(A)
    design = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    lam = torch.linalg.eigvalsh(torch.linalg.inv(cov))
    resid = (y.double() - design @ mean) / SIGMA**2
    per_datum = resid.unsqueeze(1) * design
    n = len(x)
    v = n * n / batch * (n - batch) / (n - 1) * torch.cov(per_datum.T)
    inflation = 0.5 * eps * (lam.max() + torch.linalg.eigvalsh(v).max()) / lam.min()
    ratio = draws.std(0) / cov.diagonal().sqrt()
    tol = harness.sqrt_ratio_tolerance(n_eff) + float(inflation) / 2
    assert tol < 0.3, "chain too short"
    assert torch.all((ratio - 1).abs() <= tol), (ratio, tol)


def test_conjugate_regression_with_subsampling_plate():
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, PRIOR, SIGMA, batch_size=200)
    eps = 1e-4
    mcmc = harness.run(SGLD(model, step_size=eps, num_steps_per_sample=10), 1500, 50, 0, x, y)
    regression_check(mcmc, x, y, eps, 200)
    # the model's own plate was subsampled by the kernel: B = 200 of N = 400
    assert mcmc.kernel.target.plate.batch_size == 200


def test_full_batch_model_minibatched_by_the_kernel():
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, PRIOR, SIGMA, batch_size=None)
    eps = 1e-4
    kernel = SGLD(model, step_size=eps, subsample_size=200, num_steps_per_sample=10)
    mcmc = harness.run(kernel, 1500, 50, 1, x, y)
    assert kernel.target.plate.slice_args and kernel.target.plate.size == 400
    regression_check(mcmc, x, y, eps, 200)


def plate_sized_from_data(x, y):
    w = pyro.sample("w", dist.Normal(0.0, PRIOR).expand([2]).to_event(1))
    with pyro.plate("data", len(x)):  # sized from the (sliced) arguments
        pyro.sample("obs", dist.Normal(x @ w, SIGMA), obs=y)


def test_kernel_subsampling_scales_a_plate_sized_from_the_data():
    """U on a minibatch must be an unbiased estimate of the full-data U whatever the plate size."""
    x, y = harness.linear_regression_data()
    full = SGLD(plate_sized_from_data, step_size=1e-4)
    sub = SGLD(plate_sized_from_data, step_size=1e-4, subsample_size=40)
    pyro.set_rng_seed(0)
    full.setup(0, x, y)
    sub.setup(0, x, y)
    sub.position.copy_(full.position)
    u_full = float(full.potential_and_grad(None)[0])
    batches = [sub.minibatches.next() for _ in range(10)]  # one epoch: every datum once
    u_mean = sum(float(sub.potential_and_grad(b)[0]) for b in batches) / 10
    assert u_mean == pytest.approx(u_full, rel=1e-5)


def test_full_batch_sgld_agrees_with_nuts():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(50, 2, generator=g)
    y = torch.bernoulli(torch.sigmoid(x @ torch.tensor([1.0, -2.0]) + 0.5), generator=g)
    nuts = harness.run(NUTS(harness.logistic_model), 800, 200, 0, x, y)
    sgld = harness.run(SGLD(harness.logistic_model, step_size=0.005, num_steps_per_sample=10),
                       1500, 50, 0, x, y)

    def draws(mcmc):
        s = mcmc.get_samples()
        return torch.cat([s["w"], s["b"].unsqueeze(-1)], dim=1)

    a, b = draws(nuts), draws(sgld)
    assert torch.all(harness.mc_tolerance(a, b) < 0.5 * a.std(0)), "chains too short"
    # ULA bias is O(eps * curvature) ~ 1e-2 of a posterior std here; Monte Carlo error dominates
    tol = harness.mc_tolerance(a, b) + 0.02 * a.std(0)
    assert torch.all((a.mean(0) - b.mean(0)).abs() <= tol), (a.mean(0), b.mean(0), tol)
    n_eff = torch.minimum(harness.ess(a.unsqueeze(0)), harness.ess(b.unsqueeze(0)))
    rel = harness.sqrt_ratio_tolerance(n_eff) * math.sqrt(2) + 0.03
    assert torch.all((b.std(0) / a.std(0) - 1).abs() <= rel), (a.std(0), b.std(0), rel)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_chains_in_worker_processes(monkeypatch, context):
    monkeypatch.setattr(torch.multiprocessing, "cpu_count", lambda: 4)  # force worker processes
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, PRIOR, SIGMA, batch_size=100)
    kernel = SGHMC(model, step_size=5e-3, friction=20.0, mass=1.0, num_steps_per_sample=2)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=10, num_chains=2, mp_context=context,
                disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["net.weight"].shape == (2, 30, 1, 2)
    assert not torch.equal(samples["net.weight"][0], samples["net.weight"][1])
    for chain in range(2):
        stats = kernel_diagnostics(mcmc)[chain]["sample_stats"]
        assert set(stats) == {"lp", "step_size", "grad_norm", "diverging"}
        assert all(len(v) == 30 for v in stats.values())
        assert torch.isfinite(stats["lp"]).all()
        assert kernel_diagnostics(mcmc)[chain]["divergences"] == []


def test_state_dict_from_another_kernel_is_refused():
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, PRIOR, SIGMA, batch_size=64)
    mcmc = harness.run(SGLD(model, step_size=1e-5), 2, 0, 0, x, y)
    with pytest.raises(ValueError, match="SGLD"):
        SGHMC(model, step_size=1e-3).load_state_dict(mcmc.kernel.state_dict())


def test_lp_is_the_potential_at_the_draw():
    target = harness.correlated_2d(num_chains=4)
    kernel = SGLD(potential_fn=target, initial_params=target.initial_params(), step_size=0.05,
                  num_steps_per_sample=3)
    mcmc = harness.run(kernel, 10, 2)
    lp = kernel_diagnostics(mcmc)[0]["sample_stats"]["lp"]
    draws = mcmc.get_samples()["x"]
    expected = torch.stack([-target({"x": d}) for d in draws])
    assert torch.allclose(lp, expected, rtol=1e-5)
    gn = kernel_diagnostics(mcmc)[0]["sample_stats"]["grad_norm"]
    g = torch.stack([((d - target.mean) @ target.precision).norm() for d in draws])
    assert torch.allclose(gn, g, rtol=1e-4)


def test_default_init_is_the_network_torch_init():
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 10.0, SIGMA, batch_size=64)
    kernel = SGLD(model, step_size=1e-5)
    pyro.set_rng_seed(0)
    kernel.setup(0, x, y)
    w = kernel.initial_params["net.weight"]
    # nn.Linear(2, 1): U(-1/sqrt(2), 1/sqrt(2)), not Pyro's U(-2, 2) nor a N(0, 10^2) prior draw
    assert w.abs().max() <= 1 / math.sqrt(2)


class Exploding:
    """A potential that is finite for |x| < 3 and infinite beyond, or NaN from step ``after``."""

    def __init__(self, after=None):
        self.after, self.calls = after, 0

    def __call__(self, params):
        self.calls += 1
        x = params["x"]
        u = 0.5 * (x**2).sum()
        if self.after is not None and self.calls > self.after:
            return u * float("nan")
        return torch.where(x.abs().max() < 3, u, torch.tensor(float("inf")))


def test_nonfinite_steps_are_skipped_and_marked_diverging():
    kernel = SGLD(potential_fn=Exploding(), initial_params={"x": torch.zeros(1)},
                  step_size=0.5, temperature=3.0, num_steps_per_sample=5)
    mcmc = harness.run(kernel, 200, 0)
    diag = kernel_diagnostics(mcmc)[0]
    assert 0 < len(diag["divergences"]) < 200
    flagged = torch.nonzero(diag["sample_stats"]["diverging"]).flatten().tolist()
    assert diag["divergences"] == flagged
    # a draw where the potential is infinite is always reported as diverging
    outside = mcmc.get_samples()["x"].abs().flatten() >= 3
    assert outside.any() and diag["sample_stats"]["diverging"][outside].all()


def test_chain_that_stays_nonfinite_stops_with_an_error():
    kernel = SGLD(potential_fn=Exploding(after=20), initial_params={"x": torch.zeros(3)},
                  step_size=0.1, max_nonfinite_steps=10)
    with pytest.raises(RuntimeError, match=r"10 of the last 20 SG steps \(10 in a row\), "
                                           r"the last at step 29"):
        harness.run(kernel, 100, 0)


def bounded_potential(params):
    """0.5 |x|^2 for ``max |x| < 3``, infinite beyond (one row per chain or a single chain)."""
    x = params["x"]
    u = 0.5 * x.square().sum(-1)
    return torch.where(x.abs().amax(-1) < 3, u, torch.full_like(u, math.inf))


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC])
def test_a_resumed_chain_falls_back_where_the_whole_run_did(kernel_class, defer):
    """A checkpoint holds each chain's last finite position, the start of its last finite step:
    a chain whose first step after the resume is not finite falls back there, not to the
    position it ended at. 16 hot chains leave the box at about half of the draws."""
    def make():
        kernel = kernel_class(potential_fn=bounded_potential,
                              initial_params={"x": torch.zeros(16, 2)}, step_size=0.5,
                              temperature=3.0, num_steps_per_sample=5, vectorized_chains=16)
        kernel.defer_finiteness_checks = defer
        return kernel

    with pytest.warns(RuntimeWarning, match=r"of 20 draws \(\d+ of 320 chain-draws\) are "
                                            "marked diverging"):
        harness.assert_resume_continues(make)


@pytest.mark.parametrize("chains", [None, 2])
def test_a_run_stopped_in_warmup_keeps_readable_diagnostics(chains):
    """A chain that stops in warmup has recorded no draw: ``diagnostics()`` says so."""
    shape = (3,) if chains is None else (chains, 3)

    def potential(params, calls=[0]):  # noqa: B006 (counts the calls)
        calls[0] += 1
        u = 0.5 * params["x"].square().sum(-1)
        return u * float("nan") if calls[0] > 20 else u

    kernel = SGLD(potential_fn=potential, initial_params={"x": torch.zeros(shape)},
                  step_size=0.1, max_nonfinite_steps=10, vectorized_chains=chains)
    with pytest.raises(RuntimeError, match="diverged"):
        harness.run(kernel, 100, 50)
    diag = kernel.diagnostics()
    assert diag["divergences"] == [] and len(diag["sample_stats"]["diverging"]) == 0


def infinite_gradient_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(x)):  # d/dw sqrt(|w|) is infinite at w = 0, U stays finite
        pyro.sample("obs", dist.Normal(torch.sqrt(w.abs()) + b * x[:, 0], 1.0), obs=y)


def test_divergence_error_names_the_site():
    x, y = harness.linear_regression_data()
    start = init_to_value(values={"w": torch.tensor(0.0), "b": torch.tensor(0.5)})
    kernel = SGLD(infinite_gradient_model, step_size=1e-3, max_nonfinite_steps=3,
                  init_strategy=start)
    with pytest.raises(RuntimeError, match=r"sites \['w'\]"):
        harness.run(kernel, 10, 0, 0, x, y)


def discrete_model():
    pyro.sample("k", dist.Poisson(3.0))


def local_latent_model(x):
    with pyro.plate("data", len(x), subsample_size=10) as ind:
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        pyro.sample("obs", dist.Normal(z, 1.0), obs=x[ind])


def test_model_and_potential_fn_are_exclusive():
    with pytest.raises(ValueError, match="exactly one of model and potential_fn"):
        SGLD(harness.logistic_model, step_size=0.1, potential_fn=lambda p: 0)
    with pytest.raises(ValueError, match="exactly one"):
        SGLD(step_size=0.1)
    with pytest.raises(ValueError, match="needs initial_params"):
        harness.run(SGLD(potential_fn=lambda p: p["x"].sum(), step_size=0.1), 1, 0)


@pytest.mark.parametrize("value", [0.0, -1e-3, float("nan")])
def test_bad_schedule_value_names_the_step(value):
    target = harness.correlated_2d(num_chains=1)
    kernel = SGLD(potential_fn=target, initial_params=target.initial_params(), step_size=0.1,
                  step_size_schedule=lambda t: 0.1 if t < 5 else value)
    with pytest.raises(ValueError, match=r"step_size_schedule\(5\) returned"):
        harness.run(kernel, 10, 0)


def test_discrete_site_is_named():
    with pytest.raises(ValueError, match="site 'k' is discrete"):
        harness.run(SGLD(discrete_model, step_size=0.1), 1, 0)


def test_local_latent_in_subsampled_plate_is_refused():
    with pytest.raises(ValueError, match="latent site 'z' is sampled inside the subsampled plate"):
        harness.run(SGLD(local_latent_model, step_size=0.1), 1, 0, 0, torch.randn(50))


def _network_inside_the_plate(x, y=None):
    """A user's mistake: a network with ``PyroSample`` weights run inside the data plate."""
    from pyro.nn import PyroModule, PyroSample

    net = PyroModule[torch.nn.Linear](1, 3)
    net.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 1]).to_event(2))
    net.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(net(x).sum(-1), 1.0), obs=y)


@pytest.mark.parametrize("subsample_size", [None, 10])
def test_a_network_run_inside_the_plate_is_named(subsample_size):
    """The model raises torch's raw shape error while being traced; the kernel says which
    latent sites were drawn inside the plate, and what to do."""
    x, y = torch.randn(40, 1), torch.randn(40)
    kernel = SGLD(_network_inside_the_plate, step_size=0.1, subsample_size=subsample_size)
    shape = 40 if subsample_size is None else subsample_size
    with pytest.raises(ValueError, match=(
            rf"(?s)the model raised RuntimeError.*'weight' \(shape \({shape}, 3, 1\), in "
            r"plate 'data'\).*run the network outside the plate")) as raised:
        harness.run(kernel, 1, 0, 0, x, y)
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_model_error_without_local_latents_is_left_as_it_is():
    def model(x):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        raise RuntimeError(f"the user's own error {w.shape}")

    with pytest.raises(RuntimeError, match="the user's own error"):
        harness.run(SGLD(model, step_size=0.1), 1, 0, 0, torch.randn(5))


def test_subsample_size_larger_than_data_is_refused():
    x, y = harness.linear_regression_data(n=50)
    model = harness.BayesianLinearRegression(2, PRIOR, SIGMA, batch_size=None)
    with pytest.raises(ValueError, match=r"subsample_size must be an integer in \[1, 50\]"):
        harness.run(SGLD(model, step_size=0.1, subsample_size=80), 1, 0, 0, x, y)


def test_a_finite_blow_up_is_reported():
    """From step 500 the potential turns into 1e4 |x|: the chain stays finite but its gradient
    norm jumps 10,000-fold, which is reported rather than passed over."""

    class Steepening:
        calls = 0

        def __call__(self, p):
            self.calls += 1
            x = p["x"]
            return 0.5 * (x**2).sum() if self.calls < 500 else 1e4 * x.abs().sum()

    kernel = SGLD(potential_fn=Steepening(), initial_params={"x": torch.zeros(2)},
                  step_size=0.05, num_steps_per_sample=5)
    with pytest.warns(RuntimeWarning, match="may have blown up"):
        mcmc = harness.run(kernel, 150, 0)
    assert torch.isfinite(mcmc.get_samples()["x"]).all()


def test_a_stable_chain_raises_no_blow_up_warning(recwarn):
    target = harness.correlated_2d(num_chains=4)
    kernel = SGLD(potential_fn=target, initial_params=target.initial_params(), step_size=0.05)
    harness.run(kernel, 300, 20)
    assert not [w for w in recwarn if "blown up" in str(w.message)]
