"""Stopping a job whose rank failed: every rank learns which rank failed, where, and why.

Ranks exchange a small *status* vector at fixed points of a run: once per SG step of a
data-parallel chain, every ``check_every`` draws of chains across ranks, and at the end of a
run. A rank that raises reports its error at the exchange its partners are waiting in (the
next one), so they do not wait for it forever: every rank then raises :class:`RankFailure`,
whose message names the rank that failed and carries its error (for a diverging chain: the
site and the SG step). The process exits, ``torchrun`` sees the failure and ends the job; no
process is left waiting.

The status vector is ``[value, failed_0, ..., failed_{W-1}, nonfinite_0, ..., nonfinite_{W-1}]``
summed over the ranks: ``value`` carries a number to add up (a data-parallel rank's part of the
potential), ``failed_r`` says rank ``r`` raised, ``nonfinite_r`` that rank ``r``'s part was not
finite (which names the shard a non-finite potential came from).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from pyro_flat.distributed.group import collective_device, rank, world_size


class RankFailure(RuntimeError):
    """A rank of a ``torch.distributed`` job failed; raised on every rank.

    Attributes
    ----------
    failures : dict of int to str
        The error of each rank that failed, by rank.
    """

    def __init__(self, failures: dict[int, str], world: int):
        self.failures = dict(failures)
        lines = [f"rank {r} of {world} failed: {message}" for r, message in failures.items()]
        super().__init__("; ".join(lines))


def describe(error: BaseException, where: str = "") -> str:
    """``error`` in one line for a :class:`RankFailure` message (with its last frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    origin = f" [raised at {frames[-1].filename}:{frames[-1].lineno}]" if frames else ""
    return f"{type(error).__name__}: {error}{where}{origin}"


def exchange_status(value: float = 0.0, error: str | None = None, nonfinite: bool = False,
                    group: dist.ProcessGroup | None = None,
                    payload: torch.Tensor | None = None) -> tuple[float, list[int]]:
    """Collective: add up ``value`` over the ranks and learn whether any rank failed.

    Every rank of ``group`` must call it at the same point. If any rank passes an ``error``
    (its description), every rank gathers the descriptions and raises :class:`RankFailure`.
    A ``payload`` tensor is summed over the ranks in place by the same collective (the status
    rides at the end of its buffer, in its dtype): one all-reduce instead of two.

    Returns
    -------
    total : float
        The sum of the ranks' ``value``.
    nonfinite_ranks : list of int
        The ranks that passed ``nonfinite=True``.
    """
    w, r = world_size(group), rank(group)
    if w == 1:
        if error is not None:
            raise RankFailure({0: error}, 1)
        return value, [0] if nonfinite else []
    n = 0 if payload is None else payload.numel()
    buffer = (torch.zeros(1 + 2 * w, dtype=torch.float64, device=collective_device(group))
              if payload is None else
              torch.zeros(n + 1 + 2 * w, dtype=payload.dtype, device=payload.device))
    if payload is not None:
        buffer[:n].copy_(payload.reshape(-1))
    status = buffer[n:]
    status[0] = value
    status[1 + r] = error is not None
    status[1 + w + r] = nonfinite
    dist.all_reduce(buffer, group=group)
    if payload is not None:
        payload.copy_(buffer[:n].view_as(payload))
    values = status.tolist()
    failed = [i for i in range(w) if values[1 + i]]
    if failed:
        messages: list[str | None] = [None] * w
        dist.all_gather_object(messages, error, group=group)
        raise RankFailure({i: str(messages[i]) for i in failed}, w)
    return values[0], [i for i in range(w) if values[1 + w + i]]


@contextmanager
def reported(group: dist.ProcessGroup | None = None,
             where: Callable[[], str] = lambda: "") -> Iterator[None]:
    """Run the body of a ``with`` block so that an error on this rank stops every rank.

    An exception in the body is reported at the other ranks' next :func:`exchange_status`,
    and this rank raises :class:`RankFailure` (from the exception) like the others. ``where()``
    adds context to the message (e.g. the SG step). A :class:`RankFailure` (another rank
    failed) and exceptions that are not ``Exception`` (``KeyboardInterrupt``) pass through;
    in a job of one rank the exception itself passes through.
    """
    try:
        yield
    except RankFailure:
        raise
    except Exception as error:
        if world_size(group) == 1:
            raise
        exchange_status(error=f"{describe(error, where())}", group=group)
        raise  # not reached: exchange_status raised RankFailure
