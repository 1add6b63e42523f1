"""What each rank of the test jobs runs (``python -m torch.distributed.run ... scenarios.py``).

``scenarios.py <out_dir> <scenario> [<scenario> ...]``: every rank joins the job with
:func:`pyro_flat.distributed.process_group` and runs the scenarios in order; rank 0 saves the
gathered result of each as ``<out_dir>/<scenario>.pt`` (data-parallel scenarios: every rank,
``<scenario>.rank<r>.pt``). The models and the settings are shared with the tests, which rerun
the same chains in one process and compare. The ``stream`` scenarios write draw stores
(``DistributedMCMC(draws_path=...)``) under ``<out_dir>``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch

import pyro_flat
from pyro_flat.distributed import DistributedMCMC, data_parallel, process_group, shard_rows
from pyro_flat.distributed.group import DEFAULT_TIMEOUT
from pyro_flat.infer import SASGLD, SGHMC, SGLD, EntropyMCMC

NUM_DATA, BATCH = 101, 20  # shards of 50 and 51 points: uneven on purpose


def regression(x: torch.Tensor, y: torch.Tensor) -> None:
    """Bayesian linear regression with an unknown noise scale (a constrained site)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(x @ w + b, sigma), obs=y)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(NUM_DATA, 3, generator=g, dtype=torch.get_default_dtype())
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 + 0.5 * torch.randn(NUM_DATA, generator=g)
    return x, y


#: Kernels of the data-parallel scenarios: every update rule and both estimators.
DATA_PARALLEL_KERNELS = {
    "SGLD": lambda: SGLD(regression, step_size=5e-4, subsample_size=BATCH),
    "SGHMC": lambda: SGHMC(regression, step_size=5e-4, friction=5.0, subsample_size=BATCH),
    "EntropyMCMC": lambda: EntropyMCMC(regression, step_size=5e-4, eta=1.0,
                                       subsample_size=BATCH),
    "SASGLD": lambda: SASGLD(regression, step_size=5e-4, rho=0.05, subsample_size=BATCH),
}
DP_SEED, DP_DRAWS = 7, 15

#: Chains across ranks: (kernel factory, seed, warmup, draws).
CHAIN_RUNS = {
    "chains_single": (lambda: SGLD(regression, step_size=2e-3, subsample_size=BATCH,
                                   num_steps_per_sample=2), 11, 5, 20),
    "chains_vectorized": (lambda: SGHMC(regression, step_size=2e-3, friction=5.0,
                                        subsample_size=BATCH, vectorized_chains=2), 3, 5, 20),
}
RESUME_DRAWS = 10
#: Streamed chains: the chains_vectorized kernel, in segments of STREAM_SEGMENT draws after
#: STREAM_WARMUP warmup draws; the reference gathers STREAM_SEGMENTS segments in one run.
STREAM_WARMUP, STREAM_SEGMENT, STREAM_SEGMENTS = 5, 10, 3
STREAM_SITES = ["b", "sigma", "w"]


def run_chains(name: str, out: Path) -> DistributedMCMC:
    make, seed, warmup, draws = CHAIN_RUNS[name]
    mcmc = DistributedMCMC(make(), num_samples=draws, warmup_steps=warmup, seed=seed)
    mcmc.run(*data())
    if mcmc.rank == 0:
        torch.save({"samples": pyro_flat.get_samples(mcmc, group_by_chain=True),
                    "stats": pyro_flat.sample_stats(mcmc, group_by_chain=True),
                    "chains": pyro_flat.to_arviz(mcmc).posterior.sizes["chain"]},
                   out / f"{name}.pt")
    return mcmc


def run_data_parallel(name: str, out: Path) -> None:
    kernel = data_parallel(DATA_PARALLEL_KERNELS[name](), num_data=NUM_DATA)
    mcmc = DistributedMCMC(kernel, num_samples=DP_DRAWS, warmup_steps=0, seed=DP_SEED)
    mcmc.run(*shard_rows(*data()))
    torch.save({"samples": mcmc.get_samples(), "stats": pyro_flat.sample_stats(mcmc)},
               out / f"dp_{name}.rank{mcmc.rank}.pt")


def run_resume(phase: str, out: Path) -> None:
    """``first``: run the chains and save a checkpoint; ``second``: a new job resumes it."""
    make, seed, _, _ = CHAIN_RUNS["chains_vectorized"]
    mcmc = DistributedMCMC(make(), num_samples=RESUME_DRAWS, warmup_steps=0, seed=seed)
    if phase == "second":
        mcmc.load_checkpoint(out / "ckpt")
    mcmc.run(*data())
    if phase == "first":
        mcmc.save_checkpoint(out / "ckpt")
    if mcmc.rank == 0:
        torch.save(pyro_flat.get_samples(mcmc, group_by_chain=True), out / f"resume_{phase}.pt")


def _groups(idata) -> dict:
    """The ``posterior`` and ``sample_stats`` of ArviZ data as xarray datasets in memory."""
    import xarray as xr

    out = {}
    for group in ("posterior", "sample_stats"):
        ds = idata[group]
        out[group] = (ds if isinstance(ds, xr.Dataset) else ds.to_dataset()).load()
    return out


def run_stream(phase: str, out: Path) -> None:
    """Chains across ranks streamed to a draw store, each rank writing its own part.

    ``gathered``: one run of all the draws, streamed to ``stream_gathered`` and also kept
    (``save_params``) and gathered; rank 0 saves ``to_arviz`` of the gathered run.
    ``segments``: the same chains streamed to ``stream_segments`` in two runs of one job, with
    the default ``save_params`` (no draw in memory), then a checkpoint in ``stream_ckpt``;
    each rank saves what it kept. ``resume``: a new job continues from ``stream_ckpt`` and
    appends the last segment to ``stream_segments``. ``dp``: a data-parallel chain streamed to
    ``stream_dp`` (by rank 0) and gathered.
    """
    make, seed, _, _ = CHAIN_RUNS["chains_vectorized"]
    if phase == "gathered":
        mcmc = DistributedMCMC(make(), num_samples=STREAM_SEGMENT * STREAM_SEGMENTS,
                               warmup_steps=STREAM_WARMUP, seed=seed,
                               draws_path=out / "stream_gathered", save_params=STREAM_SITES)
        mcmc.run(*data())
        if mcmc.rank == 0:
            torch.save(_groups(pyro_flat.to_arviz(mcmc, log_likelihood=False,
                                                  posterior_predictive=False,
                                                  observed_data=False)),
                       out / "stream_gathered.pt")
    elif phase == "segments":
        mcmc = DistributedMCMC(make(), num_samples=STREAM_SEGMENT, warmup_steps=STREAM_WARMUP,
                               seed=seed, draws_path=out / "stream_segments")
        kept = []
        for _ in range(2):
            mcmc.run(*data())
            kept.append({"gathered": mcmc.get_samples() if mcmc.rank == 0 else None,
                         "local": mcmc.local_mcmc.get_samples()})
        mcmc.save_checkpoint(out / "stream_ckpt")
        torch.save(kept, out / f"stream_kept.rank{mcmc.rank}.pt")
    elif phase == "dp":  # one data-parallel chain: rank 0 alone writes it
        kernel = data_parallel(DATA_PARALLEL_KERNELS["SGLD"](), num_data=NUM_DATA)
        mcmc = DistributedMCMC(kernel, num_samples=DP_DRAWS, warmup_steps=0, seed=DP_SEED,
                               draws_path=out / "stream_dp", save_params=STREAM_SITES)
        mcmc.run(*shard_rows(*data()))
        if mcmc.rank == 0:
            torch.save(_groups(pyro_flat.to_arviz(mcmc, log_likelihood=False,
                                                  posterior_predictive=False,
                                                  observed_data=False)),
                       out / "stream_dp.pt")
    elif phase == "resume":
        mcmc = DistributedMCMC(make(), num_samples=STREAM_SEGMENT, warmup_steps=0, seed=seed,
                               draws_path=out / "stream_segments")
        mcmc.load_checkpoint(out / "stream_ckpt")
        mcmc.run(*data())
    else:
        raise ValueError(f"unknown stream phase {phase!r}")


def run_failure(kind: str, out: Path) -> None:
    """Rank 1 fails: its chain diverges (``diverge``), or its model raises in a data-parallel
    step (``raise``). Or a rank stops without raising at its 6th draw (``die``: SIGKILL,
    ``freeze``: SIGSTOP; ``-dp`` a data-parallel chain, ``die0`` rank 0 dies, ``die-stream``
    rank 1 dies while every rank streams its draws to ``out/draws`` in blocks of 2)."""
    rank = int(os.environ["RANK"])
    if kind.startswith(("die", "freeze")):
        victim = 0 if kind == "die0" else 1
        sig = signal.SIGKILL if kind.startswith("die") else signal.SIGSTOP

        def stop_at_sixth_draw(kernel, params, stage, i) -> None:
            if rank == victim and stage == "Sample" and i == 5:
                (out / f"stopped.rank{rank}").write_text(str(os.getpid()))
                os.kill(os.getpid(), sig)

        kernel = SGLD(regression, step_size=1e-3, subsample_size=BATCH)
        if kind.endswith("-dp"):
            kernel = data_parallel(kernel, NUM_DATA)
            args = shard_rows(*data())
        else:
            args = data()
        streaming = ({"draws_path": out / "draws", "draw_options": {"block_size": 2}}
                     if kind == "die-stream" else {})
        DistributedMCMC(kernel, num_samples=10_000, warmup_steps=0, seed=0,
                        hook_fn=stop_at_sixth_draw, **streaming).run(*args)
    elif kind == "diverge":
        step = 1e3 if rank == 1 else 1e-3  # rank 1's chain blows up
        kernel = SGLD(regression, step_size=step, subsample_size=BATCH, max_nonfinite_steps=3)
        mcmc = DistributedMCMC(kernel, num_samples=10_000, warmup_steps=0, seed=0)
        mcmc.run(*data())
    else:
        calls = [0]

        def failing(x: torch.Tensor, y: torch.Tensor) -> None:
            calls[0] += 1
            if rank == 1 and calls[0] > 8:
                raise KeyError("a broken shard")
            regression(x, y)

        kernel = data_parallel(SGLD(failing, step_size=1e-3, subsample_size=BATCH), NUM_DATA)
        DistributedMCMC(kernel, num_samples=10_000, warmup_steps=0, seed=0).run(
            *shard_rows(*data()))


def main(out: Path, scenarios: list[str]) -> None:
    torch.set_default_dtype(torch.float64)
    timeout = float(os.environ.get("PYRO_FLAT_TEST_TIMEOUT", DEFAULT_TIMEOUT))
    with process_group("gloo", timeout=timeout):
        for scenario in scenarios:
            kind, _, arg = scenario.partition(":")
            if kind == "chains":
                run_chains(arg, out)
            elif kind == "dp":
                run_data_parallel(arg, out)
            elif kind == "resume":
                run_resume(arg, out)
            elif kind == "stream":
                run_stream(arg, out)
            elif kind == "fail":
                run_failure(arg, out)
            else:
                raise ValueError(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
