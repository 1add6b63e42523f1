"""The figures of ``pyro-flat compare``, one panel (or curve) per method, from
:mod:`pyro_flat.plots` (matplotlib ``Figure`` objects, no GUI backend):

* ``reliability.png``: reliability diagrams of the model averages on the test set
  (regression: observed against nominal coverage of central intervals, from the PIT);
* ``uncertainty.png``: predictive-entropy histograms on the test and the OOD inputs
  (regression: histograms of the predictive standard deviation);
* ``loss_slices.png``: the mean training loss (the task's negative log-likelihood; log scale
  when it is positive throughout) along a filter-normalised random direction through each
  method's last draw (a flat basin is a wide, low profile);
* ``predictive.png`` (regression on 1-D inputs): the predictive mean and 90% band over the
  inputs, with the training data and, where it is known, the true function and noise band.

The regression panels are drawn by :mod:`pyro_flat.compare.regression_figures`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pyro_flat.compare.evaluation import Evaluation
from pyro_flat.compare.task import task_of

FIGURES = ("reliability.png", "uncertainty.png", "loss_slices.png")
#: The extra figure of a regression on 1-D inputs.
PREDICTIVE = "predictive.png"


def names(data: Any) -> list[str]:
    """The figures :func:`write_figures` draws for ``data``."""
    one_d = tuple(data.x_train.shape[1:]) == (1,)
    return [*FIGURES, PREDICTIVE] if task_of(data) == "regression" and one_d else list(FIGURES)


def grid(n: int, panel: tuple[float, float] = (3.2, 2.8)) -> tuple:
    """A figure of ``n`` panels, up to four a row, and its axes (unused ones hidden)."""
    from matplotlib.figure import Figure

    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(panel[0] * cols, panel[1] * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_axis_off()
    return fig, axes


def write_figures(folder: Path, evaluations: dict[str, Evaluation], data: Any,
                  dpi: int = 80) -> list[str]:
    """Draw the figures of ``data``'s task into ``folder`` (:func:`names`); returns their file
    names (none if no method)."""
    from pyro_flat import plots

    if not evaluations:
        return []
    if task_of(data) == "regression":
        from pyro_flat.compare import regression_figures

        regression_figures.write(folder, evaluations, data, dpi)
    else:
        y_test = data.y_test.cpu()
        fig, axes = grid(len(evaluations))
        for ax, (name, ev) in zip(axes, evaluations.items(), strict=False):
            plots.reliability_diagram(ev.probs_test, y_test, ax=ax, label=name)
            ax.legend().set_visible(False)
        fig.savefig(folder / FIGURES[0], dpi=dpi)
        fig, axes = grid(len(evaluations))
        for ax, (name, ev) in zip(axes, evaluations.items(), strict=False):
            plots.uncertainty_histograms(ev.probs_test, ev.probs_ood, ax=ax, label=name)
            ax.legend(fontsize="x-small")
        fig.savefig(folder / FIGURES[1], dpi=dpi)
    _loss_slices(evaluations).savefig(folder / FIGURES[2], dpi=dpi)
    return names(data)


def _loss_slices(evaluations: dict[str, Evaluation]) -> Any:
    import matplotlib

    from pyro_flat import plots

    fig = plots.loss_slice({name: ev.loss_slice for name, ev in evaluations.items()},
                           ylabel="mean training loss")
    fig.set_size_inches(8.0, 4.5)
    ax = fig.axes[0]
    colours = matplotlib.colormaps["tab20"]  # more methods than the default ten colours
    for i, line in enumerate(ax.get_lines()):
        line.set_color(colours(i % 20))
    # sharp and flat profiles on one plot; a Gaussian NLL may be negative: symmetric log then
    positive = all(bool((ev.loss_slice[1] > 0).all()) for ev in evaluations.values())
    if positive:
        ax.set_yscale("log")
    else:
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title("loss along a random direction through the last draw")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
