"""Kernel Stein discrepancy (pyro_flat.evaluation.stein): the Stein kernel against autograd,
the exact laws of its estimators on Gaussians, its rise with a biased sampler, and the model
scores against a hand-written log-density (full batch and minibatched).

Statistical checks use independent replicates: a mean over R replicates is compared within
Z = 4 standard errors (the replicates' sd over sqrt(R)) of its exact expectation.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_flat.evaluation.stein import (
    imq_stein_kernel,
    kernel_stein_discrepancy,
    model_scores,
    stein_discrepancy,
)
from pyro_flat.infer import SGLD

Z = 4.0
PRECISION = torch.tensor([[2.0, 0.6, 0.0], [0.6, 1.0, -0.3], [0.0, -0.3, 0.5]],
                         dtype=torch.float64)
COV = torch.linalg.inv(PRECISION)
MEAN = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)


def gaussian_draws(n: int, generator: torch.Generator, cov_scale: float = 1.0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact draws of N(MEAN, cov_scale * COV) and their scores under N(MEAN, COV)."""
    chol = torch.linalg.cholesky(cov_scale * COV)
    x = MEAN + torch.randn(n, 3, generator=generator, dtype=torch.float64) @ chol.T
    return x, -(x - MEAN) @ PRECISION


def signed_square(ksd: float) -> float:
    return math.copysign(ksd * ksd, ksd)


def mean_and_se(values: list[float]) -> tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std() / math.sqrt(len(t)))


def test_stein_kernel_matches_autograd():
    """The closed form equals s_x.s_y k + s_x.grad_y k + s_y.grad_x k + tr grad_x grad_y k,
    differentiated by autograd, at random points and scores (float64, to 1e-10)."""
    g = torch.Generator().manual_seed(0)
    c, beta, ell = 0.8, -0.3, 1.7
    x, y = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g,
                                                                            dtype=torch.float64)
    sx, sy = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(
        4, 3, generator=g, dtype=torch.float64)

    def k(a, b):
        return (c * c + (a - b).square().sum() / ell**2) ** beta

    expected = torch.empty(5, 4, dtype=torch.float64)
    for i in range(5):
        for j in range(4):
            gx = torch.func.grad(k, 0)(x[i], y[j])
            gy = torch.func.grad(k, 1)(x[i], y[j])
            mixed = torch.func.jacfwd(torch.func.grad(k, 0), 1)(x[i], y[j])
            expected[i, j] = (sx[i] @ sy[j] * k(x[i], y[j]) + sx[i] @ gy + sy[j] @ gx
                              + mixed.trace())
    torch.testing.assert_close(imq_stein_kernel(x, sx, y, sy, c, beta, ell), expected,
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n", [40, 320])
def test_v_statistic_of_exact_draws_is_the_diagonal_over_n(n):
    """For n exact iid draws E[KSD_V^2] = E[k_pi(X, X)] / n, and E[k_pi(X, X)] =
    c^(2 beta) tr(P) - 2 beta d c^(2 beta - 2) (P the precision): the V-statistic falls as 1/n.
    """
    g = torch.Generator().manual_seed(n)
    values = []
    for _ in range(60):
        x, s = gaussian_draws(n, g)
        values.append(n * kernel_stein_discrepancy(x, s) ** 2)
    expected = float(PRECISION.trace()) + 2 * 0.5 * 3  # c = 1, beta = -1/2
    mean, se = mean_and_se(values)
    assert abs(mean - expected) <= Z * se, (mean, expected, se)


def test_u_statistic_of_exact_draws_has_mean_zero():
    g = torch.Generator().manual_seed(1)
    values = [signed_square(kernel_stein_discrepancy(*gaussian_draws(100, g), estimator="u"))
              for _ in range(60)]
    mean, se = mean_and_se(values)
    assert abs(mean) <= Z * se, (mean, se)


def test_u_statistic_grows_with_the_bias_of_the_draws():
    """Draws of N(MEAN, (1 + delta) COV), as a Langevin chain's at a finite step: the mean
    U-statistic (unbiased for the population KSD^2) rises with delta, each step by more than
    Z standard errors of the difference."""
    g = torch.Generator().manual_seed(2)
    means = []
    for delta in (0.0, 0.5, 1.5):
        values = [signed_square(kernel_stein_discrepancy(*gaussian_draws(400, g, 1 + delta),
                                                         estimator="u")) for _ in range(30)]
        means.append(mean_and_se(values))
    for (m0, s0), (m1, s1) in zip(means, means[1:], strict=False):
        assert m1 - m0 > Z * math.hypot(s0, s1), means


def test_rises_with_the_step_of_a_real_sgld_chain():
    """Eight vectorised SGLD chains on a 3-d Gaussian at 5% and at 60% of the stability limit
    (the large step's law has 2.5 times the variance in the stiffest direction), thinned in
    proportion to 1/step so both have about the same effective draws: the per-chain KSD of the
    large step is higher by more than Z standard errors of the difference."""
    lam = float(torch.linalg.eigvalsh(PRECISION).max())
    results = []
    for fraction, thin in ((0.05, 60), (0.6, 5)):
        def potential(params):
            d = params["x"] - MEAN.float()
            return 0.5 * torch.einsum("...i,ij,...j->...", d, PRECISION.float(), d)

        kernel = SGLD(potential_fn=potential, step_size=fraction * 2 / lam,
                      num_steps_per_sample=thin, vectorized_chains=8,
                      initial_params={"x": MEAN.float().expand(8, 3).clone()})
        pyro.set_rng_seed(3)
        mcmc = pyro.infer.MCMC(kernel, num_samples=300, warmup_steps=50, disable_progbar=True)
        mcmc.run()
        x = mcmc.get_samples()["x"].double()  # (draws, chains, 3)
        per_chain = [kernel_stein_discrepancy(x[:, c], -(x[:, c] - MEAN) @ PRECISION)
                     for c in range(8)]
        results.append(mean_and_se(per_chain))
    (small, s_small), (large, s_large) = results
    assert large - small > Z * math.hypot(s_small, s_large), results


def test_importance_weights_move_the_draws_to_the_target():
    """Draws of N(0, 4) in 1-d, reweighted by N(x; 0, 1) / N(x; 0, 4): the weighted KSD of
    the target N(0, 1) is smaller than the unweighted one, and equal weights change nothing."""
    g = torch.Generator().manual_seed(4)
    x = 2.0 * torch.randn(2000, 1, generator=g, dtype=torch.float64)
    log_w = (dist.Normal(0.0, 1.0).log_prob(x) - dist.Normal(0.0, 2.0).log_prob(x)).squeeze(-1)
    plain = kernel_stein_discrepancy(x, -x)
    assert kernel_stein_discrepancy(x, -x, log_weights=log_w) < 0.5 * plain
    assert kernel_stein_discrepancy(x, -x, log_weights=torch.zeros(2000)) == pytest.approx(
        plain, rel=1e-12)


def test_estimators_are_the_textbook_sums():
    """V = sum_ij k_ij / n^2 and U = sum_{i != j} k_ij / (n (n - 1)) for equal weights."""
    g = torch.Generator().manual_seed(10)
    x, s = gaussian_draws(50, g, 1.5)
    k = imq_stein_kernel(x, s, x, s)
    assert kernel_stein_discrepancy(x, s) ** 2 == pytest.approx(float(k.sum()) / 50**2,
                                                                 rel=1e-10)
    u = float(k.sum() - k.trace()) / (50 * 49)
    assert signed_square(kernel_stein_discrepancy(x, s, estimator="u")) == pytest.approx(
        u, rel=1e-10)


def test_blocks_do_not_change_the_value():
    g = torch.Generator().manual_seed(5)
    x, s = gaussian_draws(300, g, 1.5)
    for estimator in ("v", "u"):
        a = kernel_stein_discrepancy(x, s, estimator=estimator)
        b = kernel_stein_discrepancy(x, s, estimator=estimator, block_size=7)
        assert a == pytest.approx(b, rel=1e-10)


# --------------------------------------------------------------------------- the model's scores


def model(x, y, subsample_size=None):
    """A user's regression: a Normal weight vector, a HalfNormal noise scale (a transformed
    site), observed in a plate that may subsample itself."""
    w = pyro.sample("w", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    with pyro.plate("data", len(x), subsample_size=subsample_size) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, s), obs=y[i])


def data():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(60, 2, generator=g)
    return x, x @ torch.tensor([0.7, -1.2]) + 0.4 * torch.randn(60, generator=g)


def draws_of_the_model(n: int = 30) -> dict[str, torch.Tensor]:
    """Draws about as spread as the posterior (sds 0.05 and 0.09 on log s)."""
    g = torch.Generator().manual_seed(7)
    return {"w": torch.tensor([0.7, -1.2]) + 0.05 * torch.randn(n, 2, generator=g),
            "s": 0.4 * torch.exp(0.09 * torch.randn(n, generator=g))}


def hand_written_scores(samples, x, y):
    """grad of log p(w, s = exp(z), y) + z in (w, z = log s), by autograd."""
    out = []
    for w, s in zip(samples["w"], samples["s"], strict=True):
        w, z = w.clone().requires_grad_(), s.log().clone().requires_grad_()
        lp = (dist.Normal(0.0, 2.0).log_prob(w).sum() + dist.HalfNormal(1.0).log_prob(z.exp())
              + z + dist.Normal(x @ w, z.exp()).log_prob(y).sum())
        gw, gz = torch.autograd.grad(lp, (w, z))
        out.append(torch.cat([gw, gz.reshape(1)]))
    return torch.stack(out)


def test_model_scores_are_the_posterior_score_in_the_unconstrained_space():
    x, y = data()
    samples = draws_of_the_model()
    expected = hand_written_scores(samples, x, y)
    draws, scores, minibatched = model_scores(model, samples, x, y)
    torch.testing.assert_close(draws[:, 2], samples["s"].log())
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-4)
    assert not minibatched


@pytest.mark.parametrize("own_plate", [False, True], ids=["subsample_size", "model's plate"])
def test_minibatch_scores_are_unbiased(own_plate):
    """The mean of 400 minibatch scores (B = 10 of 60, a fresh minibatch each) is the exact
    score within Z standard errors, coordinate by coordinate."""
    x, y = data()
    one = {k: v[:1].expand(400, *v.shape[1:]) for k, v in draws_of_the_model().items()}
    fn = (lambda x, y: model(x, y, subsample_size=10)) if own_plate else model
    exact = model_scores(model, {k: v[:1] for k, v in one.items()}, x, y).scores
    _, noisy, minibatched = model_scores(fn, one, x, y, subsample_size=10, seed=8)
    assert minibatched
    if own_plate:  # scored on its own minibatches, also without subsample_size
        assert model_scores(fn, one, x, y, seed=8).scores.equal(noisy)
    assert noisy.std(0).min() > 0  # the minibatches differ
    se = noisy.std(0) / math.sqrt(400)
    assert ((noisy.mean(0) - exact[0]).abs() <= Z * se).all(), (noisy.mean(0), exact[0], se)


def test_minibatch_u_statistic_is_unbiased():
    """Over 40 seeds of minibatches, the U-statistic with minibatch scores has the U-statistic
    of exact scores as its mean (Z standard errors): each score enters linearly, and the
    minibatches of different draws are independent."""
    x, y = data()
    samples = draws_of_the_model(40)
    draws, exact, _ = model_scores(model, samples, x, y)
    exact_u = signed_square(kernel_stein_discrepancy(draws, exact, estimator="u"))
    u = []
    for seed in range(40):
        noisy = model_scores(model, samples, x, y, subsample_size=10, seed=seed).scores
        u.append(signed_square(kernel_stein_discrepancy(draws, noisy, estimator="u")))
    mean, se = mean_and_se(u)
    assert abs(mean - exact_u) <= Z * se, (mean, exact_u, se)
    # and stein_discrepancy takes the U-statistic with minibatch scores
    assert stein_discrepancy(model, samples, x, y, subsample_size=10, seed=0) == pytest.approx(
        math.copysign(math.sqrt(abs(u[0])), u[0]), rel=1e-9)


def test_stein_discrepancy_ranks_a_user_run():
    """An SGLD run on the user's model scores better than the same draws shifted by two
    posterior sds of the weights; both on the draws MCMC returns, as a user would pass them."""
    x, y = data()
    pyro.set_rng_seed(9)
    mcmc = pyro.infer.MCMC(SGLD(model, step_size=1e-3, num_steps_per_sample=5),
                           num_samples=200, warmup_steps=100, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    shifted = dict(samples, w=samples["w"] + 2 * samples["w"].std(0))
    assert stein_discrepancy(model, samples, x, y) < stein_discrepancy(model, shifted, x, y)


def test_bad_inputs_name_the_argument():
    x = torch.randn(10, 2)
    with pytest.raises(ValueError, match=r"beta must be in \(-1, 0\)"):
        kernel_stein_discrepancy(x, -x, beta=0.5)
    with pytest.raises(ValueError, match=r"c must be"):
        kernel_stein_discrepancy(x, -x, c=0.0)
    with pytest.raises(ValueError, match=r"lengthscale must be"):
        kernel_stein_discrepancy(x, -x, lengthscale=-1.0)
    with pytest.raises(ValueError, match=r"estimator must be 'v' or 'u'"):
        kernel_stein_discrepancy(x, -x, estimator="w")
    with pytest.raises(ValueError, match=r"both be \(n, d\)"):
        kernel_stein_discrepancy(x, -x[:, :1])
    with pytest.raises(ValueError, match=r"log_weights must be \(10,\)"):
        kernel_stein_discrepancy(x, -x, log_weights=torch.zeros(3))
    with pytest.raises(ValueError, match=r"weight on at least two draws"):
        kernel_stein_discrepancy(x, -x, log_weights=torch.tensor([0.0] + [-math.inf] * 9),
                                 estimator="u")
    with pytest.raises(ValueError, match=r"finite"):
        kernel_stein_discrepancy(x.clone().fill_(math.nan), -x)
    xs, ys = data()
    with pytest.raises(ValueError, match=r"no draws of the model's latent site\(s\) \['s'\]"):
        model_scores(model, {"w": torch.zeros(3, 2)}, xs, ys)
    with pytest.raises(ValueError, match=r"subsample_size=7, but the model subsamples its "
                                         r"plate 'data' by 10"):
        model_scores(lambda x, y: model(x, y, 10), draws_of_the_model(), xs, ys,
                     subsample_size=7)
