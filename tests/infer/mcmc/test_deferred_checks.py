"""The SG step that never waits for the host (``defer_finiteness_checks``), as chains on an
accelerator take it, run here on the CPU.

On a GPU, reading a value back (``float(u)``, ``bool(mask.any())``, indexing by a boolean
mask) stalls the stream until every queued kernel has run, once per step. The deferred step
keeps the finiteness record on the device and reads it once per draw. It must (1) contain
none of the operations that would wait (:class:`host_sync.HostSyncs` records them on the CPU,
as ``torch.cuda.set_sync_debug_mode`` does on a GPU; ``tests/test_cuda.py`` checks the same
there) and (2) give the same draws and statistics as the synchronous step, to the bit, for
every kernel, with and without non-finite steps, and stop a diverging chain with the same
message (the same chain, step and site).
"""

from __future__ import annotations

import math

import harness
import pytest
import torch
from host_sync import HostSyncs
from pyro.infer import MCMC
from test_cuda import kernel as kernel_for  # every kernel at a given step, small settings

import pyro_flat
from pyro_flat.infer import SGHMC, SGLD
from pyro_flat.infer.mcmc import registry
from pyro_flat.infer.mcmc.l2e import native
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical

#: The kernels whose SG step is free of host synchronisation when deferred (ContourSGLD's
#: stochastic-approximation bookkeeping and SASGLD's per-chain ascent step read values on the
#: host; they run deferred all the same, with the same draws).
SYNC_FREE = ("SGLD", "SGHMC", "CyclicalSGLD", "EntropyMCMC", "SASGLD", "L2E")
N, FEATURES, CLASSES = 128, 6, 3


def network_model() -> tuple[BNN, torch.Tensor, torch.Tensor]:
    """A 6-16-3 tanh classifier, minibatched by the kernel (B = 32 of N = 128)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, CLASSES))
    return BNN(net, Categorical(), subsample_size=32), x, y


def run(kernel, defer: bool, num_samples: int = 6, *data) -> MCMC:
    kernel.defer_finiteness_checks = defer
    return harness.run(kernel, num_samples, 2, 0, *data)


@pytest.fixture
def torch_meta_kernels(monkeypatch):
    """L2E's meta-network through torch's kernels, as on a GPU (the native kernel is CPU-only)."""
    monkeypatch.setattr(native, "applies", lambda *args: False)


@pytest.mark.parametrize("chains", [None, 3])
@pytest.mark.parametrize("name", SYNC_FREE)
def test_a_deferred_sg_step_never_waits_for_the_host(name, chains, torch_meta_kernels):
    model, x, y = network_model()
    kernel = kernel_for(name, model, vectorized_chains=chains)
    run(kernel, True, 2, x, y)
    kernel.sample(kernel._last_draw)  # a draw whose statistics the next step completes
    assert kernel.recorder.pending
    with HostSyncs() as syncs:
        for _ in range(3):
            kernel._sg_step()
    assert syncs.found == []
    # the synchronous step, for contrast, reads whether every chain is finite
    with HostSyncs() as syncs:
        kernel.stepper.step(1e-3, kernel.minibatches.next())
    assert syncs.found


@pytest.mark.parametrize("chains", [None, 3])
@pytest.mark.parametrize("name", list(registry.KERNELS))
def test_deferred_checks_give_the_synchronous_draws(name, chains, torch_meta_kernels):
    model, x, y = network_model()
    runs = [run(kernel_for(name, model, vectorized_chains=chains), defer, 6, x, y)
            for defer in (False, True)]
    now, deferred = (r.get_samples() for r in runs)
    for site, value in now.items():
        assert torch.equal(deferred[site], value), site
    stats = [pyro_flat.kernel_diagnostics(r)[0]["sample_stats"] for r in runs]
    for stat, value in stats[0].items():
        assert torch.equal(stats[1][stat].nan_to_num(), value.nan_to_num()), stat


def bounded_potential(params):
    """0.5 |x|^2 for ``max |x| < 3``, infinite beyond: a hot chain steps out of it."""
    x = params["x"]
    u = 0.5 * x.square().sum(-1)
    return torch.where(x.abs().amax(-1) < 3, u, torch.full_like(u, math.inf))


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC])
def test_chains_that_skip_non_finite_steps_take_the_synchronous_draws(kernel_class):
    """Four chains at temperature 3 leave the box often: each non-finite step is skipped, the
    chain falls back and (SGHMC) its momentum restarts, on both paths alike."""
    def make():
        return kernel_class(potential_fn=bounded_potential,
                            initial_params={"x": torch.zeros(4, 2)}, step_size=0.5,
                            temperature=3.0, num_steps_per_sample=5, vectorized_chains=4)

    runs = [run(make(), defer, 60) for defer in (False, True)]
    diverging = [pyro_flat.kernel_diagnostics(r)[0]["sample_stats"]["diverging"] for r in runs]
    assert 0 < int(diverging[0].sum()) < diverging[0].numel()  # some steps, not every one
    assert torch.equal(diverging[1], diverging[0])
    assert torch.equal(runs[1].get_samples()["x"], runs[0].get_samples()["x"])
    assert runs[1].kernel.divergence.num_diverging == runs[0].kernel.divergence.num_diverging


@pytest.mark.parametrize("chains", [None, 2])
def test_a_chain_that_must_stop_stops_with_the_synchronous_message(chains):
    """The potential turns non-finite from its 21st evaluation: the deferred run learns it at
    the draw's end and names the same chain, step and site as the step-by-step one."""
    shape = (3,) if chains is None else (chains, 3)

    def make():
        calls = [0]

        def potential(params):
            calls[0] += 1
            u = 0.5 * params["x"].square().sum(-1)
            return u if calls[0] <= 20 else u * math.nan

        return SGLD(potential_fn=potential, initial_params={"x": torch.zeros(shape)},
                    step_size=0.1, max_nonfinite_steps=10, num_steps_per_sample=7,
                    vectorized_chains=chains)

    messages = []
    for defer in (False, True):
        with pytest.raises(RuntimeError, match="diverged") as error:
            run(make(), defer, 100)
        messages.append(str(error.value))
    assert messages[1] == messages[0]
    assert "last at step 29" in messages[0]
    assert ("chain 0 of 2" if chains else "the chain") in messages[0]


@pytest.mark.parametrize("name", ["SGHMC", "SASGLD"])
def test_a_deferred_run_resumes_bitwise(name):
    """A checkpoint between draws holds nothing of the deferred record: the chain resumed from
    it continues to the same draws, non-finite steps included (the box of
    ``bounded_potential``)."""
    def make():
        kernel = registry.KERNELS[name](
            potential_fn=bounded_potential, initial_params={"x": torch.zeros(3, 2)},
            step_size=0.5, temperature=3.0, num_steps_per_sample=5, vectorized_chains=3,
            **({"rho": 0.05} if name == "SASGLD" else {}))
        kernel.defer_finiteness_checks = True
        return kernel

    whole, _ = harness.assert_resume_continues(make)
    assert pyro_flat.kernel_diagnostics(whole)[0]["sample_stats"]["diverging"].any()
