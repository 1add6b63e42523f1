r"""The named state of an SG-MCMC kernel: the position and the fields a kernel declares.

A kernel states what it carries beside the position :math:`\theta` as a tuple of
:class:`StateField` (its ``state_fields``), the way BlackJAX and NumPyro name their states;
the base class (:class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`) builds a
:class:`KernelState` from it and derives everything else: allocation at the start of a run,
checkpoints, the fall-back after a non-finite step, and the copies returned with each draw.

Examples
--------
SGHMC's state is its position and momentum (and a scratch buffer for the noise):

>>> import torch
>>> from pyro_flat.infer.mcmc.state import KernelState, StateField
>>> fields = (StateField("momentum", "r, the momentum", reset=True),
...           StateField("noise", "buffer for the Gaussian noise", init="scratch"))
>>> state = KernelState.create(torch.ones(3), fields)
>>> state.momentum
tensor([0., 0., 0.])
>>> sorted(state.checkpoint())
['momentum']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

#: How a field starts: zeros shaped like the position, a copy of the position, an
#: uninitialised work buffer shaped like the position (never saved), or a callable of the
#: state being built (its position and the fields declared before).
INITS = ("zeros", "position", "scratch")


@dataclass(frozen=True)
class StateField:
    """One named part of a kernel's state besides the position.

    Parameters
    ----------
    name : str
        The attribute of :class:`KernelState` and the key in checkpoints.
    doc : str
        What the field holds, in a few words (the kernel's docstring lists them).
    init : {"zeros", "position", "scratch"} or callable
        How a run starts the field: zeros or a copy shaped like the position; ``"scratch"``,
        an uninitialised work buffer shaped like the position that is not part of the chain's
        state (never saved or reset); or ``init(state) -> value`` for anything else (a tensor
        of another shape, a number, a list, a view into an earlier field), called with the
        state being built, whose ``position`` and earlier fields are set.
    persistent : bool
        Part of the chain's state, saved in checkpoints (``False`` for work buffers and for
        objects whose state other fields hold).
    reset : bool
        Zero the field when the chain falls back to its last finite position after a
        non-finite step (a momentum, which the non-finite gradient has spoiled).
    draws_suffix : str, optional
        Return the field with every draw, as extra sites named ``site + draws_suffix``. It must
        be shaped like the position (a second copy of the parameters, as EntropyMCMC's guide).
    """

    name: str
    doc: str
    init: str | Callable[[torch.Tensor], Any] = "zeros"
    reset: bool = False
    draws_suffix: str | None = None
    persistent: bool = True

    def __post_init__(self) -> None:
        if not (callable(self.init) or self.init in INITS):
            raise ValueError(f"StateField {self.name!r}: init must be one of {INITS} or a "
                             f"callable of the position, got {self.init!r}")
        if self.init == "scratch":
            if self.reset or self.draws_suffix:
                raise ValueError(f"StateField {self.name!r}: a scratch buffer is not state, so "
                                 "it is neither reset nor returned with the draws")
            object.__setattr__(self, "persistent", False)

    def initial_value(self, state: KernelState) -> Any:
        position = state.position
        if self.init == "zeros":
            return torch.zeros_like(position)
        if self.init == "position":
            return position.detach().clone()
        if self.init == "scratch":
            return torch.empty_like(position)
        return self.init(state)


class KernelState:
    """The position (a flat tensor), the SG steps taken (``num_steps``) and the declared
    fields, as attributes.

    Build it with :meth:`create`; the base class keeps one per chain block and hands it to the
    kernel's ``update``.
    """

    def __init__(self, position: torch.Tensor, fields: tuple[StateField, ...],
                 num_steps: int = 0):
        self.position = position
        self.fields = tuple(fields)
        #: The SG steps the chain has taken (a step counts whether it moved or fell back).
        self.num_steps = num_steps

    @classmethod
    def create(cls, position: torch.Tensor, fields: Iterable[StateField], num_steps: int = 0
               ) -> KernelState:
        fields = tuple(fields)
        names = [f.name for f in fields]
        reserved = {"position", "fields", "num_steps"}
        clash = {n for n in names if names.count(n) > 1} | (reserved & set(names))
        if clash:
            raise ValueError(f"state field names must be unique and not one of "
                             f"{sorted(reserved)}, got {sorted(clash)}")
        state = cls(position, fields, num_steps)
        for f in fields:
            setattr(state, f.name, f.initial_value(state))
        return state

    def __getattr__(self, name: str) -> Any:  # only reached for names that are not set
        raise AttributeError(f"the kernel state has no field {name!r}")

    def checkpoint(self) -> dict[str, Any]:
        """Copies of the persistent fields, by name."""
        return {f.name: _copy(getattr(self, f.name)) for f in self.fields if f.persistent}

    def load(self, saved: Mapping[str, Any]) -> None:
        """Restore what :meth:`checkpoint` returned (tensors are copied into place). A field
        the checkpoint lacks (one a later version added) keeps its initial value; a field a
        single chain saved without its row of one (ContourSGLD before one chain was one row)
        loads into that row."""
        for f in self.fields:
            if not f.persistent or f.name not in saved:
                continue
            current = getattr(self, f.name)
            value = _as_rows(saved[f.name], current)
            if torch.is_tensor(current) and torch.is_tensor(value):
                if value.shape != current.shape:
                    raise ValueError(f"saved state field {f.name!r} has shape "
                                     f"{tuple(value.shape)}, this chain's {tuple(current.shape)}")
                current.copy_(value)
            else:
                setattr(self, f.name, _copy(value))

    def reset_(self) -> None:
        """Zero the fields marked ``reset`` (after a non-finite step)."""
        for f in self.fields:
            if f.reset:
                getattr(self, f.name).zero_()

    def draw_fields(self) -> list[StateField]:
        """The fields returned with every draw."""
        return [f for f in self.fields if f.draws_suffix is not None]


def _copy(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, list):
        return list(value)
    return value


def _depth(value: Any) -> int:
    """How many lists ``value`` is nested in (by its first elements)."""
    if not isinstance(value, list):
        return 0
    return 1 + (_depth(value[0]) if value else 0)


def _as_rows(value: Any, current: Any) -> Any:
    """``value`` as the one row of ``current`` when ``current`` has one row and ``value`` is
    that row's content (a tensor without the leading dimension, a list level less)."""
    if torch.is_tensor(current) and torch.is_tensor(value):
        if current.dim() == value.dim() + 1 and current.shape == (1, *value.shape):
            return value.unsqueeze(0)
        return value
    if isinstance(current, list) and len(current) == 1 and _depth(value) == _depth(current) - 1:
        return [value]
    return value
