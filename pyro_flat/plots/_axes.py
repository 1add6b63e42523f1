"""The one helper the plots share: an Axes to draw on, and its Figure."""

from __future__ import annotations

from typing import Any


def axes_and_figure(ax: Any = None, figsize: tuple[float, float] = (4.0, 3.5)) -> tuple[Any, Any]:
    """``ax`` and its figure, or a new figure with one Axes (through ``matplotlib.figure``,
    not ``pyplot``, so that no GUI backend or global state is touched)."""
    if ax is not None:
        return ax, ax.figure
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig.add_subplot(), fig
