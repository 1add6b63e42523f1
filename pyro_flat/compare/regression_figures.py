"""The regression figures of ``pyro-flat compare``, one panel per method (see
:mod:`pyro_flat.compare.figures`): interval coverage, predictive standard deviations in and out
of distribution, and for 1-D inputs the predictive band over the inputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pyro_flat.compare.evaluation import Evaluation
from pyro_flat.compare.figures import FIGURES, PREDICTIVE, grid
from pyro_flat.compare.mixture import calibration_error, central_coverage

#: Nominal levels of the coverage curves.
COVERAGE_LEVELS = tuple(i / 20 for i in range(1, 20))
#: The central interval of the predictive band, and its standard normal quantile.
BAND, BAND_Z = 0.9, 1.6448536269514722


def _truths() -> dict[str, tuple[Callable, Callable]]:
    """The true mean and noise standard deviation of the generated 1-D data sets."""
    from pyro_flat import datasets

    return {
        "heteroscedastic": (datasets.heteroscedastic_function,
                            datasets.heteroscedastic_noise_std),
        "regression_gap": (datasets.regression_gap_function,
                           lambda x: torch.full_like(x, datasets.REGRESSION_GAP_NOISE_STD)),
    }


def write(folder: Path, evaluations: dict[str, Evaluation], data: Any, dpi: int = 80) -> None:
    """Draw ``reliability.png``, ``uncertainty.png`` and, when every evaluation has a curve
    (1-D inputs), ``predictive.png`` into ``folder``."""
    y_test = data.y_test.cpu()
    fig, axes = grid(len(evaluations))
    for ax, (name, ev) in zip(axes, evaluations.items(), strict=False):
        coverage(ax, ev, y_test, name)
    fig.savefig(folder / FIGURES[0], dpi=dpi)
    fig, axes = grid(len(evaluations))
    for ax, (name, ev) in zip(axes, evaluations.items(), strict=False):
        sd_histograms(ax, ev, name)
    fig.savefig(folder / FIGURES[1], dpi=dpi)
    if all(ev.curve is not None for ev in evaluations.values()):
        fig, axes = grid(len(evaluations), panel=(3.6, 2.8))
        for i, (ax, (name, ev)) in enumerate(zip(axes, evaluations.items(), strict=False)):
            band(ax, ev, data, name)
            if i:  # the legend of the first panel serves all
                ax.legend().set_visible(False)
        fig.savefig(folder / PREDICTIVE, dpi=dpi)


def coverage(ax: Any, ev: Evaluation, y_test: torch.Tensor, name: str) -> None:
    """Observed against nominal coverage of the central intervals (from the PIT) on the test
    set; below the diagonal: intervals too narrow."""
    from pyro_flat import plots

    pit = ev.test.cdf(y_test)
    observed = central_coverage(pit, COVERAGE_LEVELS)
    plots.coverage_calibration(torch.tensor(COVERAGE_LEVELS), observed, ax=ax, label=name)
    ax.legend().set_visible(False)
    ax.set_title(f"{name}: calibration error {calibration_error(pit):.3f}", fontsize="small")


def sd_histograms(ax: Any, ev: Evaluation, name: str, num_bins: int = 30) -> None:
    """Densities of the predictive standard deviation (on a log10 axis) on the test and the OOD
    inputs; the title gives the OOD AUROC of the standard deviation."""
    import numpy as np

    sd_in, sd_out = np.log10(ev.test.sd().numpy()), np.log10(ev.ood.sd().numpy())
    both = np.concatenate([sd_in, sd_out])
    low, high = float(both.min()), float(both.max())
    kwargs = dict(bins=num_bins, range=(low, high if high > low else low + 1), density=True,
                  alpha=0.6)
    ax.hist(sd_in, label="in distribution", **kwargs)
    ax.hist(sd_out, label="out of distribution", **kwargs)
    ax.set(xlabel="log10 predictive standard deviation", ylabel="density")
    ax.set_title(f"{name}: OOD AUROC {ev.metrics['ood_auroc']:.3f}", fontsize="small")
    ax.legend(fontsize="x-small")


def band(ax: Any, ev: Evaluation, data: Any, name: str) -> None:
    """The mixture mean and its central 90% interval over the grid of inputs, the training
    points and, for a generated data set, the true mean with its true 90% noise band."""
    x, mix = ev.curve
    xs = x.numpy()
    lower, upper = mix.quantile((1 - BAND) / 2), mix.quantile((1 + BAND) / 2)
    ax.fill_between(xs, lower.numpy(), upper.numpy(), alpha=0.3, label=f"{BAND:.0%} interval")
    ax.plot(xs, mix.mean().numpy(), lw=1.5, label="mean")
    x_train, y_train = data.x_train.cpu().reshape(-1), data.y_train.cpu()
    ax.scatter(x_train.numpy(), y_train.numpy(), s=4, color="black", label="training data")
    truth = _truths().get(getattr(data, "name", None))
    if truth is not None:
        mean, noise = truth
        f, s = mean(x.float()).double(), noise(x.float()).double()
        ax.plot(xs, f.numpy(), color="tab:green", ls="--", lw=1, label="true mean")
        for edge in (f - BAND_Z * s, f + BAND_Z * s):
            ax.plot(xs, edge.numpy(), color="tab:green", ls=":", lw=1)
    span = float(y_train.max() - y_train.min())
    ax.set_ylim(float(y_train.min()) - 0.6 * span, float(y_train.max()) + 0.6 * span)
    ax.set(xlabel="x", ylabel="y")
    ax.set_title(name, fontsize="small")
    ax.legend(fontsize="xx-small", loc="upper left")
