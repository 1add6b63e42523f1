"""The friction of an underdamped update when none is given: 1, until warmup sees a step throw
the momentum; from then on the one at which the momentum decays by a tenth per step, chosen
with the step (pyro_flat.infer.mcmc.friction; SGHMC, and the underdamped SASGLD and
EntropyMCMC).

Before, the friction stayed 1 whatever warmup saw. On the conformance matrix's horseshoe
regression a step unstable where a local scale wandered threw chains that a decay of 1% per
step let fly to ``tau`` near zero (``benchmarks/horseshoe_flights.py``); warmup saw the throw,
halved the step, and the chains went on flying.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_flat.infer import SASGLD, SGHMC, EntropyMCMC
from pyro_flat.infer.mcmc import adaptation
from pyro_flat.infer.mcmc.friction import DEFAULT_FRICTION, MOMENTUM_DECAY

PRECISIONS = torch.tensor([1.0, 400.0])
WARMUP, THROWN_AT = 20, 8  # estimates at warmup draws 0, 5, 10, 15; watched from draw 5


def gaussian() -> None:
    """Independent normals with precisions 1 and 400: a top curvature of 400."""
    pyro.sample("x", dist.Normal(0.0, PRECISIONS.rsqrt()).to_event(1))


KERNELS = {
    "SGHMC": lambda **kw: SGHMC(gaussian, **kw),
    "SASGLD": lambda **kw: SASGLD(gaussian, rho=0.01, dynamics="underdamped", **kw),
    "EntropyMCMC": lambda **kw: EntropyMCMC(gaussian, eta=0.5, dynamics="underdamped", **kw),
}


def _throw(kernel, params, stage, i):
    """Fault injection: chain 0's momentum of the stiff coordinate 1,000 sds out."""
    if stage == "Warmup" and i == THROWN_AT:
        kernel.state.momentum[0, 1] = 1000.0


def _run(kernel, hook=None) -> list[dict]:
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=WARMUP, disable_progbar=True, hook_fn=hook)
    mcmc.run()
    return mcmc.diagnostics()["step_size_adaptation"]["chain 0"]


@pytest.mark.parametrize("name", KERNELS)
def test_without_a_throw_the_friction_stays_the_default(name):
    kernel = KERNELS[name](mass=2.0, num_steps_per_sample=5)
    log = _run(kernel)
    assert not any("after_hot_momentum" in r for r in log)
    assert kernel.friction == DEFAULT_FRICTION and not kernel.noise_fit.damped
    assert all(r["friction"] == DEFAULT_FRICTION for r in log if "curvature" in r)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("fraction", [0.2, 0.1])
def test_a_throw_in_warmup_makes_the_friction_follow_the_momentum_decay(name, fraction):
    """After the throw the friction decays the momentum by ``min(0.1, f / 2)`` per step at the
    halved step at once, and at each later estimate with the step, which is the stability
    rule's at that friction or the back-off's bound, whichever is smaller."""
    kernel = KERNELS[name](mass=2.0, stability_fraction=fraction, num_steps_per_sample=5)
    log = _run(kernel, _throw)
    decay = min(MOMENTUM_DECAY, fraction / 2)
    (backoff,) = [r for r in log if "after_hot_momentum" in r]
    assert backoff["step_size"] * backoff["friction"] / 2.0 == pytest.approx(decay, rel=1e-9)
    later = [r for r in log if "curvature" in r and r["draw"] > THROWN_AT]
    assert [r["draw"] for r in later] == [10, 15]
    for record in later:
        assert record["step_size"] * record["friction"] / 2.0 == pytest.approx(decay, rel=1e-9)
        kernel.friction = record["friction"]
        rule = fraction * kernel.stability_limit(record["curvature"])
        assert record["step_size"] == pytest.approx(min(rule, backoff["step_size"]), rel=1e-9)
    assert kernel.noise_fit.damped
    assert kernel.friction == later[-1]["friction"]
    before = [r for r in log if "curvature" in r and r["draw"] < THROWN_AT]
    assert all(r["friction"] == DEFAULT_FRICTION for r in before)


def test_a_given_friction_is_kept_after_a_throw():
    kernel = SGHMC(gaussian, friction=1.5, num_steps_per_sample=5)
    log = _run(kernel, _throw)
    assert any("after_hot_momentum" in r for r in log)
    assert kernel.friction == 1.5 and not kernel.noise_fit.damped
    assert all(r["friction"] == 1.5 for r in log if "curvature" in r)


def test_a_checkpoint_keeps_the_damping():
    """A run resumed from warmup's state keeps following the decay (without it, the next
    estimate of a resumed warmup would go back to friction 1)."""
    kernel = SGHMC(gaussian, num_steps_per_sample=5)
    _run(kernel, _throw)
    state = kernel.warmup.state_dict()
    resumed = SGHMC(gaussian, num_steps_per_sample=5)
    resumed.warmup.load_state_dict(state)
    assert resumed.noise_fit.damped and resumed.friction == kernel.friction
    resumed.restore_friction(400.0)
    step = resumed.stability_fraction * resumed.stability_limit(400.0)
    assert step * resumed.friction == pytest.approx(MOMENTUM_DECAY, rel=1e-9)


def test_the_damped_friction_is_sghmcs_closed_form():
    """For SGHMC's update the decay ``a`` at the stability rule's step has a closed form:
    ``eps C / M = f min(4c / (sqrt(c^2 + 4k) + c), 1)`` with ``c = C/M`` and ``k = lam/M``, so
    ``c = 2 sqrt(k) / sqrt((4f/a - 1)^2 - 1)``."""
    kernel = SGHMC(gaussian, mass=3.0)
    kernel.noise_fit.damped = True
    for curvature in (1e-3, 1.0, 400.0, 1e7):
        friction = kernel.noise_fit.restore(kernel, curvature)
        k, f, a = curvature / 3.0, 0.2, MOMENTUM_DECAY
        expected = 3.0 * 2 * math.sqrt(k) / math.sqrt((4 * f / a - 1) ** 2 - 1)
        assert friction == pytest.approx(expected, rel=1e-9)
        step = f * adaptation.underdamped_limit(curvature, friction, 3.0)
        assert step * friction / 3.0 == pytest.approx(a, rel=1e-9)
