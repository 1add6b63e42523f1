"""One-dimensional slices of the loss landscape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pyro_flat.plots._axes import axes_and_figure


def loss_slice(
    slices: Mapping[str, tuple[torch.Tensor, torch.Tensor]], *, ax: Any = None,
    xlabel: str = r"$\alpha$", ylabel: str = "loss",
) -> Any:
    """Plot loss profiles ``{label: (alphas, losses)}``.

    The pairs are what :func:`pyro_flat.evaluation.flatness.loss_along_direction` and
    :func:`pyro_flat.evaluation.flatness.loss_along_segment` return, e.g. one curve per method or
    per draw: a flat basin shows as a wide, low profile.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if not slices:
        raise ValueError("slices must hold at least one (alphas, losses) pair")
    ax, fig = axes_and_figure(ax)
    for label, (alphas, losses) in slices.items():
        alphas, losses = torch.as_tensor(alphas), torch.as_tensor(losses)
        if alphas.shape != losses.shape or alphas.dim() != 1:
            raise ValueError(f"slice {label!r}: alphas and losses must be 1-D of one length, got "
                             f"{tuple(alphas.shape)} and {tuple(losses.shape)}")
        ax.plot(alphas.numpy(), losses.numpy(), marker=".", label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.legend()
    return fig
