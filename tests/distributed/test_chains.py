"""Chains across ranks: the gathered run of two ranks is the single-process chains of the
ranks' seeds, draw for draw, with every per-draw statistic, and exports as one run."""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer import MCMC

import pyro_flat
from pyro_flat.distributed import DistributedMCMC
from tests.distributed.scenarios import CHAIN_RUNS, data

WORLD = 2


def single_process_chains(name: str, seed: int) -> tuple[dict, dict]:
    """The chains of one rank, run here: the kernel after ``pyro.set_rng_seed(seed)``."""
    make, _, warmup, draws = CHAIN_RUNS[name]
    pyro.set_rng_seed(seed)
    mcmc = MCMC(make(), num_samples=draws, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(*data())
    return (pyro_flat.get_samples(mcmc, group_by_chain=True),
            pyro_flat.sample_stats(mcmc, group_by_chain=True))


@pytest.mark.parametrize("name, chains_per_rank", [("chains_single", 1),
                                                   ("chains_vectorized", 2)])
def test_gathered_chains_are_the_single_process_chains_of_the_rank_seeds(
        two_rank_job: Path, float64: None, name: str, chains_per_rank: int) -> None:
    gathered = torch.load(two_rank_job / f"{name}.pt", weights_only=False)
    seed = CHAIN_RUNS[name][1]
    assert gathered["chains"] == WORLD * chains_per_rank  # to_arviz's chain dimension
    for r in range(WORLD):
        # rank r is seeded seed + r * C: its vectorised chain k draws its initial values and
        # minibatches from the stream of seed + r * C + k, as a single process would
        samples, stats = single_process_chains(name, seed + r * chains_per_rank)
        rows = slice(r * chains_per_rank, (r + 1) * chains_per_rank)
        for site, value in samples.items():
            assert torch.equal(gathered["samples"][site][rows], value), (site, r)
        assert stats.keys() == gathered["stats"].keys()
        for stat, value in stats.items():
            assert torch.equal(gathered["stats"][stat][rows], value), (stat, r)


def test_one_rank_job_is_a_plain_run(float64: None) -> None:
    """Without torchrun the same script runs as one rank: the chains of ``seed``."""
    make, seed, warmup, draws = CHAIN_RUNS["chains_vectorized"]
    mcmc = DistributedMCMC(make(), num_samples=draws, warmup_steps=warmup, seed=seed,
                           disable_progbar=True)
    mcmc.run(*data())
    samples, _ = single_process_chains("chains_vectorized", seed)
    for site, value in samples.items():
        assert torch.equal(pyro_flat.get_samples(mcmc, group_by_chain=True)[site], value)
    assert mcmc.num_chains == 2 and mcmc.rank_seed == seed


def test_a_second_run_continues_the_chains(float64: None) -> None:
    """Runs after the first are segments of the same chains (no new warmup, no restart)."""
    make, seed, warmup, draws = CHAIN_RUNS["chains_vectorized"]
    mcmc = DistributedMCMC(make(), num_samples=draws, warmup_steps=warmup, seed=seed,
                           disable_progbar=True)
    kernel = make()  # the reference: one kernel, continued through its state_dict
    pyro.set_rng_seed(seed)
    reference = MCMC(kernel, num_samples=draws, warmup_steps=warmup, disable_progbar=True)
    reference.run(*data())
    kernel.load_state_dict(kernel.state_dict())
    reference = MCMC(kernel, num_samples=draws, warmup_steps=0, disable_progbar=True)
    reference.run(*data())
    for _ in range(2):
        mcmc.run(*data())
    for site, value in reference.get_samples().items():
        assert torch.equal(mcmc.get_samples(group_by_chain=True)[site][0], value), site
