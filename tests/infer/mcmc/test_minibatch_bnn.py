"""A user-written regression BNN with learned noise, minibatched at ``B = N / 8``, against the
same kernel on the full batch and against NUTS: what a user gets with no step size and
``num_steps_per_sample="auto"``.

The model is written as a Pyro user writes one: a 1-8-1 tanh ``PyroModule`` with
``PyroSample`` N(0, 1) weights and a ``HalfNormal(1)`` noise scale ``sigma``, 160 points of a
noisy sine (``benchmarks/minibatch_noise.py``'s ``small`` problem). Each kernel runs 4
vectorised chains, 300 warmup draws and 400 draws, on the full batch and with
``subsample_size=20``. NUTS's reference (``data/nuts_small_bnn.json``: 4 chains of 300 + 400,
its pointwise elpd_loo, the noise scale's mean and Monte Carlo error, its gradient
evaluations counted from its trees) comes from that benchmark.

Checks (SGHMC, the kernel whose minibatched runs the issue found far too hot):

* the minibatched run's elpd_loo is within 2 standard errors of the same kernel's full-batch
  elpd_loo, plus the full-batch run's discretisation bias. The standard error joins the
  pointwise one that ``arviz.compare`` gives (``sqrt(n var(d_i))``) and each run's Monte Carlo
  error (the spread of its 4 chains' own elpd_loo over ``sqrt(4)``); 2 of them is the issue's
  criterion, a false alarm about 5% of the time for samplers that are both exactly right (the
  seed is 0, not one chosen to pass). The bias: the adapted full-batch step sits at a fraction
  ``f = 0.2`` of the stability limit, where the stationary law's variance along a direction of
  curvature ``lambda`` is ``1 + delta`` times the posterior's with ``delta <= f / (1 - f) =
  1/4``; for a Gaussian posterior the expected log-likelihood then drops by
  ``sum_i delta_i s_i / 2 <= delta p / 2``, ``s_i`` the share of direction ``i``'s precision
  that the data give and ``p = sum_i s_i`` the effective number of parameters (``p_loo``). So
  the allowance is ``p_loo / 8`` nats (the minibatched run, at a far smaller step and 5%
  excess temperature, is biased the same way and less);
* each run's noise-scale mean is within ``Z`` joint Monte Carlo standard errors of NUTS's
  (ArviZ's ``mcse`` of both), plus a discretisation allowance of 0.1 posterior sd (the noise
  scale's posterior sd is ``~0.015``; its mean moves by far less than its sd under the
  variance inflation above);
* minibatched, the run spends fewer full-data gradient evaluations than NUTS did (a minibatch
  gradient counts ``B / N``) with a noise-scale bulk ESS of at least 10% of the draws.

With the noise-aware warmup reverted (no minibatch noise measured: the step from the
curvature alone, SGHMC at friction 1 with no correction) the minibatched SGHMC run fails:
elpd_loo 90 nats below the full batch, noise scale 0.375 against NUTS's 0.260. SGLD is not
run here: at its curvature-only step on this model the excess is small (reverted: noise scale
0.265, elpd_loo 2.5 nats below the full batch, both within these tolerances), so a check of
it here could not fail with its fix reverted; ``test_gradient_noise.py``'s exact law is the one
that does (2.1 times too wide), and ``benchmarks/minibatch_noise.py`` reports SGLD's BNN runs.
"""

import importlib.util
import json
import math
from pathlib import Path

import arviz as az
import numpy as np
import pyro
import pytest
import torch
from harness import Z
from pyro.infer import MCMC

from pyro_flat.draws.export import to_arviz
from pyro_flat.infer import SGHMC

REFERENCE = json.loads((Path(__file__).parent / "data" / "nuts_small_bnn.json").read_text())
CHAINS, WARMUP, DRAWS, BATCH = 4, 300, 400, 20
#: The adapted step's largest variance inflation, f / (1 - f) at f = 0.2.
DISCRETISATION = 0.2 / (1 - 0.2)
#: The noise scale's posterior sd (NUTS) times the discretisation allowance of 0.1 sd.
NOISE_BIAS = 0.1 * 0.015


def _benchmark():
    """The benchmark whose NUTS reference this test reads: its model and data are the ones the
    reference was computed on (one definition, not a copy that could drift from it)."""
    path = Path(__file__).parents[3] / "benchmarks" / "minibatch_noise.py"
    spec = importlib.util.spec_from_file_location("minibatch_noise", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCHMARK = _benchmark()
SmallBNN, data = BENCHMARK.SmallBNN, BENCHMARK.small_data


def run(kernel_class, batch):
    x, y = data()
    pyro.set_rng_seed(0)
    torch.manual_seed(0)
    model = SmallBNN()
    kernel = kernel_class(model, subsample_size=batch, num_steps_per_sample="auto",
                          vectorized_chains=CHAINS)
    mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=WARMUP, disable_progbar=True)
    mcmc.run(x, y)
    torch.manual_seed(0)
    idata = to_arviz(mcmc, model=SmallBNN(), model_args=(x, y))
    sigma = np.asarray(idata.posterior["sigma"])
    loo = az.loo(idata, pointwise=True)
    per_chain = [float(az.loo(idata.sel(chain=[c])).elpd_loo) for c in range(CHAINS)]
    gradients = CHAINS * kernel.diagnostics()["num_sg_steps"] * (batch or len(y)) / len(y)
    return {"loo_i": np.asarray(loo.loo_i).ravel(), "p_loo": float(loo.p_loo),
            "elpd_mcse": float(np.std(per_chain, ddof=1)) / math.sqrt(CHAINS),
            "mean": float(sigma.mean()),
            "mcse": float(az.mcse(sigma, method="mean")),
            "ess_share": float(az.ess(sigma, method="bulk")) / sigma.size,
            "gradients": gradients}


@pytest.mark.slow
@pytest.mark.parametrize("kernel_class", [SGHMC], ids=["SGHMC"])
def test_user_bnn_minibatched_matches_full_batch_and_nuts(kernel_class):
    """The three checks of the module's text (one test, so that the two runs are made once,
    on one worker)."""
    full, mini = run(kernel_class, None), run(kernel_class, BATCH)
    d = mini["loo_i"] - full["loo_i"]
    se = math.sqrt(len(d) * d.var() + full["elpd_mcse"] ** 2 + mini["elpd_mcse"] ** 2)
    bias = full["p_loo"] * DISCRETISATION / 2
    assert abs(d.sum()) <= 2 * se + bias, (
        f"elpd_loo minibatched - full batch {d.sum():+.2f} (se {se:.2f}, bias {bias:.2f})")
    for name, r in (("full batch", full), ("minibatched", mini)):
        tol = Z * math.hypot(r["mcse"], REFERENCE["noise_mcse"]) + NOISE_BIAS
        assert abs(r["mean"] - REFERENCE["noise_mean"]) <= tol, (
            f"{name}: noise scale {r['mean']:.4f} vs NUTS {REFERENCE['noise_mean']:.4f} "
            f"(tolerance {tol:.4f})")
    assert mini["gradients"] <= REFERENCE["gradients"], (mini["gradients"],
                                                         REFERENCE["gradients"])
    assert mini["ess_share"] >= 0.10, mini["ess_share"]
