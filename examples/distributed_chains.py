"""Chains across ranks, or one data-parallel chain, with ``torchrun``.

Chains across ranks (2 ranks x 2 vectorised chains = 4 chains, gathered on rank 0)::

    torchrun --nproc_per_node=2 examples/distributed_chains.py --out /tmp/run

One chain, each rank holding half of the data (its minibatch gradient summed over the ranks)::

    torchrun --nproc_per_node=2 examples/distributed_chains.py --data-parallel --out /tmp/run

Runs in segments of draws, saving a checkpoint after each: a job that stops (or that torchrun
restarts, ``--max-restarts=3``) continues from the last complete segment on the same world
size. Without ``torchrun`` (``python examples/distributed_chains.py``) it is a job of one rank.
Add ``--backend nccl`` on GPUs (one per rank).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch

import pyro_flat
from pyro_flat.distributed import DistributedMCMC, data_parallel, process_group, shard_rows
from pyro_flat.infer import SGHMC


def model(x: torch.Tensor, y: torch.Tensor) -> None:
    """Bayesian logistic regression."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("distributed_run"))
    parser.add_argument("--data-parallel", action="store_true")
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--draws", type=int, default=100, help="draws per segment")
    args = parser.parse_args()

    with process_group(args.backend) as device:
        g = torch.Generator().manual_seed(0)  # the same data on every rank
        x = torch.randn(2000, 5, generator=g)
        y = torch.bernoulli(torch.sigmoid(x @ torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0])),
                            generator=g)
        x, y = x.to(device), y.to(device)
        if args.data_parallel:
            kernel = data_parallel(SGHMC(model, step_size=1e-4, friction=10.0,
                                         subsample_size=256), num_data=len(x))
            data = shard_rows(x, y)  # this rank's rows
        else:
            kernel = SGHMC(model, step_size=1e-4, friction=10.0, subsample_size=256,
                           vectorized_chains=2)
            data = (x, y)
        mcmc = DistributedMCMC(kernel, num_samples=args.draws, warmup_steps=0, seed=2024)
        checkpoints = args.out / "checkpoints"
        done = 0
        if (checkpoints / "ckpt.rank0.pt").exists():  # a restarted job
            mcmc.load_checkpoint(checkpoints)
            done = len(list(args.out.glob("draws-*.pt")))
        for segment in range(done, args.segments):
            mcmc.run(*data)
            mcmc.save_checkpoint(checkpoints)
            if mcmc.rank == 0:
                torch.save(pyro_flat.get_samples(mcmc, group_by_chain=True),
                           args.out / f"draws-{segment}.pt")
                idata = pyro_flat.to_arviz(mcmc, log_likelihood=False,
                                           posterior_predictive=False, observed_data=False)
                print(f"segment {segment}: {idata.posterior.sizes['chain']} chains, "
                      f"mean w = {idata.posterior['w'].mean(('chain', 'draw')).values.round(2)}")


if __name__ == "__main__":
    main()
