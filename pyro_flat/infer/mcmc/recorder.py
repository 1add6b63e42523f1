"""Per-draw statistics of a run, recorded in one place.

A statistic is known either when the draw is made (the step size, whether a step on the way
was non-finite, a kernel's ``coupling_distance`` or ``sharpness``) or only once the potential is
evaluated *at* the draw (``lp``, ``grad_norm``, ContourSGLD's ``energy``, ``energy_bin`` and
``log_weight``). The first SG step after a draw evaluates the potential there anyway, so the
second kind is filled in by that step at no cost: :meth:`DrawRecorder.open_draw` records the
first kind and leaves the draw *pending*, :meth:`DrawRecorder.close_draw` completes it. The
last draw of a run has no next step; the kernel completes it when the run's statistics are read
(``diagnostics()``), without disturbing the random stream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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

    @property
    def pending(self) -> bool:
        """Whether the last draw still waits for the statistics at its own potential."""
        return self._pending is not None

    @property
    def num_draws(self) -> int:
        return len(self._rows[self.names[0]]) if self.names else 0

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
        i, self._pending = self._pending, None
        for name, value in at_draw.items():
            if name == "diverging":
                self._rows[name][i] = self._rows[name][i] or value
            else:
                self._rows[name][i] = value

    def tensors(self) -> dict[str, torch.Tensor]:
        """One tensor per statistic, draws along the first dimension."""
        default = torch.get_default_dtype()
        return {name: torch.tensor(values, dtype=self.dtypes.get(name, default))
                for name, values in self._rows.items()}

    def column(self, name: str) -> list[Any]:
        """The values of one statistic so far (a view: do not modify)."""
        return self._rows[name]
