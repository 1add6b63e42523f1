"""The ``torch.distributed`` job a script runs in: its process group, rank, world size and device.

Everything in :mod:`pyro_flat.distributed` runs on the default process group (or one given as
``group=``) that ``torchrun`` sets up through its environment variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). Without an initialised group
(a plain ``python script.py``) the script is a job of one rank, so the same script runs with
and without ``torchrun``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

#: Backends this package is written for: gloo (CPU tensors) and NCCL (CUDA tensors).
BACKENDS = ("gloo", "nccl")

#: Seconds a collective of :func:`process_group`'s group waits for a partner before it fails
#: (torch's own default is 1,800): the bound on how long a frozen rank holds the others.
DEFAULT_TIMEOUT = 300.0


def is_distributed() -> bool:
    """Whether a ``torch.distributed`` process group is initialised in this process."""
    return dist.is_available() and dist.is_initialized()


def check_group(group: object) -> dist.ProcessGroup | None:
    """Return ``group`` if it is ``None`` (the default group) or a process group."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise ValueError("group must be a torch.distributed.ProcessGroup (from "
                         f"dist.new_group) or None for the default group, got {group!r}")
    return group


def rank(group: dist.ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (0 without a process group)."""
    check_group(group)
    return dist.get_rank(group) if is_distributed() else 0


def world_size(group: dist.ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (1 without a process group)."""
    check_group(group)
    return dist.get_world_size(group) if is_distributed() else 1


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where the tensors of a collective must live: the current CUDA device for NCCL, else the
    CPU."""
    if is_distributed() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextmanager
def process_group(backend: str = "gloo", *, timeout: float = DEFAULT_TIMEOUT
                  ) -> Iterator[torch.device]:
    """Join the ``torchrun`` job for the body of a ``with`` block, and leave it at the end.

    Initialises the default process group from ``torchrun``'s environment variables unless one
    is initialised already, and yields the device this rank computes on: the CPU for gloo,
    ``cuda:LOCAL_RANK`` for NCCL (made the current CUDA device). On leaving the block (also
    after an error) the group it initialised is destroyed, so no rank waits on a partner that
    is gone. Outside ``torchrun`` (no ``WORLD_SIZE`` in the environment) it initialises nothing
    and yields the CPU: a job of one rank.

    Parameters
    ----------
    backend : {"gloo", "nccl"}
        ``"gloo"`` for CPU tensors, ``"nccl"`` for one GPU per rank.
    timeout : float
        Seconds a collective may wait for the other ranks before it fails (default
        :data:`DEFAULT_TIMEOUT`, 300). It bounds how long a rank that froze holds the others:
        they stop within ``timeout`` plus a few seconds of roll call, with a
        :class:`~pyro_flat.distributed.RankFailure` naming it (a rank that died is named at
        once). Make it longer than the longest a rank may fall behind the others between two
        exchanges (``check_every`` draws of chains across ranks, one SG step when
        data-parallel).

    Examples
    --------
    >>> from pyro_flat.distributed import process_group, rank, world_size
    >>> with process_group("gloo") as device:  # a plain process: one rank
    ...     print(rank(), world_size(), device)
    0 1 cpu
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    created = False
    if not is_distributed() and "WORLD_SIZE" in os.environ:
        _check_environment()
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        created = True
    try:
        yield device
    finally:
        if created and is_distributed():
            dist.destroy_process_group()


def _check_environment() -> None:
    """``RANK`` and ``WORLD_SIZE`` as torchrun sets them: ``0 <= RANK < WORLD_SIZE`` (any
    other rank would wait for partners that never come)."""
    values = {}
    for name in ("WORLD_SIZE", "RANK"):
        raw = os.environ.get(name, "")
        try:
            values[name] = int(raw)
        except ValueError:
            raise ValueError(f"the environment variable {name} must be an integer (torchrun "
                             f"sets it), got {raw!r}") from None
    if values["WORLD_SIZE"] < 1:
        raise ValueError(f"the environment variable WORLD_SIZE must be >= 1, got "
                         f"{values['WORLD_SIZE']}")
    if not 0 <= values["RANK"] < values["WORLD_SIZE"]:
        raise ValueError(f"the environment variable RANK must be in [0, WORLD_SIZE) = [0, "
                         f"{values['WORLD_SIZE']}), got {values['RANK']}: this process would "
                         "wait for partners that never come")
