"""The one-line BNN and its likelihoods, through Pyro's own tools and ours."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_flat
from pyro_flat.infer import SGLD
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import (
    Bernoulli,
    Categorical,
    HeteroskedasticGaussian,
    HomoskedasticGaussian,
)


def mlp(d_in, d_out, hidden=6):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, d_out))


def data(n=40, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x[:, 0]) + 0.1 * torch.randn(n, generator=g)


CASES = {
    "learned noise": (lambda: HomoskedasticGaussian(), 1, lambda y: y),
    "fixed noise": (lambda: HomoskedasticGaussian(0.3), 1, lambda y: y),
    "heteroskedastic": (lambda: HeteroskedasticGaussian(), 2, lambda y: y),
    "bernoulli": (lambda: Bernoulli(), 1, lambda y: (y > 0).float()),
    "categorical": (lambda: Categorical(), 3, lambda y: (y > 0).long() + (y > 0.5).long()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_log_joint_is_prior_plus_likelihood(case):
    """The model's log joint (Pyro's trace) equals a hand computation with torch.distributions,
    and a minibatch's likelihood is scaled by N / B."""
    make, d_out, target = CASES[case]
    x, y = data()
    y = target(y)
    model = BNN(mlp(2, d_out), make(), prior_scale=0.7)
    trace = poutine.trace(model).get_trace(x, y)
    params = {n: s["value"] for n, s in trace.nodes.items()
              if s["type"] == "sample" and not s["is_observed"] and n != "data"}
    prior = sum(torch.distributions.Normal(0.0, 0.7).log_prob(v).sum()
                for n, v in params.items() if n.startswith("net."))
    if "obs_scale" in params:
        prior = prior + torch.distributions.HalfNormal(1.0).log_prob(params["obs_scale"])
    net = torch.func.functional_call(mlp(2, d_out), {k[4:]: v for k, v in params.items()
                                                     if k.startswith("net.")}, (x,))
    lik = {
        "learned noise": lambda: torch.distributions.Normal(net[:, 0], params["obs_scale"]),
        "fixed noise": lambda: torch.distributions.Normal(net[:, 0], 0.3),
        "heteroskedastic": lambda: torch.distributions.Normal(
            net[:, 0], torch.nn.functional.softplus(net[:, 1]) + 1e-3),
        "bernoulli": lambda: torch.distributions.Bernoulli(logits=net[:, 0]),
        "categorical": lambda: torch.distributions.Categorical(logits=net),
    }[case]().log_prob(y).sum()
    torch.testing.assert_close(trace.log_prob_sum(), prior + lik, rtol=1e-5, atol=1e-4)

    model.subsample_size = 10
    sub = poutine.trace(poutine.condition(model, data=params)).get_trace(x, y)
    sub.compute_log_prob()
    assert sub.nodes["obs"]["scale"] == pytest.approx(40 / 10)
    assert sub.nodes["obs"]["value"].shape == (10,)


def test_runs_in_nuts_sgld_and_svi_and_exports_to_arviz():
    x, y = data()
    pyro.set_rng_seed(0)
    model = BNN(mlp(2, 1), HomoskedasticGaussian())
    nuts = MCMC(NUTS(model, max_tree_depth=5), num_samples=20, warmup_steps=20,
                disable_progbar=True)
    nuts.run(x, y)
    assert set(nuts.get_samples()) == {"net.0.weight", "net.0.bias", "net.2.weight",
                                       "net.2.bias", "obs_scale"}
    assert (nuts.get_samples()["obs_scale"] > 0).all()

    minibatched = BNN(mlp(2, 1), HomoskedasticGaussian(), subsample_size=10)
    sgld = MCMC(SGLD(minibatched, step_size=1e-3), num_samples=30, warmup_steps=10,
                disable_progbar=True)
    sgld.run(x, y)
    idata = pyro_flat.to_arviz(sgld)
    assert idata.log_likelihood["obs"].shape == (1, 30, 40)  # every point, not the minibatch
    assert idata.posterior["obs_scale"].shape == (1, 30)

    pyro.clear_param_store()
    guide = AutoNormal(minibatched)
    svi = SVI(minibatched, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    losses = [svi.step(x, y) for _ in range(30)]
    assert all(math.isfinite(v) for v in losses)


def test_prints_conditions_and_samples_targets():
    x, _ = data()
    model = BNN(mlp(2, 1), HomoskedasticGaussian())
    assert "HomoskedasticGaussian(learned" in repr(model)
    fixed = poutine.condition(model, data={"obs_scale": torch.tensor(0.01)})
    trace = poutine.trace(fixed).get_trace(x)
    assert trace.nodes["obs"]["value"].shape == (40,)  # y=None: targets sampled
    assert float(trace.nodes["obs_scale"]["value"]) == pytest.approx(0.01)


@pytest.mark.parametrize("likelihood, d_out, match", [
    (HomoskedasticGaussian(), 3, r"HomoskedasticGaussian needs one network output per data "
                                 r"point, shape \(B,\) or \(B, 1\), but the network returned "
                                 r"shape \(40, 3\)"),
    (HeteroskedasticGaussian(), 1, r"HeteroskedasticGaussian needs \(B, 2\) outputs"),
    (Categorical(), 1, r"Categorical needs \(B, C\) logits with C >= 2"),
    (Bernoulli(), 2, r"Bernoulli needs one network output per data point"),
])
def test_output_shape_mismatch_is_named(likelihood, d_out, match):
    x, y = data()
    with pytest.raises(ValueError, match=match):
        BNN(mlp(2, d_out), likelihood)(x, y)


def test_bad_arguments():
    x, y = data()
    with pytest.raises(ValueError, match="likelihood must be a pyro_flat.models.likelihoods"):
        BNN(mlp(2, 1), dist.Normal(0.0, 1.0))
    with pytest.raises(ValueError, match="subsample_size must be an integer >= 1"):
        BNN(mlp(2, 1), HomoskedasticGaussian(), subsample_size=0)
    with pytest.raises(ValueError, match=r"len\(x\) = 40, len\(y\) = 39"):
        BNN(mlp(2, 1), HomoskedasticGaussian())(x, y[:39])
    with pytest.raises(ValueError, match=r"scale must be a finite number in \(0, inf\)"):
        HomoskedasticGaussian(scale=0.0)
    with pytest.raises(ValueError, match="min_scale"):
        HeteroskedasticGaussian(min_scale=-1.0)
