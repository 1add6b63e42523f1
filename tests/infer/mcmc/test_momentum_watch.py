"""The momentum of an underdamped chain read against its law: a step unstable in part of the
posterior warns at the run's end (after warmup) or backs off (in warmup); a stationary chain
does neither (pyro_flat.infer.mcmc.momentum_watch)."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_flat.infer import SASGLD, SGHMC
from pyro_flat.infer.mcmc.momentum_watch import hot_bound, momentum_sd


def _run(kernel, warmup=50, draws=200, hook=None):
    mcmc = MCMC(kernel, num_samples=draws, warmup_steps=warmup, disable_progbar=True,
                hook_fn=hook)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run()
    return mcmc, [str(w.message) for w in caught if "momentum was beyond" in str(w.message)]


def test_the_bound_holds_its_false_alarm_rate():
    """b = sqrt(2 log(2d/p)): d normal coordinates exceed it with probability at most p."""
    for d in (1, 18, 10**6):
        b = hot_bound(d, 1e-3)
        tail = math.erfc(b / math.sqrt(2))  # P(|xi| > b)
        assert d * tail <= 1e-3


def test_the_stationary_momentum_has_the_law_the_watch_assumes():
    """SGHMC on a standard normal in 20 dimensions at a per-step decay of 0.5: the momentum's
    variance is M T / (1 - decay / 2) (1.33, not 1), and no draw is read as hot.

    4 vectorised chains x 2,000 draws x 20 coordinates, 5 SG steps apart (the momentum
    decorrelates in about 2 steps): the sd of the estimated variance ratio is about
    sqrt(2 / 160,000) = 0.0035; the step (0.05) adds at most eps^2 k / 4 = 0.0006 in the
    position's direction. Tolerance 0.02, over 5 Monte Carlo sds.
    """
    pyro.set_rng_seed(0)
    step, friction, mass, temperature = 0.05, 10.0, 1.0, 1.0

    def potential(params):
        return 0.5 * params["x"].square().sum(-1)

    kernel = SGHMC(potential_fn=potential, initial_params={"x": torch.zeros(4, 20)},
                   step_size=step, friction=friction, mass=mass, vectorized_chains=4,
                   num_steps_per_sample=5)
    seen = []
    mcmc, hot = _run(kernel, warmup=100, draws=2000,
                     hook=lambda k, *a: seen.append(k.state.momentum.clone()))
    r = torch.stack(seen[100:])
    ratio = float(r.var()) / momentum_sd(step, friction, mass, temperature) ** 2
    assert abs(ratio - 1.0) < 0.02, ratio
    assert abs(float(r.var()) - 1.0 / (1 - 0.25)) < 0.03
    assert not hot
    assert kernel.momentum_watch.hot_draws.tolist() == [0, 0, 0, 0]
    assert float(kernel.momentum_watch.worst.max()) < kernel.momentum_watch.bound


def _stiff_model():
    """``calm ~ N(0, 1)``; ``stiff ~ N(0, 1)`` with a factor ``-A log cosh(stiff)``: a
    curvature of A at 0 and a gradient never above A."""
    pyro.sample("calm", dist.Normal(0.0, 1.0))
    stiff = pyro.sample("stiff", dist.Normal(0.0, 1.0))
    pyro.factor("wall", -400.0 * torch.log(torch.cosh(stiff)))


@pytest.mark.parametrize("kernel_class", [SGHMC, SASGLD])
def test_an_unstable_step_warns_naming_its_site(kernel_class):
    """A given step of 0.2 on curvature 400 (eps^2 k = 16, beyond SGHMC's limit 4): the
    bounded gradient keeps the chain finite, but its momentum is thrown far out. The run
    warns at its end, naming the site."""
    pyro.set_rng_seed(1)
    extra = {"dynamics": "underdamped", "rho": 0.01} if kernel_class is SASGLD else {}
    kernel = kernel_class(_stiff_model, step_size=0.2, friction=1.0, num_steps_per_sample=5,
                          **extra)
    mcmc, hot = _run(kernel, warmup=20, draws=50)
    assert len(hot) == 1 and "largest in site 'stiff'" in hot[0], hot
    report = mcmc.diagnostics()["momentum_watch"]["chain 0"]
    assert report["num_draws"] == 50 and report["hot_draws"][0] > 0
    assert report["largest"][0] > report["bound"]


def test_a_stable_step_does_not_warn():
    """The same model at a stable step (eps^2 k = 0.16) does not warn."""
    pyro.set_rng_seed(1)
    kernel = SGHMC(_stiff_model, step_size=0.02, friction=1.0, num_steps_per_sample=5)
    _, hot = _run(kernel, warmup=20, draws=200)
    assert not hot


def test_warmup_backs_off_after_a_hot_momentum():
    """Fault injection: a hook throws chain 0's momentum 1,000 sds out at a warmup draw after
    the first quarter; the next SG step puts the chain back at its lowest-energy position with
    no momentum, halves the adapted step and records it, naming the site. Nothing is read as
    hot before the first quarter (the start's energy) or after warmup."""
    pyro.set_rng_seed(2)
    kernel = SGHMC(_stiff_model, num_steps_per_sample=5)

    def throw(k, params, stage, i):
        if stage == "Warmup" and i == 30:
            k.state.momentum[0, 0] = 1000.0  # site 'calm'

    mcmc, hot = _run(kernel, warmup=40, draws=50, hook=throw)
    log = mcmc.diagnostics()["step_size_adaptation"]["chain 0"]
    backoffs = [r for r in log if "after_hot_momentum" in r]
    assert len(backoffs) == 1, log
    assert backoffs[0]["site"] == "calm" and backoffs[0]["after_hot_momentum"] > 900
    before = [r["step_size"] for r in log if r["num_sg_steps"] < backoffs[0]["num_sg_steps"]]
    assert backoffs[0]["step_size"] == pytest.approx(0.5 * before[-1])
    assert kernel.step_size is None and kernel.warmup.step_size <= backoffs[0]["step_size"]
    assert math.isfinite(float(kernel.state.momentum.abs().max()))
    assert not hot
