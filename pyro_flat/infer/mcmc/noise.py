"""Standard-normal noise for auxiliary variables, drawn ahead in blocks on a worker thread.

A second set of variables, such as EntropyMCMC's guiding copy :math:`\\theta_a`, needs a second
Gaussian vector the size of the network at every step. Its cost grows with the number of
parameters, not with the work of the forward pass, so on a small MLP it is a sizeable part of
the step. The vectors come from torch's ``normal_``, the fastest of the exact generators
available (docs/methods/entropy_mcmc.md, "Cost").

The noise is independent of everything else in a step, so :class:`PrefetchedNormal` fills the
next *block* of vectors on a worker thread while the model's gradients are computed (PyTorch
releases the GIL inside its kernels). Each vector is one ``normal_()`` call on the stream's own
generator, in order, so the values are exactly those of synchronous draws and runs stay
reproducible; blocks (up to 8 vectors, at most 4 MiB) make the hand-over between threads rare.
If the worker has not started the next block when it is needed, the calling thread cancels it
and draws the block itself. Without a spare core (``torch.get_num_threads()`` already uses
every core this process may run on) or off the CPU it draws in line. Drawing ahead on a
spare core takes the noise off the critical path of the step; docs/methods/entropy_mcmc.md,
"Cost", gives EntropyMCMC's step time with and without it.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

#: Most vectors drawn per hand-over to the worker thread, and the memory one block may use.
MAX_BLOCK_ROWS = 8
MAX_BLOCK_BYTES = 4 * 2**20


def spare_core() -> bool:
    """Whether this process may run on more cores than torch's intra-op threads use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores > torch.get_num_threads()


class PrefetchedNormal:
    """A stream of :math:`\\mathcal{N}(0, I)` vectors shaped like ``like`` from ``generator``.

    Each :meth:`next` returns a buffer that stays valid until the following call; with
    prefetching the vectors after it are already being drawn. :meth:`generator_state` is the
    generator's state as if no vector had been drawn ahead, so a checkpoint taken between steps
    resumes the same sequence. Nothing is drawn before the first :meth:`next`, so the generator
    may be re-seeded or restored until then.

    Parameters
    ----------
    like : torch.Tensor
        Shape, dtype and device of the vectors.
    generator : torch.Generator
        The stream's own generator (used by the worker thread only while it draws a block).
    prefetch : bool, optional
        Draw ahead on a worker thread; by default when ``like`` is on the CPU and
        :func:`spare_core` holds.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> stream = PrefetchedNormal(torch.empty(3), g, prefetch=True)
    >>> a, b = stream.next().clone(), stream.next().clone()
    >>> g2 = torch.Generator().manual_seed(0)
    >>> torch.equal(torch.randn(3, generator=g2), a), torch.equal(torch.randn(3, generator=g2), b)
    (True, True)
    >>> stream.close()
    """

    def __init__(self, like: torch.Tensor, generator: torch.Generator,
                 prefetch: bool | None = None):
        if prefetch is None:
            prefetch = like.device.type == "cpu" and spare_core()
        self.prefetch = bool(prefetch)
        rows = 1
        if self.prefetch:
            vector_bytes = max(1, like.numel() * like.element_size())
            rows = max(1, min(MAX_BLOCK_ROWS, MAX_BLOCK_BYTES // vector_bytes))
        self._blocks = [torch.empty((rows, *like.shape), dtype=like.dtype, device=like.device)
                        for _ in range(2 if self.prefetch else 1)]
        self._generator = generator
        self._current = 0
        self._row = rows  # the current block is used up: the first next() draws one
        self._states: list[torch.Tensor] | None = None  # state before each row of the block
        self._pending: Future | None = None
        self._state_before_pending: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()  # a forked child has no worker thread: see close()

    def next(self) -> torch.Tensor:
        """The next standard-normal vector (valid until the following call)."""
        block = self._blocks[self._current]
        if self._row == len(block):
            self._current = (self._current + 1) % len(self._blocks)
            block = self._blocks[self._current]
            pending, self._pending = self._pending, None
            if pending is None or pending.cancel():  # not started: draw it here, same values
                self._states = self._fill(block)
            else:
                self._states = pending.result()
            self._row = 0
            if self.prefetch:
                self._state_before_pending = self._generator.get_state()
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="pyro_flat_noise")
                following = self._blocks[(self._current + 1) % len(self._blocks)]
                self._pending = self._pool.submit(self._fill, following)
        self._row += 1
        return block[self._row - 1]

    def _fill(self, block: torch.Tensor) -> list[torch.Tensor]:
        states = []
        for row in block:  # one call per vector: the values of synchronous draws
            states.append(self._generator.get_state())
            row.normal_(generator=self._generator)
        return states

    def generator_state(self) -> torch.Tensor:
        """The generator's state with no vector drawn ahead (for checkpoints)."""
        if self._states is not None and self._row < len(self._states):
            return self._states[self._row]
        if self._pending is not None:
            return self._state_before_pending
        return self._generator.get_state()

    def close(self) -> None:
        """Finish the pending draw and stop the worker thread.

        The stream stays usable (a later :meth:`next` starts a new worker) and
        :meth:`generator_state` unchanged. In a process forked from the one that made this
        object the worker thread does not exist and a draw it had in flight never finishes:
        there the object is only dropped, without waiting.
        """
        if os.getpid() != self._pid:
            self._pending, self._pool = None, None
            return
        if self._pending is not None:
            self._pending.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("PrefetchedNormal holds a worker thread and is not picklable")
