"""Data-parallel SG-MCMC: one chain over two ranks, each holding its shard of the data, is the
single-process chain with the union minibatch, for every update rule and estimator."""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer import MCMC

import pyro_flat
from pyro_flat.distributed import data_parallel
from pyro_flat.infer import SGLD
from tests.distributed.scenarios import (
    DATA_PARALLEL_KERNELS,
    DP_DRAWS,
    DP_SEED,
    NUM_DATA,
    data,
    regression,
)

#: float64 throughout: the two processes add the minibatch's log-likelihoods in two parts, so
#: they differ from one process by the rounding of a sum (~1e-16 relative per step), which
#: 15 draws of these well-conditioned chains cannot lift above 1e-9.
RTOL, ATOL = 1e-9, 1e-12


@pytest.mark.parametrize("name", sorted(DATA_PARALLEL_KERNELS))
def test_data_parallel_chain_is_the_union_minibatch_chain(two_rank_job: Path, float64: None,
                                                          name: str) -> None:
    ranks = [torch.load(two_rank_job / f"dp_{name}.rank{r}.pt", weights_only=False)
             for r in range(2)]
    pyro.set_rng_seed(DP_SEED)
    mcmc = MCMC(DATA_PARALLEL_KERNELS[name](), num_samples=DP_DRAWS, warmup_steps=0,
                disable_progbar=True)
    mcmc.run(*data())  # one process, all the data, the same union minibatches
    expected, stats = mcmc.get_samples(), pyro_flat.sample_stats(mcmc)
    assert not stats["diverging"].any()
    for site, value in expected.items():
        # every rank holds the same chain, bit for bit
        assert torch.equal(ranks[0]["samples"][site], ranks[1]["samples"][site]), site
        torch.testing.assert_close(ranks[0]["samples"][site], value, rtol=RTOL, atol=ATOL)
    for stat in ("lp", "grad_norm", *(["sharpness"] if name == "SASGLD" else [])):
        torch.testing.assert_close(ranks[0]["stats"][stat], stats[stat], rtol=RTOL, atol=ATOL)


def test_data_parallel_needs_a_minibatched_model_and_a_fixed_step() -> None:
    with pytest.raises(ValueError, match="subsample_size=B"):
        data_parallel(SGLD(regression, step_size=1e-3), NUM_DATA)
    with pytest.raises(ValueError, match="fixed step_size"):
        data_parallel(SGLD(regression, subsample_size=10), NUM_DATA)
    with pytest.raises(ValueError, match="vectorized_chains"):
        data_parallel(SGLD(regression, step_size=1e-3, subsample_size=10,
                           vectorized_chains=2), NUM_DATA)
    with pytest.raises(ValueError, match="num_data"):
        data_parallel(SGLD(regression, step_size=1e-3, subsample_size=10), 0)
