"""The fast potential and gradient against Pyro's own potential (``initialize_model``)."""

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions.transforms import OrderedTransform
from pyro.infer.mcmc.util import initialize_model

from pyro_flat.infer import SGLD


def mixed_model(x, y):
    w = pyro.sample("w", dist.Normal(torch.tensor([0.5, -1.0]), 2.0).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))  # same precision as nothing else: not uniform
    s = pyro.sample("s", dist.HalfNormal(1.5))  # transformed: log-Jacobian
    h = pyro.sample("h", dist.StudentT(3.0, 0.0, 1.0))  # no closed form: log_prob in the run
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Normal(x @ w + b + 0.1 * h, s), obs=y)


def isotropic_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 3.0))
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Normal(x @ w + b, 1.0), obs=y)


def constrained_model(x, y):
    """Transforms that change the shape (simplex 3 -> 2, LKJ Cholesky and correlation 3x3 ->
    3) and one that keeps it (ordered)."""
    p = pyro.sample("p", dist.Dirichlet(torch.tensor([1.0, 2.0, 3.0])))
    chol = pyro.sample("L", dist.LKJCholesky(3, 2.0))
    corr = pyro.sample("C", dist.LKJ(3, 1.5))
    cuts = pyro.sample("cuts", dist.TransformedDistribution(
        dist.Normal(0.0, 1.0).expand([3]).to_event(1), [OrderedTransform()]))
    with pyro.plate("data", len(x)):
        loc = x @ p[:2] + cuts.sum()
        pyro.sample("obs", dist.Normal(loc, 1.0), obs=y)
    z = torch.stack([x[:3, 0], x[:3, 1], y[:3]], -1)
    with pyro.plate("rows", 3):
        pyro.sample("z", dist.MultivariateNormal(torch.zeros(3), scale_tril=chol), obs=z)
    pyro.sample("c", dist.MultivariateNormal(torch.zeros(3), covariance_matrix=corr), obs=z[0])


@pytest.mark.parametrize("model", [mixed_model, isotropic_model, constrained_model, "network"])
def test_potential_and_gradient_equal_pyros(model):
    """Equal to Pyro's potential (negative log joint minus log-Jacobian) and its gradient.
    Priors rebuilt at every call (function models) leave the closed form after the first
    evaluation; prebuilt ones (make_bayesian) stay in it, as one uniform precision here."""
    x, y = harness.linear_regression_data(n=30)
    x, y = x.double(), y.double()
    torch.set_default_dtype(torch.float64)
    try:
        network = model == "network"
        if network:
            model = harness.BayesianLinearRegression(2, 3.0, 1.0, batch_size=None)
        pyro.set_rng_seed(0)
        kernel = SGLD(model, step_size=1e-3)
        kernel.setup(0, x, y)
        _, potential_fn, _, _ = initialize_model(model, model_args=(x, y))
        for _ in range(3):
            kernel.position.add_(0.3 * torch.randn_like(kernel.position))
            u, grad = kernel.potential_and_grad(None)
            params = {k: v.detach().clone().requires_grad_()
                      for k, v in kernel.layout.views(kernel.position).items()}
            expected = potential_fn(params)
            expected_grad = torch.autograd.grad(expected, list(params.values()))
            assert float(u) == pytest.approx(float(expected.detach()), rel=1e-10)
            flat = torch.cat([g.reshape(-1) for g in expected_grad])
            assert torch.allclose(grad, flat, rtol=1e-10, atol=1e-10)
        prior = kernel.target.flat_prior
        if network:
            assert set(prior.fns) == {"net.weight", "net.bias"}
            assert prior._uniform == pytest.approx(1 / 9)
        elif model is constrained_model:  # no Normal prior: nothing in closed form
            assert prior is None
        else:
            assert prior.fns == {} and prior._uniform is None
    finally:
        torch.set_default_dtype(torch.float32)
