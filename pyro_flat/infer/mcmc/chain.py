"""The chains a kernel steps: their positions, one row per chain, their named state, and the
copy of each chain's last finite position that a non-finite step falls back to.

One chain is one row: every path from the state to the update sees ``(K, d)``, ``K = 1`` for
a single chain. Only Pyro's side of the kernel (the draws, the public ``position``, the
statistics) sees a single chain without its row (the kernel's ``outward``).
"""

from __future__ import annotations

import torch

from pyro_flat.infer.mcmc.arguments import has_chain_rows
from pyro_flat.infer.mcmc.state import KernelState

__all__ = ["Chains"]


class Chains:
    """``K`` chains' state (:class:`~pyro_flat.infer.mcmc.state.KernelState`, position ``(K,
    d)``) and the position each had after its last finite step.

    Parameters
    ----------
    state : KernelState
        The chains' state; its ``position`` has one row per chain.
    vectorized : bool
        Whether the user asked for vectorised chains (``vectorized_chains=K``); ``False``: a
        single chain, whose row is dropped at Pyro's side and in its messages.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.infer.mcmc.state import KernelState, StateField
    >>> state = KernelState.create(torch.zeros(2, 3), (StateField("momentum", "r", reset=True),))
    >>> chains = Chains(state, vectorized=True)
    >>> _ = chains.position.add_(1.0), state.momentum.add_(5.0)  # a step
    >>> chains.fall_back(torch.tensor([False, True]))  # chain 1 returns to its last finite state
    >>> chains.position.tolist(), state.momentum[:, 0].tolist()
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [5.0, 0.0])
    """

    def __init__(self, state: KernelState, vectorized: bool):
        if state.position.dim() != 2:
            raise ValueError(f"Chains: the position needs one row per chain, (K, d); got shape "
                             f"{tuple(state.position.shape)}")
        self.state = state
        self.vectorized = vectorized
        #: Each chain's position after its last finite step.
        self.last_finite = state.position.detach().clone()

    @property
    def position(self) -> torch.Tensor:
        """The chains' positions, ``(K, d)`` (updated in place by the kernel's update)."""
        return self.state.position

    @property
    def num_chains(self) -> int:
        return self.state.position.shape[0]

    def keep_finite(self) -> None:
        """Every chain's step was finite: remember the positions the step starts from."""
        self.last_finite.copy_(self.position)

    def keep_finite_rows(self, good: torch.Tensor) -> None:
        """The chains ``good`` stepped finitely: remember their positions."""
        self.last_finite.copy_(_select(good, self.position, self.last_finite))

    def rows_of(self, bad: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copies of the persistent per-chain fields, whose rows ``bad`` are put back after an
        update that the other chains took (:meth:`put_rows`)."""
        state, k = self.state, self.num_chains
        return {f.name: getattr(state, f.name).clone() for f in state.fields
                if f.persistent and has_chain_rows(getattr(state, f.name), k)}

    def put_rows(self, rows: dict[str, torch.Tensor], bad: torch.Tensor) -> None:
        """Restore the rows ``bad`` of what :meth:`rows_of` copied."""
        for name, value in rows.items():
            field = getattr(self.state, name)
            field.copy_(_select(bad, value, field))

    def fall_back(self, bad: torch.Tensor) -> None:
        """The chains ``bad`` return to their last finite position; their fields marked
        ``reset`` (a momentum the non-finite gradient spoiled) restart at zero."""
        self.position.copy_(_select(bad, self.last_finite, self.position))
        for f in self.state.fields:
            if f.reset:
                field = getattr(self.state, f.name)
                field.copy_(_select(bad, torch.zeros_like(field), field))


def _select(rows: torch.Tensor, chosen: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``chosen``'s rows where ``rows`` (one flag per chain), ``other``'s elsewhere: a select on
    the device, where indexing by a mask would wait for the host to count its rows."""
    return torch.where(rows.reshape(-1, *[1] * (other.dim() - 1)), chosen, other)

