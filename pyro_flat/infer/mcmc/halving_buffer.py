"""A fixed number of rows that keeps every ``stride``-th of a stream of rows, doubling the stride
when it fills: the bounded memory of the per-draw monitors (:mod:`.draw_mixing`,
:mod:`.configurational_temperature`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["HalvingBuffer"]


class HalvingBuffer:
    """Every ``stride``-th row of a stream in at most ``capacity`` rows: when the rows are full,
    every second one is kept and the stride doubles, so that the kept rows stay evenly spaced
    over the whole stream.

    Examples
    --------
    >>> import torch
    >>> buffer = HalvingBuffer(4)
    >>> for i in range(10):
    ...     slot = buffer.next_slot(lambda: torch.empty(4))
    ...     if slot is not None:
    ...         _ = slot.fill_(i)
    >>> buffer.kept.tolist(), buffer.stride, buffer.seen
    ([0.0, 4.0, 8.0], 4, 10)
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.rows: torch.Tensor | None = None
        self.num_kept = 0
        #: Rows offered so far, and the spacing of the kept ones among them.
        self.seen = 0
        self.stride = 1

    def next_slot(self, make: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        """The row to write the next row of the stream into, or ``None`` when it is not kept;
        ``make()`` allocates the ``capacity`` rows on first use."""
        seen, self.seen = self.seen, self.seen + 1
        if seen % self.stride:
            return None
        if self.rows is None:
            self.rows = make()
        if self.num_kept == self.capacity:  # keep every second row from now on
            half = self.capacity // 2
            self.rows[:half] = self.rows[0::2].clone()
            self.num_kept, self.stride = half, 2 * self.stride
            if seen % self.stride:
                return None
        slot = self.rows[self.num_kept]
        self.num_kept += 1
        return slot

    @property
    def kept(self) -> torch.Tensor | None:
        """The kept rows, in order (``None`` before the first)."""
        return None if self.rows is None else self.rows[: self.num_kept]
