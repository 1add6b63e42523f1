"""Checkpoints of a two-rank job: one file per rank; a new job on the same world size continues
every rank's chains bit for bit; another world size is a clear error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer import MCMC

import pyro_flat
from pyro_flat.distributed import DistributedMCMC
from tests.distributed.launch import forked
from tests.distributed.scenarios import CHAIN_RUNS, RESUME_DRAWS, data


def test_a_new_job_continues_every_rank_bitwise(two_rank_job: Path, tmp_path: Path,
                                                float64: None) -> None:
    shutil.copytree(two_rank_job / "ckpt", tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt.rank0.pt",
                                                                      "ckpt.rank1.pt"]
    forked(tmp_path, "resume:second")  # a new job: fresh processes, the same world size
    resumed = torch.load(tmp_path / "resume_second.pt", weights_only=False)
    first = torch.load(two_rank_job / "resume_first.pt", weights_only=False)
    make, seed, _, _ = CHAIN_RUNS["chains_vectorized"]
    for r in range(2):
        # the uninterrupted chains of rank r: both segments in one process, one kernel
        kernel = make()
        pyro.set_rng_seed(seed + 2 * r)
        segments = []
        for _ in range(2):
            mcmc = MCMC(kernel, num_samples=RESUME_DRAWS, warmup_steps=0, disable_progbar=True)
            mcmc.run(*data())
            segments.append(pyro_flat.get_samples(mcmc, group_by_chain=True))
            kernel.load_state_dict(kernel.state_dict())
        for site in segments[0]:
            rows = slice(2 * r, 2 * r + 2)
            assert torch.equal(first[site][rows], segments[0][site]), site
            assert torch.equal(resumed[site][rows], segments[1][site]), site


def test_resuming_on_another_world_size_is_a_clear_error(two_rank_job: Path) -> None:
    make = CHAIN_RUNS["chains_vectorized"][0]
    mcmc = DistributedMCMC(make(), num_samples=5, warmup_steps=0)  # a job of one rank
    with pytest.raises(ValueError, match="world size mismatch.*world size 2.*world size 1"):
        mcmc.load_checkpoint(two_rank_job / "ckpt")


def test_a_corrupt_or_truncated_checkpoint_names_its_path(tmp_path: Path) -> None:
    """Read with torch.load's defaults: a file cut short or overwritten is an error naming it
    (it was a bare UnpicklingError or a zip error without the path)."""
    from pyro_flat.distributed.checkpoints import (
        checkpoint_path,
        load_rank_checkpoint,
        save_rank_checkpoint,
    )

    save_rank_checkpoint(tmp_path, {"z": torch.zeros(3)}, rank=0, world_size=1)
    assert torch.equal(load_rank_checkpoint(tmp_path, rank=0, world_size=1)["kernel"]["z"],
                       torch.zeros(3))
    path = checkpoint_path(tmp_path, 0)
    whole = path.read_bytes()
    for broken in (whole[: len(whole) // 2], b"not a checkpoint", b""):
        path.write_bytes(broken)
        with pytest.raises(ValueError, match=f"cannot read the checkpoint {path}"):
            load_rank_checkpoint(tmp_path, rank=0, world_size=1)
