"""Trace and rank plots of MCMC draws, through ArviZ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def trace_and_rank(idata: Any, var_names: Sequence[str] | None = None, **kwargs: Any) -> Any:
    """ArviZ's trace plot and rank plot of ``var_names`` side by side.

    ``idata`` is what :func:`pyro_flat.to_arviz` returns (pick a few sites, or pass
    ``coords`` through ``kwargs``, for a network: one panel per scalar). Rank plots show
    mixing between chains: uniform ranks in every chain mean the chains agree (Vehtari et al.
    2021).

    Returns
    -------
    matplotlib.figure.Figure
        The trace plot's figure, with the rank plots drawn into a second column.
    """
    import arviz as az
    import matplotlib.pyplot as plt

    names = None if var_names is None else list(var_names)
    axes = az.plot_trace(idata, var_names=names, compact=True, show=False, **kwargs)
    fig = axes.ravel()[0].figure
    rows = axes.shape[0]
    # a third column of axes for the rank plots
    fig.set_size_inches(fig.get_figwidth() * 1.5, fig.get_figheight())
    grid = fig.add_gridspec(rows, 3)
    for r in range(rows):
        for c in range(2):
            axes[r, c].set_subplotspec(grid[r, c])
    rank_axes = [fig.add_subplot(grid[r, 2]) for r in range(rows)]
    import numpy as np

    az.plot_rank(idata, var_names=names, ax=np.array(rank_axes), show=False, **kwargs)
    plt.close(fig)  # returned to the caller, not kept by pyplot's figure manager
    return fig
