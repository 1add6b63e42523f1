"""Smoke tests of pyro_flat.plots with the Agg backend: each function draws and returns a Figure."""

import math

import matplotlib

matplotlib.use("Agg")

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from pyro_flat import kernel_diagnostics, plots  # noqa: E402
from pyro_flat.infer.mcmc.contour import ContourSGLD  # noqa: E402


def probs_and_labels(n=200, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(2 * torch.randn(n, c, generator=g), -1)
    return probs, torch.randint(c, (n,), generator=g)


def test_reliability_diagram_draws_the_used_bins():
    probs, y = probs_and_labels()
    fig = plots.reliability_diagram(probs, y, num_bins=10, label="SGLD")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    conf = probs.max(-1).values
    used = torch.unique(torch.clamp((conf * 10).ceil() - 1, min=0)).numel()
    assert len(ax.patches) == used  # one bar per non-empty bin
    assert ax.get_title().startswith("SGLD: ECE")
    fig.savefig(__import__("io").BytesIO(), format="png")
    with pytest.raises(ValueError, match="num_bins"):
        plots.reliability_diagram(probs, y, num_bins=0)


def test_uncertainty_histograms_and_loss_slice():
    p_in, _ = probs_and_labels(seed=1)
    p_out = torch.full((50, 4), 0.25)
    fig = plots.uncertainty_histograms(p_in, p_out)
    assert isinstance(fig, Figure) and "AUROC" in fig.axes[0].get_title()
    assert fig.axes[0].lines[0].get_xdata()[0] == pytest.approx(math.log(4))
    with pytest.raises(ValueError, match="same number of classes"):
        plots.uncertainty_histograms(p_in, torch.full((5, 3), 1 / 3))
    a = torch.linspace(-1, 1, 11)
    fig = plots.loss_slice({"theta": (a, a**2), "guide": (a, 0.5 * a**2)})
    assert len(fig.axes[0].lines) == 2
    with pytest.raises(ValueError, match="1-D of one length"):
        plots.loss_slice({"bad": (a, a[:3])})


def test_trace_and_rank_through_arviz():
    rng = np.random.default_rng(0)
    idata = az.from_dict(posterior={"w": rng.normal(size=(2, 50)), "b": rng.normal(size=(2, 50))})
    fig = plots.trace_and_rank(idata, var_names=["w", "b"])
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 6  # trace density, trace, rank for each of two sites


def test_energy_pdf_of_a_contour_run():
    from pyro.infer import MCMC

    def potential(p):
        return ((p["x"] ** 2 - 1) ** 2).sum() * 4

    kernel = ContourSGLD(potential_fn=potential, initial_params={"x": torch.zeros(2)},
                         step_size=1e-2, num_bins=20, bin_width=0.5, min_energy=0.0, zeta=0.5)
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=10, disable_progbar=True)
    mcmc.run()
    fig = plots.energy_pdf(kernel_diagnostics(mcmc)[0])
    assert isinstance(fig, Figure)
    assert len(fig.axes[0].patches) >= 20  # the histogram's bars (and the stairs)
    with pytest.raises(ValueError, match="ContourSGLD run's diagnostics"):
        plots.energy_pdf({"divergences": []})
