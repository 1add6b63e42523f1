"""Per-draw statistics of a run, recorded in one place.

A statistic is known either when the draw is made (the step size, whether a step on the way
was non-finite, a kernel's ``coupling_distance`` or ``sharpness``) or only once the potential is
evaluated *at* the draw (``lp``, ``grad_norm``, ContourSGLD's ``energy``, ``energy_bin`` and
``log_weight``). The first SG step after a draw evaluates the potential there anyway, so the
second kind is filled in by that step at no cost: :meth:`DrawRecorder.open_draw` records the
first kind and leaves the draw *pending*, :meth:`DrawRecorder.close_draw` completes it. The
last draw of a run has no next step; the kernel completes it when the run's statistics are read
(``diagnostics()``), without disturbing the random stream.

When the draws go to disk and nothing is kept in memory (``DrawWriter`` with
``save_params=[]``), the writer *releases* the statistics it has written
(:meth:`DrawRecorder.release`): the recorder forgets them and reads them back from the store
when the whole run's statistics are asked for (at the end of the run), so that its memory does
not grow with the draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch


class DrawRecorder:
    """The statistics ``names`` of each post-warmup draw of one run.

    Parameters
    ----------
    names : tuple of str
        The statistics, in order.
    dtypes : mapping, optional
        A dtype per statistic whose values are not floats (``diverging``: ``torch.bool``);
        the others take torch's default dtype.
    """

    def __init__(self, names: tuple[str, ...], dtypes: Mapping[str, torch.dtype] | None = None):
        self.names = tuple(names)
        self.dtypes = dict(dtypes or {})
        self._rows: dict[str, list[Any]] = {name: [] for name in self.names}
        self._pending: int | None = None
        self._released = 0  # draws whose statistics were released to a store
        self._restore: Callable[[int, Sequence[str]], Mapping[str, Any]] | None = None
        self.released_to: str | None = None

    @property
    def pending(self) -> bool:
        """Whether the last draw still waits for the statistics at its own potential."""
        return self._pending is not None

    @property
    def num_draws(self) -> int:
        """The draws recorded so far, released ones included."""
        return self._released + (len(self._rows[self.names[0]]) if self.names else 0)

    @property
    def released(self) -> int:
        """How many of the first draws' statistics were released to a store."""
        return self._released

    def release(self, upto: int, restore: Callable[[int, Sequence[str]], Mapping[str, Any]],
                where: str) -> None:
        """Forget the statistics of the draws before ``upto``, which a store keeps.

        ``restore(n, names)`` must return the statistics ``names`` of the first ``n`` draws,
        one array per name with the draws along the first dimension (as :meth:`tensors`
        gives them); ``where`` names the store in messages.
        """
        drop = upto - self._released
        if drop <= 0:
            return
        if self._pending is not None and self._pending < upto:
            raise ValueError(f"draw {self._pending} still waits for its statistics; it cannot "
                             "be released")
        for rows in self._rows.values():
            del rows[:drop]
        self._released, self._restore, self.released_to = upto, restore, where

    def value(self, name: str, draw: int) -> Any:
        """The statistic ``name`` of ``draw`` (a draw that was not released)."""
        return self._rows[name][draw - self._released]

    def open_draw(self, known: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
        """Add a draw: the statistics ``known`` now, ``defaults`` (else NaN) for the others,
        to be completed by :meth:`close_draw`."""
        unknown = set(known) - set(self.names)
        if unknown:
            raise KeyError(f"statistics {sorted(unknown)} are not among {self.names}")
        for name in self.names:
            self._rows[name].append(known.get(name, defaults.get(name, math.nan)))
        self._pending = self.num_draws - 1

    def close_draw(self, at_draw: Mapping[str, Any]) -> None:
        """Complete the pending draw with the statistics evaluated at it (``diverging`` is
        only ever set to True here: a step on the way to the draw may already have set it)."""
        i, self._pending = self._pending - self._released, None
        for name, value in at_draw.items():
            if name == "diverging":
                self._rows[name][i] = self._rows[name][i] or value
            else:
                self._rows[name][i] = value

    def tensors(self, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """One tensor per statistic (those in ``names``, default all), draws along the first
        dimension (released draws read back from their store)."""
        default = torch.get_default_dtype()
        names = self.names if names is None else [n for n in self.names if n in set(names)]
        out = {name: torch.tensor(self._rows[name], dtype=self.dtypes.get(name, default))
               for name in names}
        if not self._released:
            return out
        restored = self._restore(self._released, names)
        for name, recent in out.items():
            old = torch.as_tensor(restored[name]).to(recent.dtype)
            out[name] = torch.cat([old, recent.reshape(-1, *old.shape[1:])])
        return out
