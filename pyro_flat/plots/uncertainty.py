"""Histograms of the predictive entropy in and out of distribution."""

from __future__ import annotations

import math
from typing import Any

import torch

from pyro_flat import validation
from pyro_flat.evaluation import classification
from pyro_flat.plots._axes import axes_and_figure


def uncertainty_histograms(
    probs_in: torch.Tensor, probs_out: torch.Tensor, num_bins: int = 30, *, ax: Any = None,
    label: str | None = None,
) -> Any:
    """Densities of the predictive entropy on in-distribution and OOD inputs.

    A model that knows what it does not know puts the OOD entropies to the right, near the
    maximum ``log(num_classes)`` (dotted line). The title gives the OOD AUROC of the entropy.

    Parameters
    ----------
    probs_in, probs_out : torch.Tensor
        ``(n, num_classes)`` predictive probabilities on the test and the OOD inputs.
    num_bins : int
        Histogram bins over ``[0, log(num_classes)]``, ``>= 1``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    num_bins = validation.integer_at_least("num_bins", num_bins, 1)
    h_in = classification.predictive_entropy(probs_in, reduction="none")
    h_out = classification.predictive_entropy(probs_out, reduction="none")
    if probs_in.shape[1] != probs_out.shape[1]:
        raise ValueError(f"probs_in and probs_out must have the same number of classes, got "
                         f"{probs_in.shape[1]} and {probs_out.shape[1]}")
    top = math.log(probs_in.shape[1])
    ax, fig = axes_and_figure(ax)
    kwargs = dict(bins=num_bins, range=(0.0, top), density=True, alpha=0.6)
    ax.hist(h_in.numpy(), label="in distribution", **kwargs)
    ax.hist(h_out.numpy(), label="out of distribution", **kwargs)
    ax.axvline(top, color="gray", ls=":")
    auroc = classification.ood_auroc(h_in, h_out)
    ax.set(xlabel="predictive entropy (nats)", ylabel="density")
    ax.set_title(f"{label + ': ' if label else ''}OOD AUROC {auroc:.3f}")
    ax.legend()
    return fig
