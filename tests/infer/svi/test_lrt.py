"""LocalReparameterization (SGVB-LRT): the expected log-likelihood and its gradient are those of
the plain estimator (closed form on a Gaussian linear layer), the gradient variance drops, the
conv layer's pre-activation moments, the sharpness-aware variant replays the noise, fallbacks."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from harness import unconstrained
from pyro import poutine
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal

from pyro_flat.infer import SharpnessAwareELBO
from pyro_flat.infer.svi.lrt import LocalReparameterization
from pyro_flat.models.nn import make_bayesian

Z = 4.5  # standard errors, as in tests/harness.py
ORIGINAL = {name: getattr(F, name) for name in ("linear", "conv1d", "conv2d", "conv3d")}
NOISE = 0.5


def linear_problem(n=100, d=4):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ torch.linspace(-1, 1, d, dtype=torch.float64) + NOISE * torch.randn(
        n, generator=g, dtype=torch.float64)
    net = make_bayesian(torch.nn.Linear(d, 1).double(), prior_scale=1.0)

    def model(x, y):
        mean = net(x).squeeze(-1)
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(mean, NOISE), obs=y)

    guide = AutoNormal(model, init_scale=0.2)
    pyro.set_rng_seed(0)
    guide(x, y)
    with torch.no_grad():
        guide.locs.weight.copy_(torch.randn(1, d, generator=g, dtype=torch.float64))
    return x, y, model, guide


def nll_and_grad(model, guide, x, y, lrt):
    """The observed site's negative log-likelihood at one guide draw, and its gradient in the
    weight's loc."""
    if lrt is not None:
        model, guide = lrt.model(model), lrt.guide(guide)
    guide_trace = poutine.trace(guide).get_trace(x, y)
    trace = poutine.trace(poutine.replay(model, guide_trace)).get_trace(x, y)
    nll = -trace.nodes["y"]["fn"].log_prob(trace.nodes["y"]["value"]).sum()
    loc = unconstrained("AutoNormal.locs.weight")
    (grad,) = torch.autograd.grad(nll, [loc])
    return float(nll.detach()), grad.flatten()


@pytest.mark.parametrize("use_lrt", [True, False])
def test_expected_nll_and_gradient_have_the_closed_form(use_lrt):
    """Each pre-activation is N(m_n, v_n) under both estimators, so
    E[NLL] = sum_n log(sqrt(2 pi) s) + ((y_n - m_n)^2 + v_n) / (2 s^2), whose gradient in the
    weight loc is sum_n (m_n - y_n) x_n / s^2. Tolerance: Z standard errors of the average."""
    x, y, model, guide = linear_problem()
    lrt = LocalReparameterization() if use_lrt else None
    pyro.set_rng_seed(1)
    draws = [nll_and_grad(model, guide, x, y, lrt) for _ in range(400)]
    nll = torch.tensor([d[0] for d in draws], dtype=torch.float64)
    grads = torch.stack([d[1] for d in draws])
    mu_w, mu_b = guide.locs.weight.detach()[0], guide.locs.bias.detach()[0]
    s_w, s_b = guide.scales.weight.detach()[0], guide.scales.bias.detach()[0]
    m = x @ mu_w + mu_b
    v = x.square() @ s_w.square() + s_b.square()
    expected = float((math.log(math.sqrt(2 * math.pi) * NOISE)
                      + ((y - m).square() + v) / (2 * NOISE**2)).sum())
    expected_grad = ((m - y) @ x) / NOISE**2
    se = float(nll.std()) / math.sqrt(len(nll))
    assert abs(float(nll.mean()) - expected) <= Z * se
    grad_se = grads.std(0) / math.sqrt(len(grads))
    assert ((grads.mean(0) - expected_grad).abs() <= Z * grad_se).all()


def test_lrt_gradient_has_a_smaller_variance():
    """Plain: one weight draw shared by the N data points, Var ~ N^2; LRT: independent noise per
    data point, Var ~ N (Kingma et al. 2015). With N = 100 the ratio is far below 1/2, so the
    sampling error of the two variance estimates (about sqrt(2/400) = 7% each) cannot flip it."""
    x, y, model, guide = linear_problem()
    variances = {}
    for name, lrt in (("plain", None), ("lrt", LocalReparameterization())):
        pyro.set_rng_seed(2)
        grads = torch.stack([nll_and_grad(model, guide, x, y, lrt)[1] for _ in range(400)])
        variances[name] = float(grads.var(0).sum())
    assert variances["lrt"] < 0.5 * variances["plain"], variances


def test_conv_preactivation_moments_match_the_plain_estimator():
    torch.manual_seed(0)
    conv = make_bayesian(torch.nn.Conv2d(2, 3, 3, padding=1).double(), prior_scale=1.0)
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)

    def model():
        return conv(x)

    guide = AutoNormal(model, init_scale=0.3)
    pyro.set_rng_seed(0)
    guide()
    outs = {}
    for name, lrt in (("plain", None), ("lrt", LocalReparameterization())):
        m, g = (model, guide) if lrt is None else (lrt.model(model), lrt.guide(guide))
        draws = []
        for _ in range(1000):
            tr = poutine.trace(g).get_trace()
            draws.append(poutine.replay(m, tr)().detach())
        outs[name] = torch.stack(draws)
    with torch.no_grad():
        mean = F.conv2d(x, guide.locs.weight, guide.locs.bias, padding=1)
        var = F.conv2d(x.square(), guide.scales.weight.square(),
                       guide.scales.bias.square(), padding=1)
    k = 1000
    for name, o in outs.items():
        # mean: se = sqrt(var / k); variance of a Gaussian: se = var * sqrt(2 / (k - 1))
        assert ((o.mean(0) - mean[0]).abs() <= Z * (var[0] / k).sqrt()).all(), name
        assert ((o.var(0) - var[0]).abs() <= Z * var[0] * math.sqrt(2 / (k - 1))).all(), name
    assert all(getattr(F, n) is f for n, f in ORIGINAL.items())  # restored after the calls


@pytest.mark.parametrize("rho", [0.0, 1e-9])
def test_sharpness_aware_lrt_replays_the_noise(rho):
    x, y, model, guide = linear_problem()
    lrt = LocalReparameterization()
    store = pyro.get_param_store()
    grads = {}
    for name, elbo in (("trace", Trace_ELBO()), ("sa", SharpnessAwareELBO(rho=rho))):
        for k in store.keys():
            unconstrained(k).grad = None
        pyro.set_rng_seed(5)
        elbo.loss_and_grads(lrt.model(model), lrt.guide(guide), x, y)
        grads[name] = {k: unconstrained(k).grad.clone() for k in store.keys()}
    for k in grads["trace"]:
        assert torch.allclose(grads["sa"][k], grads["trace"][k], rtol=1e-6, atol=1e-8), k


def test_sharpness_aware_lrt_moves_the_means_it_perturbs():
    """With rho > 0 the LRT gradient differs from the plain one by the Hessian times the step."""
    x, y, model, guide = linear_problem()
    lrt = LocalReparameterization()
    store = pyro.get_param_store()
    out = {}
    for rho in (0.0, 0.1):
        for k in store.keys():
            unconstrained(k).grad = None
        pyro.set_rng_seed(5)
        SharpnessAwareELBO(rho=rho).loss_and_grads(lrt.model(model), lrt.guide(guide), x, y)
        out[rho] = unconstrained("AutoNormal.locs.weight").grad.clone()
    assert not torch.allclose(out[0.0], out[0.1])


def test_guides_without_per_weight_normals_run_unchanged():
    """AutoDiagonalNormal's weights are views of one joint latent: the layer runs as usual."""
    x, y, model, _ = linear_problem()
    pyro.clear_param_store()
    guide = AutoDiagonalNormal(model)
    pyro.set_rng_seed(0)
    guide(x, y)
    store = pyro.get_param_store()
    grads = []
    for lrt in (None, LocalReparameterization()):
        m, g = (model, guide) if lrt is None else (lrt.model(model), lrt.guide(guide))
        for k in store.keys():
            unconstrained(k).grad = None
        pyro.set_rng_seed(3)
        Trace_ELBO().loss_and_grads(m, g, x, y)
        grads.append({k: unconstrained(k).grad.clone() for k in store.keys()})
    for k in grads[0]:
        assert torch.equal(grads[0][k], grads[1][k])
    assert all(getattr(F, n) is f for n, f in ORIGINAL.items())  # restored after the calls
