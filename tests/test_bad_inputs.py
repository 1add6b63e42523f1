"""Bad inputs that were silent, obscure or crashed (issue 32's sweep), each with the clear error
(or warning) that names the argument and the accepted range."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_flat import DrawWriter, LeanMCMC
from pyro_flat.infer import SGLD
from pyro_flat.regression import crps, crps_gaussian, gaussian_nll, interval_coverage, rmse

Y = torch.tensor([0.0, 1.0, 2.0])
NAN_Y = torch.tensor([0.0, math.nan, 2.0])
INF_Y = torch.tensor([0.0, math.inf, 2.0])
DRAWS = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
ONES = torch.ones(3)


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


CASES = {  # id: (call, error, pattern)
    "crps NaN target": (lambda: crps(DRAWS, NAN_Y), ValueError, "y must be finite"),
    "crps_gaussian inf target": (lambda: crps_gaussian(Y, ONES, INF_Y), ValueError,
                                 "y must be finite at every point: 1 NaN or infinite"),
    "gaussian_nll inf target": (lambda: gaussian_nll(Y, ONES, INF_Y), ValueError,
                                "y must be finite"),
    "gaussian_nll NaN mean": (lambda: gaussian_nll(NAN_Y, ONES, Y), ValueError,
                              "mean must be finite"),
    "rmse NaN target": (lambda: rmse(Y, NAN_Y), ValueError, "y must be finite"),
    "coverage NaN target": (lambda: interval_coverage(Y - 1, Y + 1, NAN_Y), ValueError,
                            "y must be finite"),
    "coverage reversed interval": (lambda: interval_coverage(Y + 1, Y - 1, Y), ValueError,
                                   r"lower must be <= upper at every point: 3 reversed"),
    "LeanMCMC num_samples=0": (lambda: LeanMCMC(SGLD(model, step_size=1e-2), num_samples=0),
                               ValueError, "num_samples must be an integer >= 1, got 0"),
    "LeanMCMC num_samples=-3": (lambda: LeanMCMC(SGLD(model, step_size=1e-2), num_samples=-3),
                                ValueError, "num_samples must be an integer >= 1, got -3"),
    "DrawWriter path=5": (lambda: DrawWriter(5, num_samples=10), ValueError,
                          "path must be a directory path"),
    "diag metric, warmup 1": (
        lambda: MCMC(SGLD(model, preconditioner="diag"), num_samples=2, warmup_steps=1,
                     disable_progbar=True).run(Y),
        ValueError, r"preconditioner='diag' .* warmup_steps=1: give .* at least 4"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_named(case):
    call, error, pattern = CASES[case]
    with pytest.raises(error, match=pattern):
        call()


def test_a_block_too_large_to_allocate_names_block_size(tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=5, block_size=10**15)
    mcmc = MCMC(SGLD(model, step_size=1e-2), num_samples=5, hook_fn=writer,
                disable_progbar=True)
    with pytest.raises(ValueError, match=r"DrawWriter\(block_size=1000000000000000\) needs a "
                                         r"block of [\d,]+ bytes"):
        mcmc.run(Y)


def test_stability_fraction_with_a_given_step_says_it_is_ignored():
    with pytest.warns(UserWarning, match="stability_fraction=0.1 is used only when warmup "
                                         "chooses the step size"):
        SGLD(model, step_size=1e-2, stability_fraction=0.1)


def test_numpy_data_with_subsample_size_is_told_to_convert():
    """It was told to "pass the data as model arguments", which it was."""
    import numpy as np

    x = np.random.default_rng(0).normal(size=(40, 2))

    def regression(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(torch.as_tensor(x, dtype=torch.float32) @ w, 1.0),
                        obs=torch.as_tensor(y, dtype=torch.float32))

    mcmc = MCMC(SGLD(regression, step_size=1e-3, subsample_size=8), num_samples=2,
                disable_progbar=True)
    with pytest.raises(ValueError, match=r"model's data arguments are \['ndarray', 'ndarray'\]: "
                                         "convert them with torch.as_tensor"):
        mcmc.run(x, x[:, 0])


@pytest.mark.parametrize("warmup", [-1, 2.5, "10"])
def test_distributed_mcmc_checks_warmup_steps(warmup):
    from pyro_flat.distributed import DistributedMCMC

    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0"):
        DistributedMCMC(SGLD(model, step_size=1e-2), num_samples=5, warmup_steps=warmup)


def test_a_hidden_layer_too_wide_is_refused_before_the_run(capsys):
    """``--hidden 1000000000`` was accepted and failed later with "see results.json"."""
    from pyro_flat import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["compare", "--hidden", "1000000000"])
    assert stop.value.code == 2
    assert "argument --hidden: must be comma-separated layer widths in [1, 100,000]" in (
        capsys.readouterr().err)
