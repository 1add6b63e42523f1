"""ContourSGLD: the learned energy PDF against the energies the chain visited."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pyro_flat.plots._axes import axes_and_figure


def energy_pdf(diagnostics: Mapping[str, Any], *, ax: Any = None, log: bool = True) -> Any:
    """The energy PDF ``g`` a :class:`~pyro_flat.infer.mcmc.contour.ContourSGLD` run learned,
    as a density over its energy bins, against the histogram of the stochastic energies of the
    draws on the same bins.

    ``g`` estimates the distribution of the energy under the *target*; the draws come from the
    flattened target, so their histogram is wider (flatter in energy) where the flattening
    worked. Bins that ``g`` never learned keep their initial value: a sign the bins do not
    bracket the energies (see ``auto_bins``).

    Parameters
    ----------
    diagnostics : dict
        ``kernel.diagnostics()`` after the run: needs ``"energy_pdf"``,
        ``"energy_edges"`` and ``"sample_stats"["energy"]``. (With ``vectorized_chains`` and
        ``auto_bins`` each chain places its own bins: then chain 0 is drawn.) With
        ``vectorized_chains`` the
        chains' ``g`` are averaged and their energies pooled.
    log : bool
        Logarithmic density axis (``g`` spans many orders of magnitude).

    Returns
    -------
    matplotlib.figure.Figure
    """
    try:
        g = torch.as_tensor(diagnostics["energy_pdf"], dtype=torch.float64)
        edges = diagnostics["energy_edges"]
        energies = torch.as_tensor(diagnostics["sample_stats"]["energy"], dtype=torch.float64)
    except (KeyError, TypeError):
        raise ValueError("diagnostics must be a ContourSGLD run's diagnostics() with "
                         "'energy_pdf', 'energy_edges' and sample_stats['energy']") from None
    if edges is None:
        raise ValueError("the energy bins are not placed yet (auto_bins: run warmup first)")
    edges = torch.as_tensor(edges, dtype=torch.float64)
    if edges.dim() == 2:  # vectorized_chains: each chain's bins, (chains, bins + 1)
        if not bool((edges == edges[0]).all()):  # auto_bins placed them chain by chain
            g, energies = g[0], energies[:, 0]
        edges = edges[0]
    if g.dim() == 2:  # vectorized_chains with shared bins: (chains, bins)
        g = g.mean(0)
    energies = energies.reshape(-1)
    width = edges[1:] - edges[:-1]
    ax, fig = axes_and_figure(ax, figsize=(5.0, 3.5))
    finite = energies[torch.isfinite(energies)]
    ax.hist(finite.clamp(float(edges[0]), float(edges[-1])).numpy(), bins=edges.numpy(),
            density=True, alpha=0.5, label="visited energies (flattened chain)")
    ax.stairs((g / width).numpy(), edges.numpy(), lw=1.5, color="black",
              label="learned energy PDF g")
    if log:
        ax.set_yscale("log")
    ax.set(xlabel="energy U", ylabel="density")
    ax.legend()
    return fig
