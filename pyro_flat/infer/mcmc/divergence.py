"""The divergence policy's reports: the error that stops a chain whose potential or gradient
keeps being non-finite, naming the chain, the step and the site; and the warning about a chain
that blew up while staying finite."""

from __future__ import annotations

import warnings

import torch

from pyro_flat.target.layout import FlatLayout

__all__ = ["BLOW_UP_FACTOR", "divergence_message", "warn_if_blown_up"]

#: A draw whose gradient norm exceeds this multiple of the run's median raises a warning.
BLOW_UP_FACTOR = 100.0


def warn_if_blown_up(kernel_name: str, grad_norm: torch.Tensor) -> None:
    """A chain can explode and stay finite; say so when a draw's gradient norm jumps far
    above the run's median (the draws stay as they are, marked by their statistics).
    ``grad_norm`` is ``(draws,)``, or ``(draws, K)`` for vectorised chains."""
    finite = grad_norm[torch.isfinite(grad_norm)]
    if len(finite) < 4:
        return
    median = float(finite.median())
    jumps = torch.nonzero(grad_norm > BLOW_UP_FACTOR * median)
    if len(jumps) and median > 0:
        first = tuple(int(i) for i in jumps[0])
        where = f"draw {first[0]}" + (f" of chain {first[1]}" if len(first) > 1 else "")
        warnings.warn(
            f"{kernel_name}: the gradient norm at {where} is "
            f"{float(grad_norm[first]):.3g}, over {BLOW_UP_FACTOR:g} times the run's median "
            f"{median:.3g}, at {len(jumps)} draws: the chain may have blown up; look at the "
            "lp and grad_norm statistics and try a smaller step_size",
            RuntimeWarning,
            stacklevel=2,
        )


def divergence_message(layout: FlatLayout, position: torch.Tensor, grad: torch.Tensor, u: float,
                       step: int, recent: int, window: int, in_a_row: int,
                       chain: int | None = None, num_chains: int | None = None) -> str:
    """Why a chain stops: ``recent`` of its last ``window`` SG steps (``in_a_row`` of them in a
    row, the last at ``step``, with potential ``u``) were non-finite; the sites with a
    non-finite gradient or ``position`` (else the site of the largest gradient). ``chain``: its
    row among ``num_chains`` vectorised chains (``position`` and ``grad`` are that row's)."""
    sites = layout.nonfinite_sites(grad)
    if sites:
        where = f"; non-finite gradient at sites {sites}"
    elif sites := layout.nonfinite_sites(position):
        where = f"; non-finite parameters at sites {sites}"
    else:  # every element finite, but U or the gradient's norm overflows
        sizes = {s.name: float(grad[s.offset : s.stop].abs().max())
                 for s in layout.sites if s.numel}
        name = max(sizes, key=sizes.get)
        where = f"; the largest gradient, {sizes[name]:.3g}, is at site {name!r}"
    which = "the chain" if chain is None else f"chain {chain} of {num_chains}"
    return (
        f"{which} diverged: the potential or its gradient was non-finite at "
        f"{recent} of the last {window} SG steps "
        f"({in_a_row} in a row), the last at step {step} (U = {u}){where}. "
        "Try a smaller step_size."
    )
