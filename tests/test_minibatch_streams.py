"""Minibatch index streams (``pyro_flat.target.minibatch``)."""

import torch

from pyro_flat.target import MinibatchStream


def test_epoch_wise_batches_partition_each_epoch():
    stream = MinibatchStream(12, 4, generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        epoch = torch.cat([stream.next() for _ in range(3)])
        assert sorted(epoch.tolist()) == list(range(12))

