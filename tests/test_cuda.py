"""pyro_flat on a CUDA device: every registered kernel (one chain and vectorised chains), the SVI
tools, the export to ArviZ and the draw writer, with the model, the data and the chains on the
GPU. Skipped where torch sees no CUDA device (``pytest -m cuda`` selects these tests).

A full-batch run without noise is deterministic, so the same run on the CPU must give the same
draws to float rounding: that checks that nothing on the way (minibatch indices, state fields,
the flat prior, the statistics) silently stays on, or moves to, the CPU.
"""

from __future__ import annotations

import arviz_compat
import pyro
import pytest
import torch
from pyro.infer import MCMC, SVI
from pyro.infer.autoguide import AutoNormal
from pyro.optim import Adam

import pyro_flat
from pyro_flat import DrawWriter, open_draws, to_arviz
from pyro_flat.infer import LeanELBO, SharpnessAwareELBO
from pyro_flat.infer.mcmc import registry
from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

N, FEATURES, CLASSES = 256, 10, 3
NO_REPLAY = {"log_likelihood": False, "posterior_predictive": False, "observed_data": False}


def data(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    return x.to(device), y.to(device)


def model(device: str, subsample_size: int | None = None) -> BNN:
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, CLASSES)).to(device)
    return BNN(net, Categorical(), subsample_size=subsample_size)


def kernel(name: str, bnn: BNN, **kwargs):
    """Each registered kernel at a given step (``step_size`` of ``U``, N = 256)."""
    extra = {"ContourSGLD": {"num_bins": 8, "auto_bins": True, "zeta": 0.5},
             "EntropyMCMC": {"eta": 0.05}, "SASGLD": {"rho": 0.05},
             "SGHMC": {"friction": 10.0}, "CyclicalSGLD": {"cycle_length": 6},
             "L2E": {"meta_params": MetaNet.init(torch.Generator().manual_seed(0),
                                                 planted=3.0, descent=30.0)}}.get(name, {})
    if name != "CyclicalSGLD":
        extra["num_steps_per_sample"] = 3
    step = 1e-2 if name in ("SGHMC", "L2E") else 1e-3
    return registry.KERNELS[name](bnn, step, **extra, **kwargs)


def run(name: str, device: str, *, warmup: int = 4, num_samples: int = 6,
        subsample_size: int | None = None, **kwargs) -> MCMC:
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel(name, model(device, subsample_size), **kwargs),
                num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(*data(device))
    return mcmc


@pytest.mark.parametrize("chains", [None, 4])
@pytest.mark.parametrize("name", list(registry.KERNELS))
def test_every_kernel_runs_on_the_gpu_minibatched(name, chains):
    mcmc = run(name, "cuda", subsample_size=32, vectorized_chains=chains)
    draws = mcmc.get_samples()
    assert all(v.is_cuda and bool(torch.isfinite(v).all()) for v in draws.values())
    assert mcmc.kernel.position.is_cuda
    stats = pyro_flat.sample_stats(mcmc)
    assert not bool(stats["diverging"].any())
    idata = to_arviz(mcmc, **NO_REPLAY)
    assert idata.posterior.sizes["chain"] == (chains or 1)


@pytest.mark.parametrize("name", list(registry.KERNELS))
def test_a_noiseless_full_batch_run_is_the_cpu_run(name):
    on_gpu = run(name, "cuda", temperature=0.0)
    on_cpu = run(name, "cpu", temperature=0.0)
    for site, value in on_cpu.get_samples().items():
        torch.testing.assert_close(on_gpu.get_samples()[site].cpu(), value, rtol=1e-4,
                                   atol=1e-5, msg=site)


def test_the_compiled_potential_on_the_gpu_draws_as_the_eager_one():
    """compile=True on the GPU (minibatched, noise on): the eager GPU run's draws to float32
    rounding over a short run."""
    eager = run("SGLD", "cuda", subsample_size=32)
    compiled = run("SGLD", "cuda", subsample_size=32, compile=True)
    assert pyro_flat.kernel_diagnostics(compiled)[0]["compile"]["used"]
    for site, value in eager.get_samples().items():
        torch.testing.assert_close(compiled.get_samples()[site], value, rtol=1e-4, atol=1e-5,
                                   msg=site)


def test_a_warmup_adapted_run_on_the_gpu():
    pyro.set_rng_seed(0)
    mcmc = MCMC(registry.KERNELS["SGLD"](model("cuda", 32)), num_samples=10, warmup_steps=40,
                disable_progbar=True)
    mcmc.run(*data("cuda"))
    diagnostics = pyro_flat.kernel_diagnostics(mcmc)[0]
    assert diagnostics["step_size_adaptation"] and "gradient_noise" in diagnostics


@pytest.mark.parametrize("chains", [None, 8])
@pytest.mark.parametrize("name", ["SGLD", "SGHMC", "CyclicalSGLD", "EntropyMCMC", "L2E"])
def test_the_sg_step_does_not_synchronise_with_the_host(name, chains):
    """On the GPU the SG step checks finiteness once per draw (``defer_finiteness_checks``): no
    step between draws waits for the host (``tests/infer/mcmc/test_deferred_checks.py`` checks
    the same operations on the CPU, and the draws against the synchronous step's)."""
    mcmc = run(name, "cuda", subsample_size=32, num_samples=1, vectorized_chains=chains)
    kernel = mcmc.kernel
    kernel.sample(kernel._last_draw)  # a pending draw, whose statistics the next step keeps
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            kernel._sg_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("name", ["SGLD", "SASGLD"])
def test_the_deferred_step_draws_as_the_synchronous_one(name):
    """The GPU's default step (finiteness read once per draw) against the step that reads it
    at once, both on the GPU: the same arithmetic, so the same draws to float rounding."""
    runs = []
    for defer in (True, False):
        pyro.set_rng_seed(0)
        k = kernel(name, model("cuda", 32), vectorized_chains=4)
        k.defer_finiteness_checks = defer
        mcmc = MCMC(k, num_samples=6, warmup_steps=4, disable_progbar=True)
        mcmc.run(*data("cuda"))
        runs.append(mcmc.get_samples())
    for site, value in runs[1].items():
        torch.testing.assert_close(runs[0][site], value, rtol=1e-5, atol=1e-6, msg=site)


def test_a_diverging_chain_on_the_gpu_stops_with_its_chain_step_and_site():
    calls = [0]

    def potential(params):
        calls[0] += 1
        u = 0.5 * params["x"].square().sum(-1)
        return u if calls[0] <= 20 else u * float("nan")

    sgld = registry.KERNELS["SGLD"](
        potential_fn=potential, initial_params={"x": torch.zeros(2, 3, device="cuda")},
        step_size=0.1, max_nonfinite_steps=10, num_steps_per_sample=7, vectorized_chains=2)
    with pytest.raises(RuntimeError, match=r"chain 0 of 2 diverged.*10 of the last 20 SG steps "
                                           r"\(10 in a row\), the last at step 29.*'x'"):
        MCMC(sgld, num_samples=100, warmup_steps=2, disable_progbar=True).run()


@pytest.mark.parametrize("loss", [LeanELBO, lambda: SharpnessAwareELBO(rho=0.05)])
def test_svi_on_the_gpu(loss):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    bnn = model("cuda", 32)
    guide = AutoNormal(bnn)
    svi = SVI(bnn, guide, Adam({"lr": 1e-2}), loss())
    x, y = data("cuda")
    losses = [svi.step(x, y) for _ in range(50)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert all(p.is_cuda for _, p in pyro.get_param_store().named_parameters())


def test_draws_stream_to_disk_from_the_gpu(tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=6, block_size=2)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel("SGLD", model("cuda", 32), vectorized_chains=2), num_samples=6,
                warmup_steps=2, disable_progbar=True, hook_fn=writer)
    mcmc.run(*data("cuda"))
    opened = open_draws(tmp_path / "draws")
    posterior = (opened["posterior"].to_dataset() if arviz_compat.ARVIZ_1
                 else opened.posterior)
    for site, value in pyro_flat.get_samples(mcmc, group_by_chain=True).items():
        assert torch.equal(torch.as_tensor(posterior[site].values), value.cpu()), site


@pytest.fixture
def one_nccl_rank(monkeypatch):
    """The environment torchrun gives the one rank of a one-GPU job."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("mode", ["chains", "data-parallel"])
def test_distributed_runs_with_nccl_at_world_size_one(one_nccl_rank, mode):
    from pyro_flat.distributed import DistributedMCMC, data_parallel, process_group

    with process_group("nccl") as device:
        assert device.type == "cuda"
        x, y = data(str(device))
        if mode == "chains":
            sampler = kernel("SGLD", model(str(device), 32), vectorized_chains=2)
        else:  # the chain of all ranks, each with its shard (here the whole data)
            sampler = data_parallel(kernel("SGLD", model(str(device)), subsample_size=32),
                                    num_data=N)
        mcmc = DistributedMCMC(sampler, num_samples=6, warmup_steps=2, seed=0)
        mcmc.run(x, y)
        draws = pyro_flat.get_samples(mcmc, group_by_chain=True)
    assert all(bool(torch.isfinite(v).all()) for v in draws.values())
    assert next(iter(draws.values())).shape[0] == (2 if mode == "chains" else 1)
