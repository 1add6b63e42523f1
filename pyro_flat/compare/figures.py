"""The figures of ``pyro-flat compare``, one panel (or curve) per method, from
:mod:`pyro_flat.plots` (matplotlib ``Figure`` objects, no GUI backend):

* ``reliability.png``: reliability diagrams of the model averages on the test set;
* ``uncertainty.png``: predictive-entropy histograms on the test and the OOD inputs;
* ``loss_slices.png``: the mean training loss (log scale) along a filter-normalised random
  direction through each method's last draw (a flat basin is a wide, low profile).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from pyro_flat.compare.evaluation import Evaluation

FIGURES = ("reliability.png", "uncertainty.png", "loss_slices.png")


def _grid(n: int, panel: tuple[float, float] = (3.2, 2.8)) -> tuple:
    from matplotlib.figure import Figure

    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(panel[0] * cols, panel[1] * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_axis_off()
    return fig, axes


def write_figures(folder: Path, evaluations: dict[str, Evaluation], y_test: torch.Tensor,
                  dpi: int = 80) -> list[str]:
    """Draw the three figures into ``folder``; returns their file names (none if no method)."""
    import matplotlib

    from pyro_flat import plots

    if not evaluations:
        return []
    fig, axes = _grid(len(evaluations))
    for ax, (name, ev) in zip(axes, evaluations.items(), strict=False):
        plots.reliability_diagram(ev.probs_test, y_test, ax=ax, label=name)
        ax.legend().set_visible(False)
    fig.savefig(folder / FIGURES[0], dpi=dpi)
    fig, axes = _grid(len(evaluations))
    for ax, (name, ev) in zip(axes, evaluations.items(), strict=False):
        plots.uncertainty_histograms(ev.probs_test, ev.probs_ood, ax=ax, label=name)
        ax.legend(fontsize="x-small")
    fig.savefig(folder / FIGURES[1], dpi=dpi)
    fig = plots.loss_slice({name: ev.loss_slice for name, ev in evaluations.items()},
                           ylabel="mean training loss")
    fig.set_size_inches(8.0, 4.5)
    ax = fig.axes[0]
    colours = matplotlib.colormaps["tab20"]  # more methods than the default ten colours
    for i, line in enumerate(ax.get_lines()):
        line.set_color(colours(i % 20))
    ax.set_yscale("log")  # sharp and flat profiles on one plot
    ax.set_title("loss along a random direction through the last draw")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(folder / FIGURES[2], dpi=dpi)
    return list(FIGURES)
