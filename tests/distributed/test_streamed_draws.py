"""Draws streamed to disk by a two-rank job (``DistributedMCMC(draws_path=...)``): each rank
writes its own part of one store, the parts open as the gathered run of the same job (bit for
bit), the driver keeps no draw in memory, and a continued run appends to every rank's part,
in the same job or in a new one, as one uninterrupted run."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from pyro_flat import open_draws
from pyro_flat.distributed import DistributedMCMC
from tests.distributed.launch import forked
from tests.distributed.scenarios import (
    CHAIN_RUNS,
    DP_DRAWS,
    STREAM_SEGMENT,
    STREAM_SEGMENTS,
    STREAM_WARMUP,
    data,
)

WORLD, CHAINS_PER_RANK = 2, 2


def _dataset(data: object, group: str) -> xr.Dataset:
    ds = data[group]
    return ds if isinstance(ds, xr.Dataset) else ds.to_dataset()


def _assert_bitwise(opened: object, gathered: dict[str, xr.Dataset], num_draws: int,
                    num_chains: int = WORLD * CHAINS_PER_RANK) -> None:
    """``posterior`` and ``sample_stats`` of the store are the gathered run's first
    ``num_draws`` draws: same variables, dims, coordinates, dtypes and values, bit for bit."""
    for group in ("posterior", "sample_stats"):
        a = _dataset(opened, group)
        b = gathered[group].isel(draw=slice(0, num_draws))
        assert sorted(a.data_vars) == sorted(b.data_vars), group
        assert dict(a.sizes) == dict(b.sizes), group
        assert a["chain"].values.tolist() == list(range(num_chains)), group
        np.testing.assert_array_equal(a["draw"].values, np.arange(num_draws))
        for name in b.data_vars:
            assert a[name].dims == b[name].dims and a[name].dtype == b[name].dtype, name
            np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


def test_each_rank_writes_its_part_and_they_open_as_the_gathered_run(two_rank_job: Path
                                                                     ) -> None:
    store = two_rank_job / "stream_gathered"
    # rank r writes its C chains r * C, ..., r * C + C - 1 into one shared directory
    assert sorted(p.name for p in store.iterdir()) == ["part-00000.nc", "part-00002.nc"]
    gathered = torch.load(two_rank_job / "stream_gathered.pt", weights_only=False)
    opened = open_draws(store)
    _assert_bitwise(opened, gathered, STREAM_SEGMENT * STREAM_SEGMENTS)
    assert opened.attrs["pyro_flat_kernel"] == gathered["posterior"].attrs["pyro_flat_kernel"]
    assert opened.attrs["num_sg_steps"] == list(gathered["posterior"].attrs["num_sg_steps"])


def test_streamed_segments_keep_no_draws_and_append_to_every_part(two_rank_job: Path) -> None:
    for r in range(WORLD):
        for segment in torch.load(two_rank_job / f"stream_kept.rank{r}.pt", weights_only=False):
            assert segment["local"] == {}  # save_params=[]: the driver kept no draw
            assert segment["gathered"] == ({} if r == 0 else None)  # nothing to gather
    gathered = torch.load(two_rank_job / "stream_gathered.pt", weights_only=False)
    # two runs of one job: the second appended to each rank's part, continuing the draw index
    _assert_bitwise(open_draws(two_rank_job / "stream_segments"), gathered, 2 * STREAM_SEGMENT)


def test_a_new_job_resumes_and_appends_to_every_rank_part(two_rank_job: Path, tmp_path: Path
                                                          ) -> None:
    for name in ("stream_segments", "stream_ckpt"):
        shutil.copytree(two_rank_job / name, tmp_path / name)
    forked(tmp_path, "stream:resume")  # fresh processes, load_checkpoint, run: appends
    gathered = torch.load(two_rank_job / "stream_gathered.pt", weights_only=False)
    assert sorted(p.name for p in (tmp_path / "stream_segments").iterdir()) == [
        "part-00000.nc", "part-00002.nc"]
    # three segments over two jobs: the draws of one uninterrupted run
    _assert_bitwise(open_draws(tmp_path / "stream_segments"), gathered,
                    STREAM_SEGMENT * STREAM_SEGMENTS)


def test_a_data_parallel_chain_is_written_once_by_rank_0(two_rank_job: Path) -> None:
    store = two_rank_job / "stream_dp"
    assert sorted(p.name for p in store.iterdir()) == ["part-00000.nc"]
    gathered = torch.load(two_rank_job / "stream_dp.pt", weights_only=False)
    _assert_bitwise(open_draws(store), gathered, DP_DRAWS, num_chains=1)


def test_one_rank_streams_and_refuses_to_overwrite_or_orphan_its_part(tmp_path: Path,
                                                                      float64: None) -> None:
    """Without torchrun: one rank, one part; errors name the argument and the part."""
    make, seed, _, _ = CHAIN_RUNS["chains_vectorized"]
    store = tmp_path / "draws"
    mcmc = DistributedMCMC(make(), num_samples=6, warmup_steps=STREAM_WARMUP, seed=seed,
                           draws_path=store, draw_options={"sites": ["w"], "thin": 2},
                           disable_progbar=True)
    assert mcmc.chain_offset == 0 and mcmc.save_params == []
    mcmc.run(*data())
    mcmc.run(*data())  # a second run appends
    posterior = _dataset(open_draws(store), "posterior")
    assert list(posterior.data_vars) == ["w"]
    assert posterior["draw"].values.tolist() == [0, 2, 4, 6, 8, 10]
    assert mcmc.get_samples() == {}

    again = DistributedMCMC(make(), num_samples=6, seed=seed, draws_path=store,
                            disable_progbar=True)
    with pytest.raises(ValueError, match=r"draws_path=.*already holds rank 0's chains \[0, 1\] "
                                         r"\(part-00000.nc\).*load_checkpoint"):
        again.run(*data())
    mcmc.save_checkpoint(tmp_path / "ckpt")
    elsewhere = DistributedMCMC(make(), num_samples=6, seed=seed, draws_path=tmp_path / "new",
                                disable_progbar=True)
    elsewhere.load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"draws_path=.*holds no part of rank 0's chains "
                                         r"\[0, 1\] \(part-00000.nc\) to append to"):
        elsewhere.run(*data())


def test_a_restart_after_an_unfinished_run_replaces_its_draws(tmp_path: Path, float64: None
                                                               ) -> None:
    """A job dies in its second run, after writing some draws; the restarted job loads the
    checkpoint of the first run: its draws replace the dead run's, as one uninterrupted run."""
    make, seed, _, _ = CHAIN_RUNS["chains_vectorized"]

    def streamed(path: Path, hook_fn: object = None) -> DistributedMCMC:
        return DistributedMCMC(make(), num_samples=8, warmup_steps=STREAM_WARMUP, seed=seed,
                               draws_path=path, draw_options={"block_size": 2},
                               hook_fn=hook_fn, disable_progbar=True)

    whole = streamed(tmp_path / "whole")
    for _ in range(2):
        whole.run(*data())

    def dies(kernel: object, params: object, stage: str, i: int) -> None:
        if mcmc.local_mcmc.warmup_steps == 0 and i == 5:
            raise KeyboardInterrupt("killed")

    mcmc = streamed(tmp_path / "draws", dies)
    mcmc.run(*data())
    mcmc.save_checkpoint(tmp_path / "ckpt")
    with pytest.raises(KeyboardInterrupt):
        mcmc.run(*data())
    with pytest.warns(RuntimeWarning, match="did not finish"):
        assert _dataset(open_draws(tmp_path / "draws"), "posterior").sizes["draw"] > 8
    restarted = streamed(tmp_path / "draws")
    restarted.load_checkpoint(tmp_path / "ckpt")
    restarted.run(*data())
    a, b = open_draws(tmp_path / "draws"), open_draws(tmp_path / "whole")
    for group in ("posterior", "sample_stats"):
        xr.testing.assert_identical(_dataset(a, group), _dataset(b, group))
    del a, b  # the files open for reading (HDF5 refuses to open them for appending too)
    gc.collect()

    # a checkpoint older than the draws: a clear error, not draws appended at the wrong index
    stale = streamed(tmp_path / "draws")
    stale.load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"part-00000.nc holds the draws of rank 0's chains up "
                                         r"to draw 16, but the chains continue after draw 8"):
        stale.run(*data())


@pytest.mark.parametrize("kwargs, message", [
    ({"draws_path": 3}, "draws_path must be a directory path"),
    ({"draw_options": {"thin": 2}}, "draw_options is given but draws_path is not"),
    ({"draws_path": "d", "draw_options": {"chain_offset": 4}},
     r"draw_options may set \['sites', 'stats', 'thin', 'block_size'\], got \['chain_offset'\]"),
    ({"draws_path": "d", "draw_options": ["thin"]}, "draw_options must be a mapping"),
    ({"save_params": "w"}, "save_params must be a list of site names"),
])
def test_bad_streaming_arguments_are_named(kwargs: dict, message: str) -> None:
    make = CHAIN_RUNS["chains_vectorized"][0]
    with pytest.raises(ValueError, match=message):
        DistributedMCMC(make(), num_samples=5, **kwargs)
