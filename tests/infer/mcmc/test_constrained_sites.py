"""Latent sites whose transform changes shape (simplex, LKJ Cholesky, correlation matrix).

Pyro's conjugate test models (beta-bernoulli, gamma-normal, dirichlet-categorical) are written
with ``K`` independent copies of the latent in one site, so that one run gives ``K`` independent
chains. With the full batch, SGLD is the unadjusted Langevin algorithm (ULA), whose stationary
law differs from the posterior by a discretisation bias of order ``step_size``. Rather than
bound that bias, the reference is the exact stationary law of ULA itself, computed on a grid in
the unconstrained space: one step moves ``z`` to ``N(z - eps grad U(z), 2 eps)``, so the grid's
transition matrix is a product of Gaussian factors, and its stationary vector follows by power
iteration. ``U`` is Pyro's own potential (``initialize_model``, the one NUTS uses), log-Jacobian
included, so the reference shares no code with the kernels.

The estimate of ``E[f]`` is the mean over the ``K`` chains of each chain's time average; the
chains are independent, so its standard error is the spread of the ``K`` chain means over
``sqrt(K)``, and a check passes within ``Z`` standard errors plus the grid's own error (the
difference between the reference at two grid resolutions). The grid machinery is checked
against the exact posterior as ``eps -> 0``.
"""

from __future__ import annotations

import math

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model
from torch.distributions import biject_to

from pyro_flat.infer import SGLD

K = 256  # independent copies of the latent, i.e. chains per run


def beta_bernoulli(copies: int):
    def model(data):
        p = pyro.sample("p", dist.Beta(torch.full((copies,), 1.1, dtype=data.dtype),
                                       torch.full((copies,), 1.1, dtype=data.dtype)).to_event(1))
        with pyro.plate("data", len(data)):
            pyro.sample("obs", dist.Bernoulli(p).to_event(1),
                        obs=data[:, None].expand(len(data), copies))

    return model


def gamma_normal(copies: int):
    """Normal data with unknown precision ``tau ~ Gamma(2, 2)`` (conjugate)."""

    def model(data):
        tau = pyro.sample("tau", dist.Gamma(torch.full((copies,), 2.0, dtype=data.dtype),
                                            torch.full((copies,), 2.0, dtype=data.dtype))
                          .to_event(1))
        with pyro.plate("data", len(data)):
            pyro.sample("obs", dist.Normal(3.0, tau.rsqrt()).to_event(1),
                        obs=data[:, None].expand(len(data), copies))

    return model


def dirichlet_categorical(copies: int):
    def model(data):
        p = pyro.sample("p", dist.Dirichlet(torch.ones(copies, 3, dtype=torch.float64)
                                            .to(torch.get_default_dtype())).to_event(1))
        with pyro.plate("data", len(data)):
            pyro.sample("obs", dist.Categorical(p).to_event(1),
                        obs=data[:, None].expand(len(data), copies))

    return model


def _data(name: str, dtype=torch.float32):
    if name == "beta":
        return torch.tensor([1.0] * 14 + [0.0] * 6, dtype=dtype)  # 14 of 20
    if name == "gamma":
        g = torch.Generator().manual_seed(0)
        return (3.0 + 0.5 * torch.randn(20, generator=g, dtype=torch.float64)).to(dtype)
    return torch.tensor([0] * 3 + [1] * 18 + [2] * 9)  # counts 3, 18, 9


def _exact_posterior(name: str, data: torch.Tensor):
    if name == "beta":
        k = float(data.sum())
        return dist.Beta(torch.tensor(1.1 + k, dtype=torch.float64),
                         torch.tensor(1.1 + len(data) - k, dtype=torch.float64))
    if name == "gamma":
        ss = float(((data.double() - 3.0) ** 2).sum())
        return dist.Gamma(torch.tensor(2.0 + len(data) / 2, dtype=torch.float64),
                          torch.tensor(2.0 + ss / 2, dtype=torch.float64))
    counts = torch.bincount(data, minlength=3).double()
    return dist.Dirichlet(1.0 + counts)


CASES = {  # name: (model maker, site, step size, grid points per unconstrained axis)
    "beta": (beta_bernoulli, "p", 0.05, 400),
    "gamma": (gamma_normal, "tau", 0.02, 400),
    "dirichlet": (dirichlet_categorical, "p", 0.05, 60),
}


def _grad_u(name: str, data: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """grad U at each row of ``z`` from Pyro's potential of a model with ``len(z)`` copies."""
    maker, site = CASES[name][:2]
    model = maker(len(z))
    data = data.double() if data.is_floating_point() else data
    with torch.random.fork_rng():
        _, potential_fn, _, _ = initialize_model(model, model_args=(data,))
    z = z.clone().requires_grad_()
    with torch.enable_grad():
        u = potential_fn({site: z.squeeze(-1) if z.shape[-1] == 1 and name != "dirichlet"
                          else z})
        (g,) = torch.autograd.grad(u, z)
    return g


def ula_reference(name: str, eps: float, points: int):
    """``(grid in the constrained space, stationary probabilities of ULA on the grid)``."""
    data = _data(name, torch.float64)
    post = _exact_posterior(name, data)
    support = post.support
    transform = biject_to(support)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        z_post = transform.inv(post.sample((20000,)))
    z_post = z_post.reshape(len(z_post), -1)
    lo, hi = z_post.min(0).values - 1.0, z_post.max(0).values + 1.0
    axes = [torch.linspace(float(a), float(b), points, dtype=torch.float64)
            for a, b in zip(lo, hi, strict=True)]
    mesh = torch.cartesian_prod(*axes) if len(axes) > 1 else axes[0][:, None]
    mean = mesh - eps * _grad_u(name, data, mesh)
    s = math.sqrt(2 * eps)
    factors = []
    for k, ax in enumerate(axes):
        w = torch.exp(-0.5 * ((ax[None, :] - mean[:, k : k + 1]) / s) ** 2)
        factors.append(w / w.sum(1, keepdim=True))
    p = torch.full((len(mesh),), 1.0 / len(mesh), dtype=torch.float64)
    for _ in range(3000):
        if len(axes) == 1:
            new = p @ factors[0]
        else:
            new = ((factors[0] * p[:, None]).T @ factors[1]).reshape(-1)
        delta = float((new - p).abs().sum())
        p = new
        if delta < 1e-12:
            break
    assert delta < 1e-9, f"power iteration did not converge ({delta})"
    x = transform(mesh if len(axes) > 1 else mesh[:, 0])
    return x.reshape(len(mesh), -1), p


def _moments(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``E[x_j]`` and ``E[x_j^2]`` of a discrete law, as one vector."""
    return torch.cat([p @ x, p @ x**2])


@pytest.mark.parametrize("name", ["beta", "gamma", "dirichlet"])
def test_grid_reference_tends_to_the_exact_posterior(name):
    """The reference machinery itself. ULA's bias is ``c eps + O(eps^2)``, so the Richardson
    extrapolation ``2 m(eps / 2) - m(eps)`` of the grid moments must meet the exact posterior's
    up to the ``O(eps^2)`` remainder (0.2% here)."""
    data = _data(name, torch.float64)
    post = _exact_posterior(name, data)
    _, _, eps, points = CASES[name]
    half = _moments(*ula_reference(name, eps / 2, points))
    full = _moments(*ula_reference(name, eps, points))
    exact = torch.cat([post.mean.reshape(-1), (post.variance + post.mean**2).reshape(-1)])
    torch.testing.assert_close(2 * half - full, exact, rtol=2e-3, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["beta", "gamma", "dirichlet"])
def test_sgld_matches_the_exact_ula_law(name):
    maker, site, eps, points = CASES[name]
    data = _data(name)
    kernel = SGLD(maker(K), step_size=eps)
    mcmc = harness.run(kernel, 1500, 300, 0, data)
    draws = mcmc.get_samples()[site].double()  # (draws, K, *site shape)
    shape = (3,) if name == "dirichlet" else ()
    assert draws.shape == (1500, K, *shape)
    flat = draws.reshape(1500, K, -1)
    per_chain = torch.cat([flat.mean(0), (flat**2).mean(0)], dim=-1)  # (K, 2 * dim)
    estimate = per_chain.mean(0)
    se = per_chain.std(0) / math.sqrt(K)

    x, p = ula_reference(name, eps, points)
    x2, p2 = ula_reference(name, eps, int(points * 1.5))
    reference, grid_error = _moments(x2, p2), (_moments(x, p) - _moments(x2, p2)).abs()
    post = _exact_posterior(name, data.double() if name != "dirichlet" else data)
    sd = post.variance.sqrt().reshape(-1)
    # the check can fail: a posterior that lost its log-Jacobian, or a transform applied to
    # the wrong coordinates, moves the mean by a sizeable fraction of a posterior sd
    assert (harness.Z * se[: len(sd)] < 0.1 * sd).all()
    assert ((estimate - reference).abs() <= harness.Z * se + grid_error).all(), (
        estimate, reference, se, grid_error)


def lkj_model(copies: int):
    def model(x):
        chol = pyro.sample("L", dist.LKJCholesky(3, 2.0).expand([copies]).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("x", dist.MultivariateNormal(torch.zeros(3), scale_tril=chol)
                        .to_event(1), obs=x[:, None].expand(len(x), copies, 3))

    return model


def _lkj_data():
    g = torch.Generator().manual_seed(2)
    corr = torch.tensor([[1.0, 0.6, -0.3], [0.6, 1.0, 0.2], [-0.3, 0.2, 1.0]])
    return torch.randn(40, 3, generator=g) @ torch.linalg.cholesky(corr).T


@pytest.mark.slow
def test_sgld_on_an_lkj_model_agrees_with_nuts():
    """Correlations of an LKJ-Cholesky latent against NUTS on the same (one-copy) model.

    Both carry Monte Carlo error: the NUTS reference's from its ESS, SGLD's from the spread of
    its ``K`` independent chains. SGLD's discretisation bias: the eigenvalues of the potential's
    Hessian at the mode, in the unconstrained space, are 33, 47 and 102, so at ``eps = 1e-3``
    ULA on this near-Gaussian posterior inflates variances by at most
    ``1 / (1 - eps lambda / 2) - 1 = 5%`` and moves a smooth function's mean by a small
    fraction of its posterior sd; the tolerance adds 0.05 posterior sd for it.
    """
    x = _lkj_data()
    pyro.set_rng_seed(0)
    nuts = MCMC(NUTS(lkj_model(1)), num_samples=600, warmup_steps=300, disable_progbar=True)
    nuts.run(x)
    chol = nuts.get_samples()["L"][:, 0]
    ref_corr = (chol @ chol.transpose(-1, -2))[:, [0, 0, 1], [1, 2, 2]]  # (draws, 3)
    ref_se = ref_corr.std(0) / harness.ess(ref_corr[None]).sqrt()

    mcmc = harness.run(SGLD(lkj_model(64), step_size=1e-3, num_steps_per_sample=4), 600, 100,
                       0, x)
    draws = mcmc.get_samples()["L"]
    assert draws.shape == (600, 64, 3, 3)
    corr = (draws @ draws.transpose(-1, -2))[..., [0, 0, 1], [1, 2, 2]]  # (draws, 64, 3)
    chain_means = corr.mean(0)
    se = chain_means.std(0) / math.sqrt(64)
    sd = ref_corr.std(0)
    tolerance = harness.Z * (se**2 + ref_se**2).sqrt() + 0.05 * sd
    assert (tolerance < 0.5 * sd).all()  # able to tell a wrong posterior from the right one
    assert ((chain_means.mean(0) - ref_corr.mean(0)).abs() < tolerance).all()
