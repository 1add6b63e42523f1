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

A rank that cannot raise (killed, out of memory in the kernel, stopped, hung in a system call)
is found by the collective its partners wait in: gloo reports a closed connection at once, a
frozen rank after the process group's ``timeout`` (:func:`~pyro_flat.distributed.process_group`,
default :data:`~pyro_flat.distributed.group.DEFAULT_TIMEOUT` seconds). The ranks that are left
then hold a *roll call* on the job's key-value store (each writes its name and waits up to
:data:`ROLL_CALL_SECONDS` for the others') and raise :class:`RankFailure` naming every rank
that did not answer. A dead or frozen rank thus stops the others within ``timeout +
ROLL_CALL_SECONDS`` seconds of their reaching the exchange it missed.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from pyro_flat.distributed.group import collective_device, rank, world_size

_Result = TypeVar("_Result")

#: Seconds the ranks left after a collective failed wait for each other's answer in the roll
#: call that names the rank that is gone.
ROLL_CALL_SECONDS = 5.0


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
    collective(lambda: dist.all_reduce(buffer, group=group), group, "a status exchange")
    if payload is not None:
        payload.copy_(buffer[:n].view_as(payload))
    values = status.tolist()
    failed = [i for i in range(w) if values[1 + i]]
    if failed:
        messages: list[str | None] = [None] * w
        collective(lambda: dist.all_gather_object(messages, error, group=group), group,
                   "the gathering of errors")
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


def collective(call: Callable[[], _Result], group: dist.ProcessGroup | None = None,
               what: str = "a collective") -> _Result:
    """Run the collective ``call()``; if it fails because a partner is gone, raise
    :class:`RankFailure` naming the ranks that no longer answer.

    A rank that was killed closes its connections (gloo raises at once); a frozen one makes the
    collective time out after the process group's ``timeout``. Either way the backend's
    ``RuntimeError`` names an address, not a rank: the ranks that are left hold a roll call
    (:func:`unresponsive_ranks`) and raise :class:`RankFailure` for the ranks that did not
    answer. If every rank answers, the backend's error is raised as it is.
    """
    try:
        return call()
    except RankFailure:
        raise
    except RuntimeError as error:
        w = world_size(group)
        if w == 1:
            raise
        gone = unresponsive_ranks(group)
        if not gone:
            raise
        reason = str(error).split(". ")[0][:160]
        raise RankFailure({r: f"stopped responding: it did not take part in {what} (this rank "
                              f"{rank(group)} saw: {reason}); it died or froze"
                           for r in gone}, w) from error


def unresponsive_ranks(group: dist.ProcessGroup | None = None,
                       wait: float = ROLL_CALL_SECONDS) -> list[int]:
    """The ranks of ``group`` that do not answer a roll call within ``wait`` seconds.

    Every rank that calls it writes its name to the job's key-value store and waits until
    every other rank's name is there or ``wait`` seconds have passed; the ranks whose names
    are missing are returned (in ``group``'s numbering). If the store itself is gone (it is
    hosted by rank 0 unless ``torchrun``'s agent hosts it), rank 0 is the one that is gone.
    """
    members = list(range(world_size(group)))
    global_rank = (lambda r: r) if group is None else (
        lambda r: dist.get_global_rank(group, r))
    me = rank(group)
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=wait))
        store.set(f"pyro_flat/roll_call/{global_rank(me)}", "here")
        deadline = time.monotonic() + wait
        while True:
            missing = [r for r in members if r != me
                       and not store.check([f"pyro_flat/roll_call/{global_rank(r)}"])]
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.05)
    except RuntimeError:  # the store is unreachable: its host, rank 0, is gone
        return [0] if me != 0 else []
