"""SASGLD (sharpness-aware SGLD): reduction to SGLD, the closed-form ascent step on a quadratic,
sampling a Gaussian with its known sharpness-aware bias, BatchNorm protection, resume, errors.
"""

import harness
import pyro
import pytest
import torch
from torch import nn

from pyro_flat import kernel_diagnostics
from pyro_flat.infer.mcmc.sharpness import SASGLD, find_batchnorm
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HomoskedasticGaussian
from pyro_flat.optim.ascent import ASAM_OFFSET as GEOMETRY_ETA


def stats_of(mcmc):
    return kernel_diagnostics(mcmc)[0]["sample_stats"]


@pytest.mark.parametrize("geometry", [False, True])
def test_one_step_on_a_quadratic_is_the_closed_form(geometry):
    """U = theta^T H theta / 2 at T = 0: one step is theta - eps H (theta + e) with
    e = rho H theta / ||H theta|| (Euclidean) or rho D H theta / sqrt(g^T D g), D = (|theta| +
    eta)^2 (geometry); the sharpness stat is U(theta + e) - U(theta); lp and grad_norm are at
    the unperturbed draw."""
    a = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, -0.2], [0.0, -0.2, 0.5]], dtype=torch.double)
    h = a @ a.T + 0.1 * torch.eye(3, dtype=torch.double)
    theta0 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.double)

    def potential(params):
        t = params["t"]
        return 0.5 * t @ h @ t

    def u(t):
        return float(0.5 * t @ h @ t)

    def step(t):
        g = h @ t
        if geometry:
            d = (t.abs() + GEOMETRY_ETA) ** 2
            e = rho * d * g / torch.sqrt(g @ (d * g))
        else:
            e = rho * g / torch.linalg.vector_norm(g)
        return t - eps * h @ (t + e), u(t + e) - u(t)

    eps, rho = 0.05, 0.3
    kernel = SASGLD(potential_fn=potential, initial_params={"t": theta0.clone()}, step_size=eps,
                    rho=rho, geometry=geometry, temperature=0.0)
    mcmc = harness.run(kernel, 2, 0, 0)
    draws = mcmc.get_samples()["t"]
    theta1, sharp1 = step(theta0)
    theta2, sharp2 = step(theta1)
    torch.testing.assert_close(draws[0], theta1, rtol=0, atol=1e-12)
    torch.testing.assert_close(draws[1], theta2, rtol=0, atol=1e-12)
    s = stats_of(mcmc)
    expected_sharpness = torch.tensor([sharp1, sharp2], dtype=s["sharpness"].dtype)
    torch.testing.assert_close(s["sharpness"], expected_sharpness, rtol=1e-6, atol=1e-9)
    assert sharp1 > 0
    # lp / grad_norm at the draw itself (unperturbed), not at draw + e
    expected_lp = torch.tensor([-u(theta1), -u(theta2)], dtype=s["lp"].dtype)
    torch.testing.assert_close(s["lp"], expected_lp, rtol=1e-6, atol=1e-9)
    gn = torch.stack([torch.linalg.vector_norm(h @ theta1), torch.linalg.vector_norm(h @ theta2)])
    torch.testing.assert_close(s["grad_norm"], gn.to(s["grad_norm"].dtype), rtol=1e-6, atol=1e-9)


def test_gaussian_with_its_sharpness_aware_bias():
    """On a Gaussian U = (x - m)^T H (x - m) / 2 the perturbed gradient is
    H (x - m) + rho H g / ||g||, g = H (x - m). With K vectorised chains the norm runs over all
    of them (the kernel's definition: one norm over all parameters), so
    ||g|| ~ sqrt(K tr(H P H)) concentrates (relative fluctuation ~ 1/sqrt(2 K d) = 3%) and each
    chain runs linear Langevin with the effective Hessian H' = H + c H^2, c = rho / ||g||: its
    mean is m exactly and its stationary covariance P is the discrete Lyapunov solution for H',
    solved self-consistently for c. The coupling thus only sets the per-chain radius
    c ||g_k|| ~ rho / sqrt(K) = 0.08; the check is against that exact law within Z standard
    errors, and against the target N(m, H^-1) within the stated bias |P - H^-1| plus Z s.e.
    """
    target = harness.correlated_2d()
    k, eps, rho = target.num_chains, 0.05, 1.3
    h = target.precision.double()
    c = 0.0
    for _ in range(50):
        p = harness.langevin_exact_cov(h + c * h @ h, eps)
        c = rho / float(torch.sqrt(k * torch.trace(h @ p @ h)))
    exact = harness.langevin_exact_cov(h + c * h @ h, eps)
    sgld_exact = harness.langevin_exact_cov(h, eps)
    kernel = SASGLD(potential_fn=target, initial_params=target.initial_params(), step_size=eps,
                    rho=rho, num_steps_per_sample=5)
    mcmc = harness.run(kernel, num_samples=600, warmup_steps=40)
    chains = harness.chains_of(mcmc)
    m, cov, se_mean, se_cov = harness.moments_with_errors(chains)
    z = harness.Z
    assert torch.all((m - target.mean.double()).abs() <= z * se_mean), (m, se_mean)
    assert torch.all((cov - exact).abs() <= z * se_cov), (cov, exact, se_cov)
    bias = (exact - target.cov.double()).abs()
    assert torch.all((cov - target.cov.double()).abs() <= bias + z * se_cov)
    assert float(bias.max()) < 0.1
    # the check has power: the sharpness-aware law is told apart from plain SGLD's
    assert float(((cov - sgld_exact).abs() / se_cov).max()) > z
    sharp = stats_of(mcmc)["sharpness"]
    assert bool((sharp > 0).all())  # U(x + e) - U(x) > 0 on a convex U without noise
    # first order: rho ||g|| + rho^2 c-terms; ~rho ||g|| with ||g|| = rho / c
    assert abs(float(sharp.mean()) / (rho * rho / c) - 1) < 0.1


def BNRegression(batch_size):  # noqa: N802 (reads as the model class it builds)
    """A small Bayesian net with a BatchNorm layer in training mode, minibatched."""
    net = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
    return BNN(net, HomoskedasticGaussian(scale=1.0), subsample_size=batch_size)


def bn_buffers(model):
    return {k: v.clone() for k, v in model.named_buffers() if "running" in k or "num_batches" in k}


def test_batchnorm_statistics_do_not_move_in_the_perturbed_pass():
    x, y = harness.linear_regression_data()
    model = BNRegression(batch_size=32)
    assert len(find_batchnorm(model)) == 1
    assert find_batchnorm(model.forward) == find_batchnorm(model)
    kernel = SASGLD(model, step_size=1e-4, rho=0.5)
    pyro.set_rng_seed(0)
    kernel.setup(0, x, y)
    batch = kernel.minibatches.next()
    z0, before = kernel.position.clone(), bn_buffers(model)
    kernel.potential_and_grad(batch)  # one unperturbed pass: the reference update
    one_pass = bn_buffers(model)
    assert not torch.equal(one_pass["net.1.running_mean"], before["net.1.running_mean"])
    for name, value in before.items():  # back to the start
        model.get_buffer(name).copy_(value)
    estimate = kernel.estimator(kernel.state.position, kernel.evaluate_rows, batch)
    assert estimate.step_grad is not estimate.grad and estimate.stats["sharpness"][0] != 0.0
    assert torch.equal(kernel.position, z0)  # parameters restored exactly
    for name, value in bn_buffers(model).items():
        assert torch.equal(value, one_pass[name]), name
    # the check can fail: without the protection the second pass moves the statistics
    for name, value in before.items():
        model.get_buffer(name).copy_(value)
    kernel.estimator.batchnorm_modules = []
    kernel.estimator(kernel.state.position, kernel.evaluate_rows, batch)
    after = bn_buffers(model)
    assert not torch.equal(after["net.1.running_mean"], one_pass["net.1.running_mean"])
    assert int(after["net.1.num_batches_tracked"]) == int(one_pass["net.1.num_batches_tracked"]) + 1


def test_both_passes_use_the_same_minibatch():
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=50)
    kernel = SASGLD(model, step_size=1e-4, rho=0.1)
    pyro.set_rng_seed(0)
    kernel.setup(0, x, y)
    calls, potential = [], kernel.target.potential

    class Recording:
        flat_prior = potential.flat_prior

        def __call__(self, params, batch):
            calls.append(batch.clone())
            return potential(params, batch)

    kernel.target.potential = Recording()
    for _ in range(3):
        kernel.stepper.step(1e-4, kernel.minibatches.next())
    assert len(calls) == 6
    for i in range(3):
        assert torch.equal(calls[2 * i], calls[2 * i + 1])
    assert not torch.equal(calls[0], calls[2])


def test_nonfinite_perturbed_pass_marks_the_draw_diverging():
    """U is finite at theta but not at theta + e: the step is refused and the draw diverging."""

    def potential(params):
        t = params["t"]
        return torch.where(t < 1.0, 0.5 * t * t, torch.full_like(t, float("nan"))).sum()

    kernel = SASGLD(potential_fn=potential, initial_params={"t": torch.tensor([0.9])},
                    step_size=0.01, rho=0.5, temperature=0.0, max_nonfinite_steps=5)
    mcmc = harness.run(kernel, 2, 0, 0)
    assert torch.equal(mcmc.get_samples()["t"], torch.tensor([[0.9], [0.9]]))
    assert bool(stats_of(mcmc)["diverging"].all())
    with pytest.raises(RuntimeError, match="non-finite"):
        harness.run(SASGLD(potential_fn=potential, initial_params={"t": torch.tensor([0.9])},
                           step_size=0.01, rho=0.5, temperature=0.0, max_nonfinite_steps=5), 6, 0)


def test_kernel_with_batchnorm_pickles():
    import pickle

    model = BNRegression(batch_size=32)
    kernel = pickle.loads(pickle.dumps(SASGLD(model, step_size=1e-4, rho=0.1)))
    x, y = harness.linear_regression_data()
    mcmc = harness.run(kernel, 3, 0, 0, x, y)
    found = kernel.estimator.batchnorm_modules
    assert len(found) == 1 and found[0] is kernel.model.net[1]
    assert stats_of(mcmc)["sharpness"].shape == (3,)
