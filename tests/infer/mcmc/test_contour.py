"""ContourSGLD: reduction to SGLD at zeta = 0, the mixture toy (ALGORITHMS.md §2, Toy B),
reweighting, checkpoints and bad input."""

import math

import harness
import pytest
import torch

from pyro_flat.infer import SGLD
from pyro_flat.infer.mcmc.contour import ContourSGLD, reweight


def test_zeta_zero_is_sgld():
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=50)
    a = harness.run(SGLD(model, step_size=1e-4, num_steps_per_sample=3), 30, 5, 11, x, y)
    kw = dict(step_size=1e-4, num_steps_per_sample=3, num_bins=10, bin_width=50.0,
              min_energy=0.0)
    b = harness.run(ContourSGLD(model, zeta=0.0, **kw), 30, 5, 11, x, y)
    c = harness.run(ContourSGLD(model, zeta=1.0, **kw), 30, 5, 11, x, y)
    for site, values in a.get_samples().items():
        assert torch.equal(values, b.get_samples()[site])
        assert not torch.equal(values, c.get_samples()[site])
    stats = b._diagnostics[0]["sample_stats"]
    assert torch.equal(stats["log_weight"], torch.zeros(30))
    assert torch.allclose(stats["energy"], -stats["lp"])
    assert stats["energy_bin"].dtype == torch.long


def test_stats_and_diagnostics_follow_the_rule():
    """energy_bin is the bin of energy, log_weight = zeta log g[bin], g stays on the simplex."""
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=50)
    k = ContourSGLD(model, step_size=1e-4, num_bins=8, bin_width=40.0, min_energy=200.0,
                    zeta=0.5)
    mcmc = harness.run(k, 40, 5, 0, x, y)
    d = mcmc._diagnostics[0]
    e, b = d["sample_stats"]["energy"], d["sample_stats"]["energy_bin"]
    expected = ((e.double() - 200.0) / 40.0).floor().clamp(0, 7).long()
    assert torch.equal(b, expected)
    assert torch.all(torch.isfinite(d["sample_stats"]["log_weight"]))
    assert torch.allclose(d["energy_edges"], 200.0 + 40.0 * torch.arange(9.0).double())
    assert float(d["energy_pdf"].sum()) == pytest.approx(1.0, abs=1e-12)
    assert d["num_sa_updates"] == k.num_steps


def test_multiplier_and_initial_pdf():
    k = ContourSGLD(lambda: None, step_size=1e-3, num_bins=4, bin_width=2.0, min_energy=0.0,
                    zeta=1.5, temperature=2.0, multiplier_clip=(-5.0, 0.9))
    k.init_kernel_state(torch.zeros(1))
    assert torch.allclose(k._g, torch.tensor([4, 3, 2, 1.0], dtype=torch.float64) / 10)
    assert [k.bin_of(u) for u in (-3.0, 0.0, 1.99, 2.0, 7.9, 100.0)] == [0, 0, 0, 1, 3, 3]
    slope = math.log(3 / 4) / 2.0  # bin 0 uses the slope of bins 0-1 (J- = max(J, 1))
    assert k.multiplier(0) == pytest.approx(1 + 1.5 * 2.0 * slope)
    assert k.multiplier(3) == pytest.approx(1 + 1.5 * 2.0 * math.log(1 / 2) / 2.0)
    k.multiplier_clip = (0.2, 0.9)
    assert k.multiplier(3) == 0.2
    assert k.multiplier(1) == pytest.approx(min(0.9, 1 + 1.5 * 2.0 * math.log(3 / 4) / 2.0))


def test_reweight_weighted_and_systematic():
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    values = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 0.0], [4.0, 1.0]])
    mean = reweight(values, w.log())
    assert torch.allclose(mean, torch.tensor([3.0, 0.6]))
    # two chains pooled = one concatenated run
    two = reweight(values.reshape(2, 2, 2), (w * 7).log().reshape(2, 2))
    assert torch.allclose(two, mean)
    # systematic resampling: each draw exactly floor(n w) or ceil(n w) times, for any uniform
    counts = torch.zeros(4)
    g = torch.Generator().manual_seed(0)
    for _ in range(2000):
        idx = reweight(torch.arange(4), w.log(), "resample", num_samples=10, generator=g)
        c = torch.bincount(idx, minlength=4).double()
        assert torch.all(c >= (10 * w).floor()) and torch.all(c <= (10 * w).ceil() + 1e-9)
        counts += c
    # unbiased: E[count] = n w; each count has at most 1 of spread, so the mean of 2000 is
    # within Z * 0.5 / sqrt(2000) = 0.05 of n w
    assert torch.allclose(counts.double() / 2000, 10 * w, atol=harness.Z * 0.5 / math.sqrt(2000))
    with pytest.raises(ValueError, match="method must be"):
        reweight(values, w.log(), "while")


def test_resume_continues_the_chain_and_g():
    x, y = harness.linear_regression_data()

    def kernel():
        model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=64)
        return ContourSGLD(model, step_size=1e-4, num_bins=6, auto_bins=True, zeta=1.0,
                           num_steps_per_sample=2)

    whole = harness.run(kernel(), 20, 4, 3, x, y)
    first = harness.run(kernel(), 10, 4, 3, x, y)
    state = first.kernel.state_dict()
    resumed = kernel()
    resumed.load_state_dict(state)
    second = harness.run(resumed, 10, 0, 99, x, y)
    for site, values in whole.get_samples().items():
        assert torch.equal(values[10:], second.get_samples()[site]), site
    assert torch.equal(whole._diagnostics[0]["energy_pdf"], second._diagnostics[0]["energy_pdf"])
    assert torch.equal(whole._diagnostics[0]["sample_stats"]["log_weight"][10:],
                       second._diagnostics[0]["sample_stats"]["log_weight"])
    assert resumed.bin_width == whole.kernel.bin_width > 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_bins=1), "num_bins must be an integer >= 2"),
    (dict(bin_width=0.0), r"bin_width must be a finite number in \(0, inf\)"),
    (dict(bin_width=float("nan")), "bin_width"),
    (dict(min_energy=float("inf")), "min_energy"),
    (dict(zeta=-1.0), r"zeta must be a finite number in \[0, inf\)"),
    (dict(zeta=float("nan")), "zeta"),
    (dict(omega0=0.0), "omega0"),
    (dict(multiplier_clip=(5, -5)), "multiplier_clip"),
    (dict(auto_bins=True), "auto_bins"),
    (dict(bin_width=None), "bin_width and min_energy are required"),
])
def test_bad_input(kwargs, match):
    args = dict(step_size=1e-3, num_bins=10, bin_width=1.0, min_energy=0.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ContourSGLD(lambda: None, **args)
