"""``pyro_flat.LeanMCMC``: Pyro's MCMC with one preallocated buffer gives Pyro's draws bit for
bit, with Pyro's API (its memory is measured by ``benchmarks/draw_memory.py``)."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pyro.infer.mcmc.api
import pytest
import torch
from pyro.infer import MCMC, NUTS

from pyro_flat import LeanMCMC, get_samples, sample_stats
from pyro_flat.infer import SGLD, EntropyMCMC


def regression(x, y):
    """Linear regression with a Dirichlet-weighted feature mix and a noise scale."""
    mix = pyro.sample("mix", dist.Dirichlet(torch.ones(3)))
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", len(x), subsample_size=25) as i:
        pyro.sample("y", dist.Normal((x[i] * mix) @ w.sum(-1), s), obs=y[i])


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(100, 3, generator=g)
    return x, x @ torch.tensor([1.0, 0.0, -1.0]) + 0.5 * torch.randn(100, generator=g)


def _run(driver, kernel, data, *, num_chains=1, parallel=False, **kwargs):
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        mp.setattr(pyro.infer.mcmc.api.mp, "cpu_count", lambda: num_chains + 1 if parallel else 1)
        warnings.filterwarnings("ignore", message="num_chains=.*sequentially")
        mcmc = driver(kernel, num_samples=20, warmup_steps=5, num_chains=num_chains,
                      disable_progbar=True, **kwargs)
        pyro.set_rng_seed(0)
        mcmc.run(*data)
    return mcmc


CASES = {
    "SGLD": (lambda: SGLD(regression, step_size=1e-3), {}),
    "EntropyMCMC-vectorized": (lambda: EntropyMCMC(regression, step_size=1e-3, eta=1.0,
                                                   vectorized_chains=2), {}),
    "SGLD-save_params": (lambda: SGLD(regression, step_size=1e-3), {"save_params": ["s"]}),
    "SGLD-no-params": (lambda: SGLD(regression, step_size=1e-3), {"save_params": []}),
    "SGLD-2-chains": (lambda: SGLD(regression, step_size=1e-3), {"num_chains": 2}),
    "SGLD-2-workers": (lambda: SGLD(regression, step_size=1e-3),
                       {"num_chains": 2, "parallel": True}),
    "NUTS": (lambda: NUTS(regression, max_tree_depth=3), {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_draws_and_api_are_pyros_bit_for_bit(name, data):
    make_kernel, kwargs = CASES[name]
    if name == "NUTS":
        data = (data[0][:25], data[1][:25])  # NUTS takes no subsampled plate: 25 points whole
    lean, stock = (_run(driver, make_kernel(), data, **kwargs) for driver in (LeanMCMC, MCMC))
    for group_by_chain in (False, True):
        a, b = (m.get_samples(group_by_chain=group_by_chain) for m in (lean, stock))
        assert list(a) == list(b)
        for site in b:
            assert torch.equal(a[site], b[site]), site
    if name != "SGLD-no-params":
        assert lean.diagnostics().keys() == stock.diagnostics().keys()
        for site, value in stock.diagnostics().items():
            assert str(lean.diagnostics()[site]) == str(value), site
    if name not in ("NUTS", "SGLD-no-params"):
        for a, b in ((get_samples(lean), get_samples(stock)),
                     (sample_stats(lean), sample_stats(stock))):
            assert all(torch.equal(a[k], b[k]) for k in b)



def test_the_hook_sees_what_pyro_s_driver_shows_it(data):
    """Without a progress bar LeanMCMC drives the kernel itself: ``hook_fn`` gets the same
    kernel, draws, stages and indices as under Pyro's driver, chain after chain."""
    seen = {LeanMCMC: [], MCMC: []}
    for driver, calls in seen.items():
        def hook(kernel, params, stage, i, calls=calls):
            calls.append((type(kernel).__name__, stage, i, params["s"].item()))

        _run(driver, SGLD(regression, step_size=1e-3), data, num_chains=2, hook_fn=hook)
    assert len(seen[MCMC]) == 2 * 25 and seen[LeanMCMC] == seen[MCMC]
    assert seen[MCMC][-1][1:3] == ("Sample [1]", 19)


def test_with_a_progress_bar_the_draws_are_pyro_s(data, capsys):
    lean, stock = (driver(SGLD(regression, step_size=1e-3), num_samples=5, warmup_steps=2)
                   for driver in (LeanMCMC, MCMC))
    for mcmc in (lean, stock):
        pyro.set_rng_seed(0)
        mcmc.run(*data)
    assert torch.equal(lean.get_samples()["w"], stock.get_samples()["w"])
