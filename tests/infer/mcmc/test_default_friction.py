"""The friction of an underdamped update when none is given: the one at which the momentum
decays by a tenth per step (pyro_flat.infer.mcmc.friction.MOMENTUM_DECAY), at a given step and
with the step warmup adapts (SGHMC, and the underdamped SASGLD and EntropyMCMC).

Before, the default was a friction of 1 whatever the step. At the steps warmup chooses on BNNs
(0.002-0.02) that is a decay of 0.2-2% per step, and on the conformance matrix's horseshoe
regression a step unstable where a local scale wandered threw chains that the momentum then
carried to ``tau`` near zero (``benchmarks/horseshoe_flights.py``).
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
from pyro_flat.infer.mcmc.friction import MOMENTUM_DECAY

PRECISIONS = torch.tensor([1.0, 400.0])


def gaussian() -> None:
    """Independent normals with precisions 1 and 400: a top curvature of 400."""
    pyro.sample("x", dist.Normal(0.0, PRECISIONS.rsqrt()).to_event(1))


KERNELS = {
    "SGHMC": lambda **kw: SGHMC(gaussian, **kw),
    "SASGLD": lambda **kw: SASGLD(gaussian, rho=0.01, dynamics="underdamped", **kw),
    "EntropyMCMC": lambda **kw: EntropyMCMC(gaussian, eta=0.5, dynamics="underdamped", **kw),
}


@pytest.mark.parametrize("name", KERNELS)
def test_a_given_step_takes_the_friction_of_a_tenth_decay(name):
    """``C = 0.1 M / eps`` at a given step or at a schedule's first; a given friction stays."""
    assert KERNELS[name](step_size=0.02, mass=2.0).friction == pytest.approx(10.0)
    scheduled = KERNELS[name](step_size_schedule=lambda t: 0.05 / (1 + t))
    assert scheduled.friction == pytest.approx(2.0)
    assert KERNELS[name](step_size=0.02, friction=3.0).friction == 3.0


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("fraction", [0.2, 0.1])
def test_warmup_chooses_the_step_and_the_friction_together(name, fraction):
    """At each estimate of warmup (full batch) the step is the stability rule's at the chosen
    friction, and the two decay the momentum by ``min(0.1, f / 2)`` per step. The curvature
    estimate is a power iteration's, so the pair is checked against the estimate the record
    holds; the estimate itself is within 1% of 400."""
    pyro.set_rng_seed(0)
    kernel = KERNELS[name](mass=2.0, stability_fraction=fraction, num_steps_per_sample=5)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=20, disable_progbar=True)
    mcmc.run()
    records = [r for r in mcmc.diagnostics()["step_size_adaptation"]["chain 0"]
               if "curvature" in r]
    assert len(records) == len(adaptation.ESTIMATE_AT)
    decay = min(MOMENTUM_DECAY, fraction / 2)
    for record in records:
        kernel.friction = record["friction"]
        step = fraction * kernel.stability_limit(record["curvature"])
        assert record["step_size"] == pytest.approx(step, rel=1e-9)
        assert record["step_size"] * record["friction"] / 2.0 == pytest.approx(decay, rel=1e-9)
        if name != "EntropyMCMC":  # its limit is at the joint curvature with the coupling
            assert record["curvature"] == pytest.approx(400.0, rel=0.01)
    assert kernel.friction == records[-1]["friction"]
    assert kernel.base_step_size == records[-1]["step_size"]


def test_the_default_friction_is_sghmcs_closed_form():
    """For SGHMC's update the decay ``a`` at the stability rule's step has a closed form:
    ``eps C / M = f min(4c / (sqrt(c^2 + 4k) + c), 1)`` with ``c = C/M`` and ``k = lam/M``, so
    ``c = 2 sqrt(k) / sqrt((4f/a - 1)^2 - 1)``."""
    kernel = SGHMC(gaussian, mass=3.0)
    for curvature in (1e-3, 1.0, 400.0, 1e7):
        friction = kernel.noise_fit.restore(kernel, curvature)
        k, f, a = curvature / 3.0, 0.2, MOMENTUM_DECAY
        expected = 3.0 * 2 * math.sqrt(k) / math.sqrt((4 * f / a - 1) ** 2 - 1)
        assert friction == pytest.approx(expected, rel=1e-9)
        step = f * adaptation.underdamped_limit(curvature, friction, 3.0)
        assert step * friction / 3.0 == pytest.approx(a, rel=1e-9)
