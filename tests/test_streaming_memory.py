"""A streamed run (``DrawWriter``, ``save_params=[]``) holds no more in memory as it draws:
the writer releases the statistics it has written from the kernel, which reads them back from
the store when the whole run's are needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_flat
from pyro_flat.infer import SGLD, ContourSGLD

BENCHMARK = Path(__file__).parents[1] / "benchmarks" / "streaming_memory.py"


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_a_streamed_run_grows_by_at_most_16_bytes_per_draw_over_100000_draws(tmp_path):
    """LeanMCMC(save_params=[]) + DrawWriter, 100,000 draws in a fresh process: the slope of
    its resident set size from draw 10,000 on (benchmarks/streaming_memory.py's measure), of
    vectorised chains, whose growth per draw is the largest. It was about 150 bytes per draw
    and chain: every draw's statistics stayed in the kernel, and the default block of a small
    model (16 MiB of draws: 4 million) held them all until the end; then 38 bytes per draw of
    4 chains, from HDF5's in-memory index of chunks of 1,024 draws and from reading the whole
    run's divergences back to complete the last draw.
    The readings' noise is of the order of the allocator's pages (4 kB in 10,000 draws, well
    under a byte per draw)."""
    sys.path.insert(0, str(BENCHMARK.parent))
    try:
        import streaming_memory
    finally:
        sys.path.remove(str(BENCHMARK.parent))
    out = subprocess.run([sys.executable, str(BENCHMARK), "--draws", "100000", "--child",
                          "lean+writer", "4", str(tmp_path / "draws")],
                         capture_output=True, text=True, check=True)
    readings = json.loads(out.stdout.strip().splitlines()[-1])  # [draw, rss] pairs
    slope, rise = streaming_memory.growth(readings)
    assert readings[-1][0] == 99_999 and len(readings) >= 10
    assert slope <= streaming_memory.TARGET_BYTES_PER_DRAW, (slope, rise)


@pytest.mark.parametrize("make", [
    lambda: SGLD(model, step_size=1e-2, vectorized_chains=3),
    lambda: ContourSGLD(model, step_size=1e-2, num_bins=20, auto_bins=True,
                        vectorized_chains=2),
], ids=["SGLD", "ContourSGLD"])
def test_released_statistics_are_read_back_as_they_were(tmp_path, make):
    """The end-of-run statistics of a streamed run (read back from the store) are those of the
    same run in memory, bit for bit, and so are the divergences and ContourSGLD's weights'
    ESS; the driver's sample_stats names the store."""
    y = torch.randn(20, generator=torch.Generator().manual_seed(0))

    def run(**kwargs):
        pyro.set_rng_seed(1)
        kernel = make()
        mcmc = pyro_flat.LeanMCMC(kernel, num_samples=300, warmup_steps=20,
                                  disable_progbar=True, **kwargs)
        mcmc.run(y)
        return kernel, mcmc

    writer = pyro_flat.DrawWriter(tmp_path / "draws", num_samples=300, block_size=7)
    kernel, streamed = run(hook_fn=writer, save_params=[])
    _, kept = run()
    assert kernel.recorder.released == 300  # nothing of the run's statistics left in memory
    assert all(len(rows) == 0 for rows in kernel.recorder._rows.values())
    ref = pyro_flat.kernel_diagnostics(kept)[0]
    stats, reference = kernel.recorder.tensors(), ref["sample_stats"]
    assert stats.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(stats[name].to(value.dtype), value), name
    done = pyro_flat.kernel_diagnostics(streamed)[0]
    assert done["divergences"] == ref["divergences"]
    assert done.get("weights_ess") == ref.get("weights_ess")
    with pytest.raises(ValueError, match=r"statistics are in the draw store '.*draws'.*"
                                         r"open_draws"):
        pyro_flat.sample_stats(streamed)


def test_statistics_stay_in_memory_when_the_draws_do(tmp_path):
    """Without save_params=[] (draws kept in memory too) nothing is released: to_arviz(mcmc)
    has every draw's statistics."""
    y = torch.randn(20, generator=torch.Generator().manual_seed(0))
    writer = pyro_flat.DrawWriter(tmp_path / "draws", num_samples=50, block_size=7)
    kernel = SGLD(model, step_size=1e-2)
    mcmc = pyro_flat.LeanMCMC(kernel, num_samples=50, hook_fn=writer, disable_progbar=True)
    mcmc.run(y)
    assert kernel.recorder.released == 0
    assert pyro_flat.sample_stats(mcmc)["lp"].shape == (50,)


def test_divergences_of_vectorised_chains_are_the_draws_where_a_chain_diverged():
    """diagnostics()['divergences'] listed every draw of vectorised chains as diverging (a
    draw's per-chain list was tested for emptiness, not for a True)."""
    y = torch.randn(20, generator=torch.Generator().manual_seed(0))
    mcmc = pyro.infer.MCMC(SGLD(model, step_size=1e-2, vectorized_chains=2), num_samples=5,
                           warmup_steps=0, disable_progbar=True)
    mcmc.run(y)
    assert pyro_flat.kernel_diagnostics(mcmc)[0]["divergences"] == []
