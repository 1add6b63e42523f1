"""Regression figures: the predictive band over a 1-D input, and the coverage calibration."""

from __future__ import annotations

from typing import Any

import torch

from pyro_flat.evaluation.regression import RegressionSummary
from pyro_flat.plots._axes import axes_and_figure


def predictive_band(
    x: torch.Tensor, summary: RegressionSummary, *, x_obs: torch.Tensor | None = None,
    y_obs: torch.Tensor | None = None, ax: Any = None, label: str | None = None,
) -> Any:
    """The predictive mean and central interval over a 1-D input, with the data.

    Parameters
    ----------
    x : torch.Tensor
        ``(num_points,)`` inputs the summary was computed at (sorted here for drawing).
    summary : RegressionSummary
        From :func:`pyro_flat.evaluation.regression.predictive_summary` at those inputs.
    x_obs, y_obs : torch.Tensor, optional
        Observed data to scatter over the band.
    ax : matplotlib Axes, optional
        Where to draw; default a new figure.
    label : str, optional
        Title (e.g. the method's name).

    Returns
    -------
    matplotlib.figure.Figure
    """
    x = torch.as_tensor(x).double().reshape(-1)
    if len(x) != len(summary.mean):
        raise ValueError(f"x must hold one input per point of the summary ({len(summary.mean)}),"
                         f" got {len(x)}")
    order = torch.argsort(x)
    ax, fig = axes_and_figure(ax)
    xs = x[order].numpy()
    ax.fill_between(xs, summary.lower[order].numpy(), summary.upper[order].numpy(), alpha=0.3,
                    label=f"{summary.level:.0%} interval")
    ax.plot(xs, summary.mean[order].numpy(), lw=1.5, label="mean")
    if x_obs is not None and y_obs is not None:
        ax.scatter(torch.as_tensor(x_obs).reshape(-1).numpy(),
                   torch.as_tensor(y_obs).reshape(-1).numpy(), s=6, color="black",
                   label="data")
    ax.set(xlabel="x", ylabel="y")
    if label:
        ax.set_title(label)
    ax.legend(loc="best")
    return fig


def coverage_calibration(
    expected: torch.Tensor, observed: torch.Tensor, *, ax: Any = None, label: str | None = None
) -> Any:
    """Observed against expected coverage of central intervals, with the diagonal.

    ``expected, observed`` as :func:`pyro_flat.evaluation.regression.calibration_curve` returns
    them; a curve below the diagonal means intervals too narrow (over-confident).
    """
    ax, fig = axes_and_figure(ax)
    ax.plot([0, 1], [0, 1], color="gray", lw=1)
    ax.plot(torch.as_tensor(expected).numpy(), torch.as_tensor(observed).numpy(), marker=".",
            label=label or "observed")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="expected coverage", ylabel="observed coverage")
    ax.legend(loc="upper left")
    return fig
