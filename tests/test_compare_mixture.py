"""The Gaussian-mixture predictive of ``compare`` on regression, against independent
computations: SciPy's densities, the single-Gaussian CRPS, Monte Carlo estimates with their
standard errors, and the exact coverage of a miscalibrated Gaussian."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from pyro_flat.compare.evaluation import regression_scores
from pyro_flat.compare.mixture import (
    CALIBRATION_LEVELS,
    GaussianMixture,
    calibration_error,
    central_coverage,
)
from pyro_flat.evaluation import classification, regression


def random_mixture(num_draws, num_data, seed=0, weights=None):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(num_draws, num_data, generator=g, dtype=torch.float64)
    scale = 0.2 + torch.rand(num_draws, num_data, generator=g, dtype=torch.float64)
    return GaussianMixture.equal(loc, scale, weights)


def sample(mix, num, seed):
    """``num`` draws per point of the mixture, ``(num, num_data)``."""
    g = torch.Generator().manual_seed(seed)
    comp = torch.multinomial(mix.weights, num * mix.loc.shape[1], replacement=True,
                             generator=g).reshape(num, -1)
    cols = torch.arange(mix.loc.shape[1])
    z = torch.randn(num, mix.loc.shape[1], generator=g, dtype=torch.float64)
    return mix.loc[comp, cols] + mix.scale[comp, cols] * z


@pytest.mark.parametrize("weighted", [False, True])
def test_nll_is_minus_the_log_of_the_mixture_density(weighted):
    weights = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64) if weighted else None
    mix = random_mixture(3, 40, weights=weights)
    y = torch.randn(40, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    w = mix.weights.numpy()
    density = sum(w[s] * stats.norm.pdf(y.numpy(), mix.loc[s].numpy(), mix.scale[s].numpy())
                  for s in range(3))
    np.testing.assert_allclose(mix.log_prob(y).numpy(), np.log(density), rtol=1e-10)
    # far in a tail the density underflows, the log-sum-exp does not
    far = mix.log_prob(torch.full((40,), 60.0, dtype=torch.float64))
    assert bool(torch.isfinite(far).all())


def test_moments_cdf_and_quantiles():
    mix = random_mixture(4, 30, seed=1, weights=torch.tensor([0.4, 0.3, 0.2, 0.1]))
    draws = sample(mix, 200_000, seed=2)
    se = draws.std(0) / math.sqrt(len(draws))
    assert bool(((mix.mean() - draws.mean(0)).abs() < 5 * se).all())
    assert torch.allclose(mix.sd(), draws.std(0), rtol=0.01)
    y = torch.zeros(30, dtype=torch.float64)
    empirical = (draws <= y).double().mean(0)
    assert bool(((mix.cdf(y) - empirical).abs() < 5 * 0.5 / math.sqrt(len(draws))).all())
    for q in (0.05, 0.5, 0.95):
        assert torch.allclose(mix.cdf(mix.quantile(q)), torch.full((30,), q,
                                                                   dtype=torch.float64))


def test_crps_of_one_component_is_the_gaussian_crps():
    mix = random_mixture(1, 50, seed=3)
    y = torch.randn(50, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    expected = regression.crps_gaussian(mix.loc[0], mix.scale[0], y)
    assert float(mix.crps(y).mean()) == pytest.approx(expected, rel=1e-12)


def test_crps_of_a_mixture_matches_monte_carlo():
    """CRPS = E|X - y| - E|X - X'| / 2; with independent pairs (X_k, X'_k) from the mixture,
    c_k = |X_k - y| - |X_k - X'_k| / 2 is an unbiased estimate with standard error
    sd(c) / sqrt(M). Bimodal components (means up to 2 apart), unequal weights, 8 points:
    each closed-form value within 4.5 standard errors (|z| < 4.5 for 8 normals fails with
    probability 5e-5)."""
    weights = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    mix = random_mixture(3, 8, seed=6, weights=weights)
    y = torch.linspace(-2, 2, 8, dtype=torch.float64)
    m = 400_000
    x, x2 = sample(mix, m, seed=7), sample(mix, m, seed=8)
    c = (x - y).abs() - 0.5 * (x - x2).abs()
    z = (mix.crps(y) - c.mean(0)) / (c.std(0) / math.sqrt(m))
    assert float(z.abs().max()) < 4.5, z
    # and the mixture is not scored as one Gaussian of its mean and sd
    one = torch.tensor([regression.crps_gaussian(mix.mean()[i:i + 1], mix.sd()[i:i + 1],
                                                 y[i:i + 1]) for i in range(8)])
    assert float((mix.crps(y) - one).abs().max()) > 0.01


def test_calibration_error_of_a_well_specified_predictive_is_sampling_noise():
    """y drawn from the predictive itself: the PIT is uniform, so each coverage is a binomial
    share with standard deviation sqrt(p (1 - p) / n); the error (the mean of their absolute
    deviations) has expectation about sqrt(2 / pi) times their mean, 0.0023 at n = 20,000. It
    must stay below 4 times that mean standard deviation (0.012)."""
    n = 20_000
    mix = random_mixture(3, n, seed=9, weights=torch.tensor([0.2, 0.5, 0.3]))
    y = sample(mix, 1, seed=10)[0]
    p = torch.tensor(CALIBRATION_LEVELS, dtype=torch.float64)
    bound = float((p * (1 - p) / n).sqrt().mean())
    error = calibration_error(mix.cdf(y))
    assert error < 4 * bound, (error, bound)


def test_calibration_error_of_a_predictive_twice_too_narrow():
    """y ~ N(0, 1) scored by N(0, 0.5^2): the central p interval covers
    2 Phi(z_p / 2) - 1 < p; the error is their mean gap, 0.215, up to sampling noise
    (within 4 mean binomial standard deviations, 0.012)."""
    n = 20_000
    g = torch.Generator().manual_seed(11)
    y = torch.randn(n, generator=g, dtype=torch.float64)
    narrow = GaussianMixture.equal(torch.zeros(1, n), torch.full((1, n), 0.5))
    p = np.array(CALIBRATION_LEVELS)
    covered = 2 * stats.norm.cdf(stats.norm.ppf((1 + p) / 2) / 2) - 1
    expected = float(np.mean(p - covered))
    assert expected > 0.15
    error = calibration_error(narrow.cdf(y))
    bound = float(np.sqrt(covered * (1 - covered) / n).mean())
    assert error == pytest.approx(expected, abs=4 * bound)
    coverage = central_coverage(narrow.cdf(y), CALIBRATION_LEVELS)
    assert bool((coverage < torch.tensor(CALIBRATION_LEVELS, dtype=torch.float64)).all())


def test_scores_use_the_mixture_sd_for_ood():
    """The OOD AUROC ranks points by the mixture's predictive standard deviation: spread of
    the draws' means (epistemic) counts as much as their noise scale (aleatoric)."""
    n = 50
    g = torch.Generator().manual_seed(12)
    test = GaussianMixture.equal(0.01 * torch.randn(4, n, generator=g), torch.full((4, n), 0.5))
    spread = GaussianMixture.equal(3 * torch.randn(4, n, generator=g), torch.full((4, n), 0.5))
    y = torch.zeros(n)
    row = regression_scores(test, spread, y)
    assert row["ood_auroc"] == 1.0
    assert regression_scores(spread, test, y)["ood_auroc"] == 0.0
    assert row["ood_auroc"] == classification.ood_auroc(test.sd(), spread.sd())
    assert row["rmse"] == pytest.approx(float(test.mean().square().mean().sqrt()))
    assert row["nll"] == pytest.approx(float(-test.log_prob(y).mean()))
    assert row["crps"] == pytest.approx(float(test.crps(y).mean()))


def test_calibration_error_adds_misses_of_both_signs():
    """Half the PIT values at the median (inside every interval), half at 0 (inside none):
    every level is covered half the time, so the errors |0.5 - p| over p = 0.1, ..., 0.9 are
    0.4, ..., 0, ..., 0.4, mean 2/9; signed errors would cancel to 0."""
    pit = torch.tensor([0.5, 0.0] * 50, dtype=torch.float64)
    coverage = central_coverage(pit, CALIBRATION_LEVELS)
    assert torch.equal(coverage, torch.full((9,), 0.5, dtype=torch.float64))
    assert calibration_error(pit) == pytest.approx(2 / 9, rel=1e-12)
