"""Warmup backs off from a step that blows a chain up (:meth:`Warmup.after_step`).

The target is :math:`p(x) \\propto e^{-x^4}`, started at ``x = 0.05``: the curvature there,
:math:`12 x^2 = 0.03`, is hundreds of times smaller than in the typical set (:math:`|x| \\approx
0.6`, curvature about 4), so the first step warmup chooses throws the chain out, where the
gradient :math:`4x^3` grows until the potential overflows a few steps later: the last finite
position is already far out. Before the backoff, such a run stopped with the divergence error
or, worse, finished far out in the tails (E[x^2] of 1.7e4 on one seed). Exact:
:math:`E[x^2] = \\Gamma(3/4) / \\Gamma(1/4) = 0.33799`.
"""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from harness import ess
from pyro.infer import MCMC

from pyro_flat.infer import SGLD

EXACT_X2 = math.gamma(0.75) / math.gamma(0.25)
#: The discretisation bias of E[x^2] at step 0.05, SGLD, measured with 64 chains x 2,000 draws
#: (0.3425 against 0.3380); the adapted steps here are at most that (stability fraction 0.25).
BIAS = 0.005


def quartic(params):
    return (params["x"] ** 4).sum(-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_step_that_blows_the_chain_up_in_warmup_is_backed_off(seed):
    """SGLD (SGHMC's stability limit at friction 1 keeps its step below the blow-up here; the
    conformance matrix's heteroskedastic BNN is its case)."""
    pyro.set_rng_seed(seed)
    k = SGLD(potential_fn=quartic, initial_params={"x": torch.full((16, 1), 0.05)},
               vectorized_chains=16, num_steps_per_sample=5, stability_fraction=0.25)
    mcmc = MCMC(k, num_samples=300, warmup_steps=100, disable_progbar=True)
    mcmc.run()
    log = k.diagnostics()["step_size_adaptation"]
    backoffs = [r for r in log if r.get("after_nonfinite_step")]
    assert backoffs, "the flat start's step did not blow up: the test does not test the backoff"
    chosen = [r["step_size"] for r in log if "curvature" in r]
    assert all(s <= backoffs[-1]["step_size"] for s in chosen[-3:]), "an estimate above the bound"
    x = mcmc.get_samples()["x"].squeeze(-1)  # (draws, chains)
    assert bool(torch.isfinite(x).all()) and float(x.abs().max()) < 4.0
    x2 = x.square()
    mcse = float(x2.std() / ess(x2.T.unsqueeze(-1)).sum().sqrt())
    assert abs(float(x2.mean()) - EXACT_X2) < 4 * mcse + BIAS, (float(x2.mean()), mcse)
    assert max(chosen[-3:]) <= 0.05 + 1e-9  # where BIAS was measured


def test_after_warmup_the_step_is_not_backed_off():
    """A given step is the user's: a chain it blows up stops with the divergence error."""
    pyro.set_rng_seed(0)
    k = SGLD(potential_fn=quartic, step_size=5.0, initial_params={"x": torch.tensor([0.05])})
    with pytest.raises(RuntimeError, match="diverged"):
        MCMC(k, num_samples=300, warmup_steps=10, disable_progbar=True).run()
    assert "step_size_adaptation" not in k.diagnostics()
