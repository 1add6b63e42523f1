"""Regression analysis against independent computations (NumPy, SciPy, brute force)."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from pyro_flat import plots, regression

Z = 4.5


def _gaussian_draws(num_draws, mean, sd, seed=0):
    g = torch.Generator().manual_seed(seed)
    return mean + sd * torch.randn(num_draws, len(mean), generator=g, dtype=torch.float64)


def test_summary_matches_numpy():
    draws = _gaussian_draws(500, torch.linspace(-1, 1, 7), torch.full((7,), 0.3))
    s = regression.predictive_summary(draws, level=0.8)
    x = draws.numpy()
    np.testing.assert_allclose(s.mean.numpy(), x.mean(0))
    np.testing.assert_allclose(s.sd.numpy(), x.std(0, ddof=1))
    np.testing.assert_allclose(s.lower.numpy(), np.quantile(x, 0.1, axis=0))
    np.testing.assert_allclose(s.upper.numpy(), np.quantile(x, 0.9, axis=0))


def test_rmse_and_gaussian_nll_match_numpy_and_scipy():
    g = torch.Generator().manual_seed(1)
    y, mean = torch.randn(50, generator=g), torch.randn(50, generator=g)
    sd = 0.5 + torch.rand(50, generator=g)
    assert regression.rmse(mean, y) == pytest.approx(
        math.sqrt(float(np.mean((mean.numpy() - y.numpy()) ** 2))))
    assert regression.gaussian_nll(mean, sd, y) == pytest.approx(
        -float(np.mean(stats.norm.logpdf(y.numpy(), mean.numpy(), sd.numpy()))), rel=1e-6)


def test_crps_gaussian_matches_its_integral():
    """CRPS = integral of (F(x) - 1{x >= y})^2 dx, by SciPy's quadrature."""
    for mu, sd, y in ((0.0, 1.0, 0.3), (2.0, 0.5, -1.0), (-1.0, 3.0, 4.0)):
        def integrand(x, mu=mu, sd=sd, y=y):
            return (stats.norm.cdf(x, mu, sd) - (x >= y)) ** 2

        expected = integrate.quad(integrand, -np.inf, y)[0] + integrate.quad(
            integrand, y, np.inf)[0]
        got = regression.crps_gaussian(torch.tensor([mu]), torch.tensor([sd]), torch.tensor([y]))
        assert got == pytest.approx(expected, rel=1e-6)


def test_sample_crps_is_the_energy_form():
    """The sorted-draws formula equals the O(S^2) double sum, and for Gaussian draws it is the
    closed form within Monte Carlo error."""
    draws = _gaussian_draws(60, torch.zeros(3), torch.ones(3), seed=2)
    y = torch.tensor([0.1, -1.5, 2.0], dtype=torch.float64)
    x = draws.numpy()
    brute = np.mean([np.mean(np.abs(x[:, i] - y[i].item()))
                     - 0.5 * np.mean(np.abs(x[:, i, None] - x[None, :, i])) for i in range(3)])
    assert regression.crps(draws, y) == pytest.approx(brute, rel=1e-10)
    many = _gaussian_draws(20000, torch.zeros(200), torch.ones(200), seed=3)
    y = torch.randn(200, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    exact = regression.crps_gaussian(torch.zeros(200), torch.ones(200), y)
    # per point the draws' CRPS has sd below 1 / sqrt(S); the mean over 200 points less
    assert regression.crps(many, y) == pytest.approx(exact, abs=Z / math.sqrt(20000))


def test_calibration_curve_of_a_calibrated_and_an_overconfident_predictive():
    """Draws from the true predictive cover y at the nominal rate, within Z binomial standard
    errors; draws half as wide cover less, by more than that."""
    n = 4000
    g = torch.Generator().manual_seed(5)
    mean = torch.randn(n, generator=g, dtype=torch.float64)
    y = mean + torch.randn(n, generator=g, dtype=torch.float64)
    levels, observed = regression.calibration_curve(_gaussian_draws(400, mean, torch.ones(n)), y)
    se = torch.sqrt(levels * (1 - levels) / n)
    # An interval between order statistics of S = 400 draws covers on average its nominal
    # mass up to O(1 / S) = 0.0025 (the draws' own noise is independent across points and
    # averages out over them); 0.01 allows for that bias.
    quantile_slack = 0.01
    assert torch.all((observed - levels).abs() <= Z * se + quantile_slack), observed - levels
    _, narrow = regression.calibration_curve(_gaussian_draws(400, mean, 0.5 * torch.ones(n)), y)
    assert torch.all(narrow[4:] < levels[4:] - Z * se[4:] - quantile_slack)
    summary = regression.predictive_summary(_gaussian_draws(400, mean, torch.ones(n)), level=0.9)
    assert regression.interval_coverage(summary.lower, summary.upper, y) == pytest.approx(
        0.9, abs=Z * math.sqrt(0.09 / n) + quantile_slack)


@pytest.mark.parametrize("call, match", [
    (lambda: regression.predictive_summary(torch.zeros(1, 5)), r"draws must have shape"),
    (lambda: regression.predictive_summary(torch.zeros(5, 3), level=1.0), r"level must be"),
    (lambda: regression.crps(torch.zeros(5, 3), torch.zeros(4)), r"y must hold one value"),
    (lambda: regression.crps(torch.full((5, 3), float("nan")), torch.zeros(3)), r"NaN or inf"),
    (lambda: regression.rmse(torch.zeros(4), torch.zeros(3)), r"mean must have the shape of y"),
    (lambda: regression.gaussian_nll(torch.zeros(3), torch.zeros(3), torch.zeros(3)),
     r"sd must be positive"),
    (lambda: regression.calibration_curve(torch.zeros(5, 3), torch.zeros(3), levels=[0.5, 2]),
     r"levels must be"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_plots_draw(tmp_path):
    x = torch.linspace(-2, 2, 30, dtype=torch.float64)
    draws = _gaussian_draws(100, torch.sin(x), torch.full((30,), 0.2))
    summary = regression.predictive_summary(draws)
    fig = plots.predictive_band(x, summary, x_obs=x, y_obs=torch.sin(x), label="SGLD")
    fig.savefig(tmp_path / "band.png")
    levels, observed = regression.calibration_curve(draws, torch.sin(x))
    plots.coverage_calibration(levels, observed).savefig(tmp_path / "calibration.png")
    assert (tmp_path / "band.png").stat().st_size > 0
    with pytest.raises(ValueError, match="x must hold one input per point"):
        plots.predictive_band(x[:5], summary)
