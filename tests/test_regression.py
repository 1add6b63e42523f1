"""Regression analysis against independent computations (NumPy, SciPy, brute force)."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from pyro_flat import plots
from pyro_flat.evaluation import regression

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


# ------------------------------------------------------------------------------- wasserstein2


def _w2_by_replication(x, y):
    """W2 per point by brute force: repeat each of S draws R times and each of R draws S times,
    so that both have S R equally weighted atoms, and match them sorted."""
    s, r = x.shape[0], y.shape[0]
    xs = x.repeat_interleave(r, 0).sort(0).values
    ys = y.repeat_interleave(s, 0).sort(0).values
    return ((xs - ys) ** 2).mean(0).sqrt()


@pytest.mark.parametrize("s, r", [(5, 5), (3, 2), (7, 4), (6, 9), (2, 13)])
def test_wasserstein2_matches_brute_force_replication(s, r):
    g = torch.Generator().manual_seed(s * 100 + r)
    x = torch.randn(s, 4, generator=g, dtype=torch.float64)
    y = 2 * torch.randn(r, 4, generator=g, dtype=torch.float64) + 1
    w = regression.wasserstein2(x, y, reduction="none")
    assert torch.allclose(w, _w2_by_replication(x, y), atol=1e-12)
    assert regression.wasserstein2(x, y) == pytest.approx(float(w.mean()), abs=1e-12)


def test_wasserstein2_identities():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 5, generator=g, dtype=torch.float64)
    y = torch.randn(17, 5, generator=g, dtype=torch.float64) * 0.5
    c = torch.tensor([-2.0, -0.5, 0.0, 1.0, 3.0], dtype=torch.float64)
    w = regression.wasserstein2(x, y, reduction="none")
    # identical samples, and the same empirical distribution with each draw repeated, give 0
    assert regression.wasserstein2(x, x) == 0.0
    assert regression.wasserstein2(x, x.repeat(3, 1)[torch.randperm(90, generator=g)]) == 0.0
    # symmetric; invariant to a common shift and to the order of the draws
    assert torch.allclose(regression.wasserstein2(y, x, reduction="none"), w, atol=1e-12)
    assert torch.allclose(regression.wasserstein2(x + c, y + c, reduction="none"), w, atol=1e-12)
    assert torch.allclose(regression.wasserstein2(x.flip(0), y, reduction="none"), w, atol=1e-12)
    # a shift by c is at distance |c|; in general W2^2(x, y + c) = W2^2(x, y) - 2c(mx - my) + c^2
    assert torch.allclose(regression.wasserstein2(x, x + c, reduction="none"), c.abs(), atol=1e-12)
    shifted = regression.wasserstein2(x, y + c, reduction="none") ** 2
    expected = w**2 - 2 * c * (x.mean(0) - y.mean(0)) + c**2
    assert torch.allclose(shifted, expected, atol=1e-10)
    # scaling both by a scales the distance by |a| (a < 0 reverses both orders)
    assert torch.allclose(regression.wasserstein2(-2 * x, -2 * y, reduction="none"), 2 * w,
                          atol=1e-12)
    # the average is the mean of W2 over points, not the root of the mean of W2^2
    two = torch.zeros(4, 2, dtype=torch.float64)
    assert regression.wasserstein2(two, two + torch.tensor([1.0, 3.0])) == pytest.approx(2.0)


def _quantile_error_variance(n, sd):
    """Integrated variance of the sample quantile function of n draws of N(., sd^2):
    (sd^2 / n) int u (1 - u) / phi(Phi^-1(u))^2 du over [1/(n+1), n/(n+1)] (the integral
    diverges like log log n at the ends, where the n draws say nothing)."""
    f = lambda u: u * (1 - u) / stats.norm.pdf(stats.norm.ppf(u)) ** 2  # noqa: E731
    lo = 1 / (n + 1)
    return sd**2 * integrate.quad(f, lo, 1 - lo, limit=200)[0] / n


def test_wasserstein2_of_gaussians_matches_the_closed_form():
    """W2(N(m1, s1^2), N(m2, s2^2)) = sqrt((m1 - m2)^2 + (s1 - s2)^2), estimated from draws.

    Per point, the sample quantiles are Q(u) + e(u) with Var e(u) = s^2 u(1 - u) / (n phi^2)
    (asymptotic normality of sample quantiles). Expanding, W2_hat^2 - W2^2 = L + B where
    L = 2 int (dm + ds z_u)(e_x(u) - e_y(u)) du is centred: 2 dm times the difference of the
    sample means plus 2 ds times that of the L-estimators int z_u Q_hat(u) du of the scale,
    whose variance is s^2 / (2 n) for a Gaussian; so sd(L) = 2 sqrt(dm^2 (s1^2/S + s2^2/R)
    + ds^2 (s1^2/(2S) + s2^2/(2R))). B = int (e_x - e_y)^2 du >= 0 is the bias, about the sum
    of the integrated quantile-error variances. Averaging W2_hat ~ W2 + (L + B) / (2 W2) over
    N independent points, the error lies in [-4 sd, bias + 4 sd] with sd = sd(L)/(2 W2 sqrt N)
    and bias = B / (2 W2). (Checked over 20 seeds: error mean 0.0027, sd 0.0022, predicted
    bias 0.0032 and sd 0.0023.)
    """
    S, R, N = 3000, 2000, 200
    m1, s1, m2, s2 = 0.0, 1.0, 0.5, 1.5
    exact = math.hypot(m1 - m2, s1 - s2)
    x = _gaussian_draws(S, torch.full((N,), m1), torch.full((N,), s1), seed=1)
    y = _gaussian_draws(R, torch.full((N,), m2), torch.full((N,), s2), seed=2)
    sd_l = 2 * math.sqrt((m1 - m2) ** 2 * (s1**2 / S + s2**2 / R)
                         + (s1 - s2) ** 2 * (s1**2 / (2 * S) + s2**2 / (2 * R)))
    b = _quantile_error_variance(S, s1) + _quantile_error_variance(R, s2)
    sd, bias = sd_l / (2 * exact * math.sqrt(N)), b / (2 * exact)
    err = regression.wasserstein2(x, y) - exact
    assert -4 * sd <= err <= bias + 4 * sd, (err, sd, bias)
    # the same for W2^2 per point, averaged: error in [-4 sd(L)/sqrt N, B + 4 sd(L)/sqrt N]
    err_sq = float((regression.wasserstein2(x, y, reduction="none") ** 2).mean()) - exact**2
    assert -4 * sd_l / math.sqrt(N) <= err_sq <= b + 4 * sd_l / math.sqrt(N), (err_sq, sd_l, b)


@pytest.mark.parametrize("call, match", [
    (lambda: regression.wasserstein2(torch.zeros(1, 3), torch.zeros(4, 3)), r"^draws must have"),
    (lambda: regression.wasserstein2(torch.zeros(4, 3), torch.zeros(4, 2)),
     r"reference_draws must have shape \(num_reference_draws >= 2, num_data = 3\)"),
    (lambda: regression.wasserstein2(torch.zeros(4, 3), torch.zeros(1, 3)),
     r"reference_draws must have shape"),
    (lambda: regression.wasserstein2(torch.zeros(4, 3), torch.zeros(12)),
     r"reference_draws must have shape"),
    (lambda: regression.wasserstein2(torch.zeros(4, 3), "draws"), r"reference_draws must be a"),
    (lambda: regression.wasserstein2(torch.zeros(4, 3), torch.full((4, 3), float("inf"))),
     r"reference_draws hold NaN or inf"),
    (lambda: regression.wasserstein2(torch.full((4, 3), float("nan")), torch.zeros(4, 3)),
     r"^draws hold NaN or inf"),
    (lambda: regression.wasserstein2(torch.zeros(4, 3), torch.zeros(4, 3), reduction="sum"),
     r"reduction must be"),
])
def test_wasserstein2_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
