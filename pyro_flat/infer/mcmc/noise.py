"""Standard-normal noise for auxiliary variables, drawn one step ahead on a background thread.

Drawing a Gaussian vector the size of a network is the one cost of a second set of variables
(EntropyMCMC's guiding copy :math:`\\theta_a`) that does not shrink with the model's forward pass:
on a CPU, ``normal_()`` on 90k floats takes about as long as 15% of an SGLD step of a
784-100-100-10 MLP. That noise is independent of everything else in the step, so it can be
drawn while the model's gradient is being computed: :class:`PrefetchedNormal` fills the next
vector on a worker thread (PyTorch releases the GIL inside its kernels) from its own generator,
so the values and their order are the same as a synchronous ``normal_()`` on that generator,
and runs stay reproducible. On other devices it draws synchronously (kernels there run
asynchronously anyway).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class PrefetchedNormal:
    """A stream of :math:`\\mathcal{N}(0, I)` vectors shaped like ``like`` from ``generator``.

    Each :meth:`next` returns a buffer that stays valid until the following call; the vector
    after it is already being drawn. :meth:`generator_state` is the generator's state as if
    no vector had been drawn ahead, so a checkpoint taken between steps resumes the same
    sequence.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> stream = PrefetchedNormal(torch.empty(3), g)
    >>> a, b = stream.next().clone(), stream.next().clone()
    >>> g2 = torch.Generator().manual_seed(0)
    >>> torch.equal(torch.randn(3, generator=g2), a), torch.equal(torch.randn(3, generator=g2), b)
    (True, True)
    """

    def __init__(self, like: torch.Tensor, generator: torch.Generator):
        self._buffers = (torch.empty_like(like), torch.empty_like(like))
        self._generator = generator
        self._index = 0
        self._pending: Future | None = None
        self._state_before_pending: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._prefetch = like.device.type == "cpu"

    def next(self) -> torch.Tensor:
        """The next standard-normal vector (valid until the following call)."""
        out = self._buffers[self._index]
        if self._pending is None:
            out.normal_(generator=self._generator)
        else:
            self._pending.result()
            self._pending = None
        self._index ^= 1
        if self._prefetch:
            self._state_before_pending = self._generator.get_state()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyro_flat_noise")
            self._pending = self._pool.submit(self._fill, self._buffers[self._index])
        return out

    def _fill(self, buffer: torch.Tensor) -> None:
        buffer.normal_(generator=self._generator)

    def generator_state(self) -> torch.Tensor:
        """The generator's state with no vector drawn ahead (for checkpoints)."""
        if self._pending is not None:
            self._pending.result()
            return self._state_before_pending
        return self._generator.get_state()

    def close(self) -> None:
        """Finish the pending draw and stop the worker thread."""
        if self._pending is not None:
            self._pending.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("PrefetchedNormal holds a worker thread and is not picklable")
