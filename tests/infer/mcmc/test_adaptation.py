"""Warmup that chooses the step size and a frozen diagonal metric (``step_size`` omitted).

Checked: the stability limits against the spectral radius of each update's own linear map; the
curvature estimate against the known Hessian and the Hessian-vector product against
``torch.autograd.functional.hessian``; the adapted SGLD and SGHMC with the learned metric
against the exact stationary law of their discretisation for that fixed metric; every
SGLD-family kernel adapting on Pyro models with constrained, shape-changing sites; bitwise
resume; the records in ``diagnostics()``, the statistics and the logger; BatchNorm left as it
was; and the bad input.
"""

import logging
import math

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from harness import Z

from pyro_flat import kernel_diagnostics, sample_stats
from pyro_flat.infer import SASGLD, SGHMC, SGLD, ContourSGLD, CyclicalSGLD, EntropyMCMC
from pyro_flat.infer.mcmc import adaptation
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HomoskedasticGaussian

PRECISION = torch.tensor([100.0, 4.0, 1.0], dtype=torch.float64)


def gaussian_model(copies: int = 1):
    """``copies`` independent copies of N(0, diag(1 / PRECISION)) in one site."""
    def model():
        scale = PRECISION.rsqrt().expand(copies, 3)
        pyro.sample("x", dist.Normal(torch.zeros_like(scale), scale).to_event(2))
    return model


FAMILY = {
    "SGLD": lambda m, **kw: SGLD(m, **kw),
    "SGHMC": lambda m, **kw: SGHMC(m, friction=5.0, **kw),
    "CyclicalSGLD": lambda m, **kw: CyclicalSGLD(m, cycle_length=10, **kw),
    "EntropyMCMC": lambda m, **kw: EntropyMCMC(m, eta=0.5, **kw),
    "ContourSGLD": lambda m, **kw: ContourSGLD(m, num_bins=10, auto_bins=True, zeta=0.5,
                                               multiplier_clip=(-2.0, 3.0), **kw),
    "SASGLD": lambda m, **kw: SASGLD(m, rho=0.01, **kw),
}


# ------------------------------------------------------------------ stability limits


def _spectral_radius(matrix: torch.Tensor) -> float:
    return float(torch.linalg.eigvals(matrix).abs().max())


def _langevin_map(curvature: float, eps: float) -> torch.Tensor:
    return torch.tensor([[1.0 - eps * curvature]], dtype=torch.float64)


def _underdamped_map(curvature: float, eps: float, friction: float, mass: float):
    """The SGHMC step's linear map on (theta, r) for U = curvature * theta^2 / 2."""
    decay = 1.0 - eps * friction / mass
    return torch.tensor([[1.0 - eps**2 * curvature / mass, eps / mass * decay],
                         [-eps * curvature, decay]], dtype=torch.float64)


@pytest.mark.parametrize("curvature", [0.01, 1.0, 250.0])
def test_langevin_limit_is_where_the_step_stops_contracting(curvature):
    limit = adaptation.langevin_limit(curvature)
    assert _spectral_radius(_langevin_map(curvature, 0.999 * limit)) < 1
    assert _spectral_radius(_langevin_map(curvature, 1.001 * limit)) > 1


@pytest.mark.parametrize("curvature, friction, mass", [
    (100.0, 1.0, 1.0), (100.0, 10.0, 1.0), (1.0, 0.1, 2.0), (4e4, 50.0, 3.0), (1.0, 30.0, 1.0),
])
def test_underdamped_limit_is_where_the_step_stops_contracting(curvature, friction, mass):
    limit = adaptation.underdamped_limit(curvature, friction, mass)
    assert _spectral_radius(_underdamped_map(curvature, 0.999 * limit, friction, mass)) < 1
    beyond = 1.001 * limit
    if beyond * friction / mass > 1:  # the friction bound binds: the decay changes sign
        assert limit == pytest.approx(mass / friction)
    else:
        assert _spectral_radius(_underdamped_map(curvature, beyond, friction, mass)) > 1


def test_entropy_limit_is_that_of_the_joint_update():
    """EntropyMCMC's Langevin step on (theta, theta_a) is linear on a quadratic U: its limit
    must be where the joint map's spectral radius reaches 1."""
    kernel = EntropyMCMC(gaussian_model(), eta=0.3)
    k = kernel.coupling_strength
    for curvature in (0.5, 10.0, 300.0):
        limit = kernel.stability_limit(curvature)
        hessian = torch.tensor([[curvature + k, -k], [-k, k]], dtype=torch.float64)
        for factor, below in ((0.999, True), (1.001, False)):
            radius = _spectral_radius(torch.eye(2, dtype=torch.float64)
                                      - factor * limit * hessian)
            assert (radius < 1) == below, (curvature, factor, radius)


# ------------------------------------------------------------------ curvature and HVP


def test_curvature_is_that_of_the_whole_potential():
    """A model with a closed-form Normal prior site (the flat-prior path, which the hot path
    adds outside the model run), a HalfNormal (log transform) and a Dirichlet (stick-breaking,
    3 -> 2): the estimate equals the largest |eigenvalue| of the full Hessian of Pyro's own
    potential (``initialize_model``'s, by ``torch.autograd.functional.hessian``), with and
    without a metric P (then that of P^(1/2) H P^(1/2))."""
    from pyro.infer.mcmc.util import initialize_model

    from pyro_flat.infer.mcmc.adaptation import DiagonalMetric

    x = torch.linspace(-1, 1, 20, dtype=torch.float64)
    y = 1.5 * x + 0.1 * torch.sin(7 * x)

    def model():
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=torch.float64), 0.3).to_event(1))
        s = pyro.sample("s", dist.HalfNormal(torch.tensor(1.0, dtype=torch.float64)))
        p = pyro.sample("p", dist.Dirichlet(torch.ones(3, dtype=torch.float64)))
        mean = w[0] * x + w[1] * x**2 + p[0]
        with pyro.plate("data", 20):
            pyro.sample("y", dist.Normal(mean, s), obs=y)

    kernel = SGLD(model, 1e-3)
    harness.run(kernel, 1, 0)
    assert kernel.target.flat_prior is not None  # the prior of w takes the flat path
    layout = kernel.layout
    _, pyro_potential, _, _ = initialize_model(model)

    def potential(flat):
        return pyro_potential({s.name: flat[s.offset: s.stop].view(s.shape)
                               for s in layout.sites})

    z = kernel.position.detach().clone()
    hessian = torch.autograd.functional.hessian(potential, z)
    exact = float(torch.linalg.eigvalsh(hessian).abs().max())
    assert kernel.warmup.top_curvature() == pytest.approx(exact, rel=1e-3)
    p = torch.linspace(0.2, 3.0, len(z), dtype=torch.float64)
    kernel.metric = DiagonalMetric(p, p.sqrt())
    scaled = p.sqrt()[:, None] * hessian * p.sqrt()[None, :]
    exact = float(torch.linalg.eigvalsh(scaled).abs().max())
    assert kernel.warmup.top_curvature() == pytest.approx(exact, rel=1e-3)


def test_top_curvature_is_the_largest_precision():
    kernel = SGLD(gaussian_model())
    mcmc = harness.run(kernel, 5, 4)
    records = kernel_diagnostics(mcmc)[0]["step_size_adaptation"]
    assert [r["draw"] for r in records] == [0, 1, 2, 3]
    for r in records:
        assert r["curvature"] == pytest.approx(100.0, rel=1e-3)
        assert r["step_size"] == pytest.approx(0.2 * 2 / 100.0, rel=1e-3)
    assert kernel.base_step_size == records[-1]["step_size"]


# ------------------------------------------------------------------ exact stationary laws


def _adapted_run(make_kernel, copies=200, draws=600, warmup=200, thin=5):
    kernel = make_kernel(gaussian_model(copies))
    mcmc = harness.run(kernel, draws, warmup)
    x = mcmc.get_samples()["x"].double()  # (draws, copies, 3)
    return kernel, mcmc, x.transpose(0, 1)[:, ::thin]


def _check_variances(chains, exact):
    """Each coordinate's variance pooled over the copies (independent chains), against the
    exact stationary variance, within Z standard errors (from the ESS of the squares)."""
    x = chains  # (copies, draws, 3)
    sq = x.square()
    var = sq.reshape(-1, 3).mean(0)
    se = (sq.reshape(-1, 3).var(0) / harness.ess(sq)).sqrt()
    assert torch.all((var - exact).abs() <= Z * se), (var, exact, se)
    return var, se


def test_adapted_sgld_with_metric_has_the_exact_law_of_its_fixed_metric():
    """After warmup, SGLD with the learned P is the linear map x' = (I - eps P H) x + noise of
    covariance 2 eps P: its stationary variance 1 / (h (1 - eps P h / 2)) per coordinate. The
    metric must have learned the scales (P roughly proportional to 1/h), and the check fails
    if the noise is not scaled by P^(1/2) (variance off by the factor P)."""
    kernel, mcmc, chains = _adapted_run(lambda m: SGLD(m, preconditioner="diag"))
    p = kernel.metric.inverse_mass.view(-1, 3).double()
    eps = kernel.base_step_size
    h = PRECISION
    exact = 1.0 / (h * (1.0 - eps * p * h / 2.0))
    ratio = p.median(0).values * h  # each copy learns its own P, from its own gradients
    assert float(ratio.max() / ratio.min()) < 3, ratio  # conditioning 100 -> under 3
    var, _ = _check_variances(chains, exact.mean(0))
    assert kernel_diagnostics(mcmc)[0]["inverse_mass"]["x"].shape == (200, 3)


def test_adapted_sghmc_with_metric_has_the_exact_law_of_its_fixed_metric():
    """SGHMC with the metric runs in phi = P^(-1/2) theta with Hessian P^(1/2) H P^(1/2): the
    exact position covariance of that linear scheme, mapped back, per coordinate."""
    friction = 5.0
    kernel, _, chains = _adapted_run(
        lambda m: SGHMC(m, friction=friction, preconditioner="diag"), draws=800)
    p = kernel.metric.inverse_mass.view(-1, 3).double()
    eps = kernel.base_step_size
    exact = torch.tensor([[  # each copy has its own P: its own exact law, then pooled
        float(harness.underdamped_exact_cov((p[c, i] * PRECISION[i]).view(1, 1), eps,
                                            friction, 1.0)[0, 0] * p[c, i])
        for i in range(3)] for c in range(len(p))], dtype=torch.float64)
    _check_variances(chains, exact.mean(0))


# ------------------------------------------------------------------ every kernel, any model


def constrained_model():
    """Simplex (3 -> 2 unconstrained), positive and LKJ Cholesky (3x3 -> 3) sites."""
    p = pyro.sample("p", dist.Dirichlet(torch.ones(3)))
    s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    chol = pyro.sample("L", dist.LKJCholesky(3, 2.0))
    with pyro.plate("data", 30):
        pyro.sample("y", dist.Normal(p[0] * s * chol[1, 0], 1.0), obs=torch.full((30,), 0.1))


@pytest.mark.parametrize("name", list(FAMILY))
def test_every_sgld_family_kernel_adapts_on_a_constrained_model(name):
    kernel = FAMILY[name](constrained_model)
    mcmc = harness.run(kernel, 20, 8)
    records = kernel_diagnostics(mcmc)[0]["step_size_adaptation"]
    assert len(records) == 4
    limit = kernel.stability_limit(records[-1]["curvature"])
    assert records[-1]["step_size"] == pytest.approx(kernel.stability_fraction * limit)
    samples = mcmc.get_samples()
    assert samples["p"].shape == (20, 3) and samples["L"].shape == (20, 3, 3)
    assert all(bool(torch.isfinite(v).all()) for v in samples.values())
    step = sample_stats(mcmc)["step_size"]
    if name == "CyclicalSGLD":  # the cosine of the cycle peaks at the adapted step
        assert float(step.max()) <= records[-1]["step_size"]
    else:
        assert torch.allclose(step, torch.full_like(step, records[-1]["step_size"]))


def test_sgld_adapts_on_a_minibatched_bnn_with_learned_noise():
    torch.manual_seed(0)
    x = torch.randn(200, 3)
    y = torch.tanh(x @ torch.tensor([1.0, -2.0, 0.5])) + 0.1 * torch.randn(200)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = BNN(net, HomoskedasticGaussian(), subsample_size=32)
    mcmc = harness.run(SGLD(model, preconditioner="diag", num_steps_per_sample=5), 50, 40,
                       0, x, y)
    diag = kernel_diagnostics(mcmc)[0]
    assert set(diag["inverse_mass"]) == set(mcmc.get_samples())
    assert 0 < diag["step_size_adaptation"][-1]["step_size"] < 1
    scale = mcmc.get_samples()["obs_scale"]
    assert bool(torch.isfinite(scale).all()) and float(scale.mean()) < 0.5


# ------------------------------------------------------------------ records, resume, BN


def test_resume_after_adaptation_continues_bitwise():
    harness.assert_resume_continues(lambda: SGLD(gaussian_model(2), preconditioner="diag"))


def test_chosen_values_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="pyro_flat.adaptation"):
        harness.run(SGLD(gaussian_model()), 2, 4)
    lines = [r.getMessage() for r in caplog.records if r.name == "pyro_flat.adaptation"]
    assert len(lines) == 5 and "largest curvature 100" in lines[0], lines
    assert "step size 0.004" in lines[-2]
    # the default thinning is chosen by warmup when it adapts; 4 warmup draws are too few
    # to measure an autocorrelation, and the log says so
    assert "10 SG steps per draw (warmup too short to measure" in lines[-1], lines[-1]


def test_an_explicit_step_size_does_not_adapt():
    kernel = SGLD(gaussian_model(), 1e-3)
    mcmc = harness.run(kernel, 3, 3)
    assert "step_size_adaptation" not in kernel_diagnostics(mcmc)[0]
    assert kernel.metric is None and kernel.base_step_size == 1e-3


def test_curvature_estimates_leave_batchnorm_statistics_alone():
    net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.BatchNorm1d(4),
                              torch.nn.Linear(4, 1))
    model = BNN(net, HomoskedasticGaussian(0.5))
    x, y = torch.randn(40, 2), torch.randn(40)
    kernel = SGLD(model)
    harness.run(kernel, 1, 1, 0, x, y)  # one estimate and one SG step
    bn = net[1] if not hasattr(model.net, "1") else model.net[1]
    before = (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked))
    kernel.warmup.top_curvature()
    assert torch.equal(bn.running_mean, before[0]) and torch.equal(bn.running_var, before[1])
    assert int(bn.num_batches_tracked) == before[2]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(preconditioner="adam"), r"preconditioner must be one of \(None, 'diag'\), got 'adam'"),
    (dict(preconditioner="diag", step_size=1e-3), "omit step_size"),
    (dict(stability_fraction=1.5), r"stability_fraction must be a number in \(0.0, 1.0\), got 1.5"),
    (dict(stability_fraction=0.0), "stability_fraction"),
])
def test_bad_adaptation_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        SGLD(gaussian_model(), **kwargs)


@pytest.mark.parametrize("make", [
    lambda: EntropyMCMC(gaussian_model(), eta=0.1, preconditioner="diag"),
    lambda: SASGLD(gaussian_model(), rho=0.1, preconditioner="diag"),
])
def test_a_metric_is_refused_where_it_would_change_the_target(make):
    with pytest.raises(ValueError, match="preconditioner='diag' is not available"):
        make()


def test_adaptation_needs_warmup():
    with pytest.raises(ValueError, match=r"warmup_steps=0: give MCMC\(\.\.\., warmup_steps"):
        harness.run(SGLD(gaussian_model()), 3, 0)


def test_a_linear_potential_has_no_curvature_to_adapt_to():
    with pytest.raises(ValueError, match="largest curvature of the potential is 0"):
        harness.run(SGLD(potential_fn=lambda p: 3.0 * p["x"].sum(),
                         initial_params={"x": torch.zeros(2)}), 2, 2)


def test_stability_fraction_sets_the_discretisation_bias():
    """At fraction f the stiffest coordinate's ULA variance is 1 / (h (1 - f)): a closed form
    of the chosen step, checked on the exact formula (no sampling)."""
    for f in (0.05, 0.2, 0.5):
        kernel = SGLD(gaussian_model(), stability_fraction=f)
        harness.run(kernel, 1, 1)
        eps = kernel.base_step_size
        inflation = 1.0 / (1.0 - eps * 100.0 / 2.0)
        assert inflation == pytest.approx(1.0 / (1.0 - f), rel=1e-3)
        assert math.isfinite(inflation)
