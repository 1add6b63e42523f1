"""Minibatch indices for a model's subsampled plates, chosen from outside the model."""

from __future__ import annotations

import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

__all__ = ["InjectIndices"]


class InjectIndices(Messenger):
    """Give every plate of full size ``size`` the indices ``batch``, unless they are set already.

    During a model run under this messenger, each subsample site of a ``pyro.plate`` whose full
    size is ``size`` and whose indices are not yet chosen (its value is None) takes the value
    ``batch``, so ``pyro.plate("data", N, subsample_size=B)`` yields ``batch`` instead of a
    random minibatch. Plates of another size, and plates given ``subsample=...``, are left
    alone.

    Parameters
    ----------
    size : int
        The full size ``N`` of the plates to inject into.
    batch : torch.Tensor
        The indices, a ``LongTensor`` of length ``B`` (the plate's ``subsample_size``).

    Examples
    --------
    >>> import pyro
    >>> def model():
    ...     with pyro.plate("data", 10, subsample_size=3) as i:
    ...         return i
    >>> InjectIndices(10, torch.tensor([7, 8, 9]))(model)()
    tensor([7, 8, 9])
    """

    def __init__(self, size: int, batch: torch.Tensor):
        super().__init__()
        self.size, self.batch = size, batch

    def _pyro_sample(self, msg: dict) -> None:
        if (site_is_subsample(msg) and msg["fn"].size == self.size
                and msg["value"] is None):
            msg["value"] = self.batch
