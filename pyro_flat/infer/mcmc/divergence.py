"""The divergence policy: which chains' SG steps were non-finite, and when a chain must stop
(:class:`DivergencePolicy`); its reports: the error that stops a chain whose potential or
gradient keeps being non-finite, naming the chain, the step and the site, and the warning about
a chain that blew up while staying finite.

The policy keeps its record in one of two ways. :meth:`~DivergencePolicy.record` learns at
every step whether a chain must stop (one host synchronisation per step, free on the CPU).
:meth:`~DivergencePolicy.record_on_device` keeps the same counts on the chains' device, with
the step, chain, position and gradient of the first stop, and :meth:`~DivergencePolicy.stopped`
reads them once per draw: the SG step of chains on an accelerator never waits for the host.
"""

from __future__ import annotations

import warnings
from collections import deque

import torch

from pyro_flat.target.layout import FlatLayout

__all__ = ["BLOW_UP_FACTOR", "DivergencePolicy", "divergence_message", "warn_if_blown_up"]


class DivergencePolicy:
    """The record of non-finite SG steps of ``num_chains`` chains (one for a single chain).

    A chain whose potential or gradient is not finite skips its step (the kernel falls it back
    to its last finite state); one that does so ``max_nonfinite_steps`` times within the last
    ``2 * max_nonfinite_steps`` steps must stop (:meth:`record` names it). A draw is marked
    diverging for the chains that skipped a step on the way to it.

    Parameters
    ----------
    num_chains : int
        Chains stepped together (1 for a single chain).
    max_nonfinite_steps : int
        Non-finite steps within twice as many steps that stop a chain.
    device : torch.device or str, optional
        The chains' device, where the record is kept.
    """

    def __init__(self, num_chains: int, max_nonfinite_steps: int,
                 device: torch.device | str | None = None):
        self.max_nonfinite_steps = max_nonfinite_steps
        #: The last ``2 * max_nonfinite_steps`` steps' non-finite chains (``None``: none).
        self.recent: deque[torch.Tensor | None] = deque(maxlen=2 * max_nonfinite_steps)
        #: Per chain: its non-finite steps among :attr:`recent`, and in a row until now.
        self.num_recent = torch.zeros(num_chains, dtype=torch.long, device=device)
        self.in_a_row = torch.zeros(num_chains, dtype=torch.long, device=device)
        self._any_in_a_row = False
        #: Per chain: whether it skipped a step on the way to the current draw.
        self.diverged = torch.zeros(num_chains, dtype=torch.bool, device=device)
        self._draw_diverged = False
        self._num_diverging = 0
        #: The first stop that :meth:`record_on_device` saw, on the device (``None``: none yet
        #: recorded that way): whether there was one, and its chain, step and figures.
        self._stop: dict[str, torch.Tensor] | None = None
        self._num_diverging_on_device: torch.Tensor | None = None

    @property
    def num_diverging(self) -> int:
        """Non-finite chain-steps of the run."""
        on_device = self._num_diverging_on_device
        return self._num_diverging + (0 if on_device is None else int(on_device))

    def start_draw(self) -> None:
        """A new draw: no chain has diverged on the way to it yet."""
        if self._draw_diverged:
            self.diverged.zero_()
            self._draw_diverged = False

    def diverged_in_draw(self) -> list[bool]:
        """Per chain: whether it skipped a step on the way to the current draw."""
        if self._draw_diverged:
            return self.diverged.tolist()
        return [False] * len(self.diverged)

    def record(self, bad: torch.Tensor | None) -> int | None:
        """After an SG step: ``bad`` marks the chains whose step was not finite (``None``: every
        chain's was). Returns the first chain that must stop, or ``None``."""
        self._forget_oldest_and_add(bad)
        if bad is None:
            if self._any_in_a_row:
                self.in_a_row.zero_()
                self._any_in_a_row = False
            return None
        self._any_in_a_row = True
        self.num_recent += bad.long()
        self.diverged |= bad
        self._draw_diverged = True
        self._num_diverging += int(bad.sum())
        self.in_a_row = torch.where(bad, self.in_a_row + 1, 0)
        stopped = torch.nonzero(self.num_recent >= self.max_nonfinite_steps)
        return int(stopped[0]) if len(stopped) else None

    def _forget_oldest_and_add(self, bad: torch.Tensor | None) -> None:
        """Slide the window of :attr:`recent` by the step ``bad``."""
        recent = self.recent
        if len(recent) == recent.maxlen and recent[0] is not None:
            self.num_recent -= recent[0].long()
        recent.append(bad)

    def record_on_device(self, bad: torch.Tensor, position: torch.Tensor, grad: torch.Tensor,
                         energy: torch.Tensor, step: int) -> None:
        """:meth:`record` without a host synchronisation: ``bad`` marks the chains whose step
        ``step`` was not finite (a tensor for every step), ``position``, ``grad`` and
        ``energy`` are the chains' rows at it. The first chain that must stop, and what its
        message needs, are kept on the device until :meth:`stopped` reads them."""
        self._forget_oldest_and_add(bad)
        recent = self.recent
        self._any_in_a_row = True
        self.num_recent += bad.long()
        self.diverged |= bad
        self._draw_diverged = True
        if self._num_diverging_on_device is None:
            self._num_diverging_on_device = torch.zeros((), dtype=torch.long, device=bad.device)
            self._stop = self._no_stop(position, grad, energy)
        self._num_diverging_on_device += bad.sum()
        self.in_a_row = torch.where(bad, self.in_a_row + 1, 0)
        must_stop = self.num_recent >= self.max_nonfinite_steps
        stop = self._stop
        first = must_stop.any() & ~stop["any"]
        chain = torch.argmax(must_stop.to(torch.uint8)).reshape(1)  # the first that must stop
        now = {"chain": chain[0], "step": step, "window": len(recent),
               "position": position.index_select(0, chain)[0],
               "grad": grad.index_select(0, chain)[0],
               "energy": energy.index_select(0, chain)[0],
               "recent": self.num_recent.index_select(0, chain)[0],
               "in_a_row": self.in_a_row.index_select(0, chain)[0]}
        for name, value in now.items():
            stop[name] = torch.where(first, value, stop[name])
        stop["any"] = stop["any"] | first

    @staticmethod
    def _no_stop(position: torch.Tensor, grad: torch.Tensor, energy: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
        def zero(like: torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros((), dtype=dtype, device=like.device)

        return {"any": zero(position, torch.bool), "chain": zero(position),
                "step": zero(position), "window": zero(position),
                "position": torch.zeros_like(position[0]), "grad": torch.zeros_like(grad[0]),
                "energy": torch.zeros_like(energy[0]), "recent": zero(position),
                "in_a_row": zero(position)}

    def stopped(self, layout: FlatLayout, num_chains: int | None) -> str | None:
        """The message of the first chain that :meth:`record_on_device` found must stop
        (``num_chains``: ``None`` for a single chain), or ``None``: one host synchronisation."""
        stop = self._stop
        if stop is None or not bool(stop["any"]):
            return None
        chain = int(stop["chain"])
        return divergence_message(layout, stop["position"], stop["grad"], float(stop["energy"]),
                                  int(stop["step"]), int(stop["recent"]), int(stop["window"]),
                                  int(stop["in_a_row"]), None if num_chains is None else chain,
                                  num_chains)

    def message(self, layout: FlatLayout, position: torch.Tensor, grad: torch.Tensor, u: float,
                step: int, chain: int, num_chains: int | None) -> str:
        """:func:`divergence_message` of chain row ``chain`` (``num_chains``: ``None`` for a
        single chain)."""
        return divergence_message(layout, position, grad, u, step, int(self.num_recent[chain]),
                                  len(self.recent), int(self.in_a_row[chain]),
                                  None if num_chains is None else chain, num_chains)

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
