"""What a kernel's draw holds: the model's sites and, for each state field returned with draws,
a copy of them, as views of one flat copy of the chain per draw."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pyro_flat.infer.mcmc.state import KernelState, StateField
from pyro_flat.target.layout import FlatLayout, Site

__all__ = ["DrawLayout"]


class DrawLayout:
    """The sites of a draw and their values, for one chain or ``K`` vectorised chains.

    A draw holds the model's sites (the chain's position) and, for each state field that
    declares ``draws_suffix`` (e.g. EntropyMCMC's guide), the same sites with that suffix. Pyro's
    ``MCMC`` keeps the dictionary that :meth:`views` gives, so one flat copy per draw
    (:meth:`copy`) holds them all.

    Parameters
    ----------
    layout : FlatLayout
        The model's sites on the flat position vector.
    fields : sequence of StateField
        The state fields returned with draws.
    num_chains : int or None
        ``K`` for vectorised chains (values then have a leading chain dimension), ``None`` for
        a single chain.
    """

    def __init__(self, layout: FlatLayout, fields: Sequence[StateField],
                 num_chains: int | None):
        self.model_layout, self.fields, self.num_chains = layout, tuple(fields), num_chains
        sites = list(layout.sites)
        offset = layout.size
        for f in self.fields:
            for s in layout.sites:
                sites.append(Site(s.name + f.draws_suffix, s.shape, offset, s.transform))
                offset += s.numel
        #: Every site of a draw on its flat copy.
        self.layout = FlatLayout(sites) if self.fields else layout

    @property
    def transforms(self) -> dict[str, object]:
        """Each constrained site's map from the unconstrained space (Pyro's ``transforms``)."""
        return {s.name: s.transform.inv for s in self.layout.sites if s.transform}

    def copy(self, position: torch.Tensor, state: KernelState) -> torch.Tensor:
        """One flat copy of everything a draw returns."""
        if not self.fields:
            return position.detach().clone()
        return torch.cat([position.detach()] + [getattr(state, f.name).detach()
                                                for f in self.fields], dim=-1)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """A draw's sites as views of its flat copy (with a leading chain dimension for
        vectorised chains)."""
        if flat.dim() == 1:
            return self.layout.views(flat)
        lead = flat.shape[:-1]
        return {s.name: flat[..., s.offset : s.stop].view((*lead, *s.shape))
                for s in self.layout.sites}

    def load(self, params: dict[str, torch.Tensor], position: torch.Tensor,
             state: KernelState) -> None:
        """Set the chain to the draw ``params`` (Pyro hands back the last draw, or the user's
        initial values): its position and the fields returned with draws (the position where
        ``params`` lacks a field's sites)."""
        position.copy_(self._flatten(params))
        sites = self.model_layout.sites
        for f in self.fields:
            copy = getattr(state, f.name)
            names = [s.name + f.draws_suffix for s in sites]
            if all(n in params for n in names):
                copy.copy_(self._flatten({s.name: params[n]
                                          for s, n in zip(sites, names, strict=True)}))
            else:  # e.g. user-given initial values of the model's sites only
                copy.copy_(position)

    def _flatten(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.num_chains is None:
            return self.model_layout.flatten(values)
        return torch.stack([self.model_layout.flatten({n: v[c] for n, v in values.items()})
                            for c in range(self.num_chains)])
