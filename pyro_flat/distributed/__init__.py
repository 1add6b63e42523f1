"""Scale-out on ``torch.distributed`` (launched by ``torchrun``): chains across ranks, gathered
into one run (:class:`DistributedMCMC`), and one data-parallel chain whose minibatch gradient
is summed over the ranks' data shards (:func:`data_parallel`). See ``docs/distributed.md``."""

from pyro_flat.distributed.data_parallel import data_parallel, shard_bounds, shard_rows
from pyro_flat.distributed.faults import RankFailure
from pyro_flat.distributed.group import process_group, rank, world_size
from pyro_flat.distributed.mcmc import DistributedMCMC

__all__ = ["DistributedMCMC", "RankFailure", "data_parallel", "process_group", "rank",
           "shard_bounds", "shard_rows", "world_size"]
