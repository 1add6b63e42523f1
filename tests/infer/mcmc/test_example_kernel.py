"""The 46-line kernel of the architecture page (``docs/examples/sgnht_kernel.py``) is a working
sampler: it writes only its update rule and its state, and gets from the base class what every
kernel has (Pyro models with constrained sites, checkpoints that resume bitwise, the fall-back
after a non-finite step)."""

import importlib.util
import pathlib

import fixed_seed_runs
import harness
import pyro
import pytest
import torch
from pyro.infer import MCMC

PATH = pathlib.Path(__file__).parents[3] / "docs" / "examples" / "sgnht_kernel.py"
_spec = importlib.util.spec_from_file_location("sgnht_kernel", PATH)
sgnht_kernel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sgnht_kernel)
SGNHT = sgnht_kernel.SGNHT


def test_samples_a_correlated_gaussian():
    """256 chains of N((1, -1), [[1, .5], [.5, 1]]): mean and covariance within 0.1, each
    asserted to be at least 4.5 Monte Carlo standard errors (the O(eps) discretisation bias
    of the thermostat dynamics at eps = 0.02 is below 0.01 here)."""
    target = harness.correlated_2d()
    kernel = SGNHT(potential_fn=target, initial_params=target.initial_params(),
                   step_size=0.02, num_steps_per_sample=10)
    mcmc = harness.run(kernel, num_samples=400, warmup_steps=100)
    harness.check_gaussian(harness.chains_of(mcmc), target.mean, target.cov)


def test_a_model_with_constrained_sites_resumes_bitwise():
    x, y = fixed_seed_runs.dirichlet_data()

    def make():
        return SGNHT(fixed_seed_runs.dirichlet_model, 2e-3, num_steps_per_sample=3)

    harness.assert_resume_continues(make, x, y)
    kernel = make()
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=10, disable_progbar=True)
    mcmc.run(x, y)
    p = mcmc.get_samples()["p"]
    assert p.shape == (20, 3) and torch.allclose(p.sum(-1), torch.ones(20))
    assert sorted(kernel.state_dict()["kernel_state"]) == ["momentum", "thermostat"]


def test_what_the_kernel_does_not_declare_is_refused():
    """Its update ignores a metric and its stability limit is not the Langevin one, so a
    metric and a warmup-chosen step are refused (the base defaulted both to on: the kernel
    ran with them, silently wrong)."""
    target = harness.correlated_2d()
    given = {"potential_fn": target, "initial_params": target.initial_params()}
    with pytest.raises(ValueError, match="SGNHT does not declare supports_adaptation"):
        SGNHT(**given)
    with pytest.raises(ValueError, match=r"preconditioner='diag' is not available for SGNHT: "
                                         r"its update does not take a metric"):
        SGNHT(**given, step_size=0.02, preconditioner="diag")
