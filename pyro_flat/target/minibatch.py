"""Minibatch indices for SG-MCMC: epoch-wise shuffling without replacement.

Each epoch is one random permutation of ``range(N)`` cut into ``N // B`` minibatches of ``B``
indices (the remainder is dropped, as ``DataLoader(drop_last=True)`` does). Compared with
Pyro's own plate subsampling, which draws ``randperm(N)[:B]`` afresh at every step, this costs
one permutation per epoch instead of one per step and visits every datum once per epoch.
"""

from __future__ import annotations

from typing import Any

import torch


class MinibatchStream:
    """An endless stream of minibatch index tensors over ``range(size)``.

    Parameters
    ----------
    size : int
        ``N``, the number of data points in the subsampled plate.
    batch_size : int
        ``B``, the number of indices per minibatch, ``1 <= B <= N``.
    device : torch.device, optional
        Where the index tensors live (the device of the data).
    generator : torch.Generator, optional
        The random stream of the permutations (default: torch's global one).
    """

    def __init__(self, size: int, batch_size: int, device: torch.device | str | None = None,
                 generator: torch.Generator | None = None):
        if not 1 <= batch_size <= size:
            raise ValueError(
                f"subsample_size must be an integer in [1, {size}] (the plate size), "
                f"got {batch_size}"
            )
        self.size = int(size)
        self.batch_size = int(batch_size)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.generator = generator
        self._perm: torch.Tensor | None = None
        self._pos = 0

    @property
    def batches_per_epoch(self) -> int:
        return self.size // self.batch_size

    def _fresh_perm(self) -> torch.Tensor:
        return torch.randperm(self.size, device=self.device, generator=self.generator)

    def next(self) -> torch.Tensor:
        """The next minibatch; starts a new epoch (a new permutation) when the current one ends."""
        if self._perm is None or self._pos + self.batch_size > self.size:
            self._perm = self._fresh_perm()
            self._pos = 0
        batch = self._perm[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return batch

    def peek(self) -> torch.Tensor:
        """The minibatch that :meth:`next` would return, without advancing the stream.

        At the end of an epoch this draws a permutation that is then discarded: callers that
        must not disturb the random stream save and restore the RNG state around it.
        """
        if self._perm is None or self._pos + self.batch_size > self.size:
            return self._fresh_perm()[: self.batch_size]
        return self._perm[self._pos : self._pos + self.batch_size]

    def state_dict(self) -> dict[str, Any]:
        perm = None if self._perm is None else self._perm.clone()
        return {"size": self.size, "batch_size": self.batch_size, "perm": perm, "pos": self._pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["size"] != self.size or state["batch_size"] != self.batch_size:
            raise ValueError(
                f"saved minibatch stream is over {state['size']} points in batches of "
                f"{state['batch_size']}, this one over {self.size} in batches of {self.batch_size}"
            )
        perm = state["perm"]
        self._perm = None if perm is None else perm.to(self.device)
        self._pos = int(state["pos"])


class ChainMinibatches:
    """The minibatches of one chain, or of ``K`` vectorised chains (one stream each).

    Parameters
    ----------
    size, batch_size : int
        ``N`` and ``B`` of the subsampled plate.
    device : torch.device
        Where the index tensors live.
    generators : list of torch.Generator or None
        ``[None]``: one chain on torch's global stream; else one generator per chain.
    rows : bool, optional
        Whether a batch has a leading chain dimension (default: with generators); ``False``
        with one generator gives one chain's ``(B,)`` from its own stream.

    Examples
    --------
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> batches = ChainMinibatches(10, 4, "cpu", [None])
    >>> tuple(batches.next().shape), batches.vectorized
    ((4,), False)
    >>> gens = [torch.Generator().manual_seed(k) for k in range(3)]
    >>> tuple(ChainMinibatches(10, 4, "cpu", gens).next().shape)  # one row per chain
    (3, 4)
    """

    def __init__(self, size: int, batch_size: int, device: torch.device | str,
                 generators: list[torch.Generator | None], rows: bool | None = None):
        self.streams = [MinibatchStream(size, batch_size, device, g) for g in generators]
        #: Whether the chains are vectorised (one stream each; a list in :meth:`state_dict`).
        self.vectorized = generators != [None]
        if rows is False and len(generators) != 1:
            raise ValueError(f"rows=False needs one chain, got {len(generators)} generators")
        #: Whether a batch has a leading chain dimension.
        self.rows = self.vectorized if rows is None else rows

    @property
    def size(self) -> int:
        """``N``."""
        return self.streams[0].size

    @property
    def batch_size(self) -> int:
        """``B``."""
        return self.streams[0].batch_size

    def next(self) -> torch.Tensor:
        """The next minibatch: ``(B,)``, or ``(K, B)`` with :attr:`rows`."""
        if not self.rows:
            return self.streams[0].next()
        return torch.stack([stream.next() for stream in self.streams])

    def peek(self) -> torch.Tensor:
        """The minibatch :meth:`next` would return, without advancing (see
        :meth:`MinibatchStream.peek` for the random stream)."""
        if not self.rows:
            return self.streams[0].peek()
        return torch.stack([stream.peek() for stream in self.streams])

    def state_dict(self) -> Any:
        """The streams' states: one dict, or a list of one per vectorised chain."""
        states = [stream.state_dict() for stream in self.streams]
        return states if self.vectorized else states[0]

    def load_state_dict(self, state: Any) -> None:
        """Continue from :meth:`state_dict`'s ``state``."""
        states = state if self.vectorized else [state]
        for stream, saved in zip(self.streams, states, strict=True):
            stream.load_state_dict(saved)
