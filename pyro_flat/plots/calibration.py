"""Reliability diagram: accuracy against confidence in equal-width bins."""

from __future__ import annotations

from typing import Any

import torch

from pyro_flat import validation
from pyro_flat.evaluation import classification
from pyro_flat.plots._axes import axes_and_figure


def reliability_diagram(
    probs: torch.Tensor, y: torch.Tensor, num_bins: int = 15, *, ax: Any = None,
    label: str | None = None,
) -> Any:
    """Accuracy per confidence bin against the diagonal of perfect calibration.

    Bars show the accuracy of the examples in each equal-width confidence bin (bins as in
    :func:`pyro_flat.evaluation.classification.ece`), the dashed line the bin's mean confidence; the
    title gives the ECE. Empty bins are left out.

    Parameters
    ----------
    probs, y : torch.Tensor
        ``(num_data, num_classes)`` predictive probabilities (e.g. a model average) and labels.
    num_bins : int
        Number of bins, ``>= 1``.
    ax : matplotlib Axes, optional
        Where to draw; default a new figure.
    label : str, optional
        Prefix of the title (e.g. the method's name).

    Returns
    -------
    matplotlib.figure.Figure
    """
    num_bins = validation.integer_at_least("num_bins", num_bins, 1)
    p, labels = classification.checked_probs_and_labels(probs, y)
    conf, pred = p.max(-1)
    correct = (pred == labels).double()
    edges = torch.arange(1, num_bins, dtype=torch.float64) / num_bins
    bins = torch.bucketize(conf, edges, right=False)
    count = torch.bincount(bins, minlength=num_bins).double()
    acc = torch.bincount(bins, correct, minlength=num_bins) / count.clamp_min(1)
    mean_conf = torch.bincount(bins, conf, minlength=num_bins) / count.clamp_min(1)
    left = torch.arange(num_bins, dtype=torch.float64) / num_bins
    used = count > 0
    ax, fig = axes_and_figure(ax)
    ax.bar(left[used].numpy(), acc[used].numpy(), width=1 / num_bins, align="edge",
           edgecolor="black", alpha=0.7, label="accuracy")
    ax.plot(left[used].numpy() + 0.5 / num_bins, mean_conf[used].numpy(), "k--", marker=".",
            label="confidence")
    ax.plot([0, 1], [0, 1], color="gray", lw=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
    ece = classification.ece(probs, y, num_bins)
    ax.set_title(f"{label + ': ' if label else ''}ECE {ece:.3f}")
    ax.legend(loc="upper left")
    return fig
