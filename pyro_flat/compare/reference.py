r"""``pyro-flat compare --reference hmc``: an HMC reference and each method's distance to it.

Target: the exact posterior predictive :math:`p(y \mid x, \mathcal D)` of the compared
network, as Izmailov et al. (2021) and the NeurIPS 2021 approximate-inference competition
(Wilson et al. 2022) use it: how close is each method to the Bayesian answer?

On each seed, after the methods, multi-chain NUTS
(:func:`pyro_flat.evaluation.hmc_reference.hmc_reference`) samples the same model, with the whole
training set in every step (``BNN(..., subsample_size=None)``): :data:`NUM_CHAINS` chains of
:data:`WARMUP_STEPS` adaptation steps and :data:`NUM_SAMPLES` draws, trees of depth at most
:data:`MAX_TREE_DEPTH`, step sizes adapted to an acceptance rate of :data:`TARGET_ACCEPT_PROB`, each
chain from its own seed and a draw from the prior. Only a network small enough for full-batch NUTS
is practical (``--hidden 16`` on digits or diabetes on 2 cores: minutes per seed).

The reference runs as one more job beside the methods, at the default settings (never
tuned). Each method is then scored against the reference predictive on the test inputs:

* classification: ``agreement``, the share of test points whose most probable class is the
  reference's (:func:`pyro_flat.evaluation.classification.agreement`; higher is better), and ``tv``,
  the mean total variation between the two predictive distributions
  (:func:`pyro_flat.evaluation.classification.total_variation`; lower is better);
* regression: ``w2``, the mean over test points of the 2-Wasserstein distance between the
  method's predictive draws and the reference's (:data:`PREDICTIVE_DRAWS` of each: a
  component of the Gaussian mixture drawn by its weight, then its observation noise)
  (:func:`pyro_flat.evaluation.regression.wasserstein2`; lower is better).

The reference itself is a row of the table (``hmc``), scored like the methods against the
test labels, with its diagnostics in ``results.json``: the worst rank-normalised split R-hat
over the weights (which symmetric hidden units make large whenever chains sit in different,
equivalent modes) and over the *function*, the per-draw predictions on the test inputs (the
log-likelihood of each test label, or the predictive mean), which is what the scores compare
(Izmailov et al. 2021, section 4), the bulk ESS and the divergent transitions. A reference whose
function-space R-hat exceeds :data:`MAX_RHAT` at some test point, or that had a divergent
transition, is flagged (``converged: false`` with the reasons; the weights' R-hat is reported,
not checked: equivalent modes inflate it however well the predictions agree), and ``compare``
says so under its table: scores against an unconverged reference measure distance to whatever the
chains found, not to the posterior.

References
----------
Izmailov, P., Vikram, S., Hoffman, M. D. & Wilson, A. G. (2021). What are Bayesian neural
network posteriors really like? ICML. Wilson, A. G., Izmailov, P., Hoffman, M. D., et al.
(2022). Evaluating approximate inference in Bayesian deep learning. NeurIPS 2021 Competitions
and Demonstrations Track, PMLR 176.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from pyro_flat.compare.common import Context, Fit, Method

#: NUTS chains.
NUM_CHAINS = 4
#: NUTS adaptation steps per chain (step size and diagonal mass matrix).
WARMUP_STEPS = 300
#: The acceptance rate NUTS adapts its step size to: above Pyro's 0.8, whose larger steps
#: diverged on the heteroscedastic regression network.
TARGET_ACCEPT_PROB = 0.9
#: NUTS draws kept per chain.
NUM_SAMPLES = 200
#: The largest NUTS tree depth: at most ``2**6 = 64`` leapfrog steps per draw.
MAX_TREE_DEPTH = 6
#: The largest acceptable function-space R-hat (Vehtari et al. 2021).
MAX_RHAT = 1.01
#: Predictive draws of ``y`` per test point for a method's regression score.
PREDICTIVE_DRAWS = 1000
#: ``--reference`` choices.
REFERENCES = ("none", "hmc")
#: What the score columns are (``results.json``).
SCORES = (
    "against the NUTS reference predictive on the test inputs: agreement (share of points "
    "whose most probable class is the reference's; higher is better) and tv (mean total "
    "variation distance; lower is better) for classification; w2 (mean over points of the "
    f"2-Wasserstein distance between {PREDICTIVE_DRAWS} predictive draws of each; lower is "
    "better) for regression"
)
#: The score columns, by task.
CLASSIFICATION_SCORES = ("agreement", "tv")
REGRESSION_SCORES = ("w2",)


def score_names(task: str) -> tuple[str, ...]:
    """The columns the reference adds for ``task``."""
    return CLASSIFICATION_SCORES if task == "classification" else REGRESSION_SCORES


def full_batch_model(ctx: Context) -> Any:
    """``ctx``'s Bayesian network and likelihood with all data in every run (NUTS's model)."""
    from pyro_flat.models.bnn import BNN

    model = ctx.bnn()
    return BNN(model.net, model.likelihood, subsample_size=None)


def per_draw_predictions(model: Any, samples: dict[str, torch.Tensor], x: torch.Tensor,
                         y: torch.Tensor) -> torch.Tensor:
    """``(S, N)`` function-space summaries of each draw on ``(x, y)``: the log-likelihood of
    each label (classification) or the predictive mean (regression)."""
    from pyro_flat.evaluation.predictive import draw_outputs

    outputs = draw_outputs(model.net, samples, x)  # (S, N, ...)
    d = model.likelihood.distribution(outputs.flatten(0, 1), {})
    values = d.log_prob(y.repeat(len(outputs))) if y.dtype == torch.int64 else d.mean
    return values.reshape(len(outputs), -1)


def run_hmc(method: str, ctx: Context) -> Fit:
    """The reference as a runner of ``compare``: NUTS on the full-batch model of ``ctx``
    (chains seeded from ``ctx.seed``); its draws, and its diagnostics as the fit's notes."""
    import pyro

    from pyro_flat.diagnostics import split_rhat
    from pyro_flat.evaluation.hmc_reference import hmc_reference

    data = ctx.data
    pyro.clear_param_store()
    pyro.set_rng_seed(ctx.seed)
    model = full_batch_model(ctx)
    start = time.perf_counter()
    ref = hmc_reference(model, data.x_train, data.y_train, num_chains=NUM_CHAINS,
                        num_samples=NUM_SAMPLES, warmup_steps=WARMUP_STEPS, seed=ctx.seed,
                        on_failure="ignore", max_tree_depth=MAX_TREE_DEPTH,
                        target_accept_prob=TARGET_ACCEPT_PROB, jit_compile=True,
                        ignore_jit_warnings=True)
    seconds = time.perf_counter() - start
    samples = ref.samples
    function = per_draw_predictions(model, samples, data.x_test, data.y_test)
    function_rhat = split_rhat(function.reshape(NUM_CHAINS, NUM_SAMPLES, -1))
    worst = float(function_rhat.nan_to_num(float("inf")).max())  # a nan R-hat counts as failed
    notes = {
        "chains": NUM_CHAINS, "warmup_steps": WARMUP_STEPS, "draws_per_chain": NUM_SAMPLES,
        "max_tree_depth": MAX_TREE_DEPTH, "target_accept_prob": TARGET_ACCEPT_PROB,
        "start": "a prior draw per chain", "nuts_seconds": round(seconds, 1),
        "max_rhat_weights": ref.max_rhat, "min_ess_bulk_weights": ref.min_ess_bulk,
        "max_rhat_function": worst,
        "median_rhat_function": float(function_rhat.nanmedian()),
        "divergences": ref.divergences, "chain_seeds": ref.chain_seeds,
    }
    problems = []
    if not worst <= MAX_RHAT:
        problems.append(f"max function-space R-hat {worst:.3g} > {MAX_RHAT}")
    if sum(ref.divergences):
        problems.append(f"divergent transitions per chain {ref.divergences}")
    notes.update(converged=not problems, problems=problems)
    # NUTS's gradient count per iteration is not exposed: the table shows its wall time
    return Fit(model.net, samples, 0, notes=notes)


def scores(ev: Any, reference: Any, task: str, seed: int) -> dict[str, float]:
    """A method's distance to the reference, from the two evaluations
    (:class:`~pyro_flat.compare.evaluation.Evaluation`): agreement and TV of the test
    probabilities, or W2 between :data:`PREDICTIVE_DRAWS` draws of each test predictive."""
    from pyro_flat.evaluation import classification
    from pyro_flat.evaluation.regression import wasserstein2

    if task == "classification":
        return {"agreement": classification.agreement(ev.probs_test, reference.probs_test),
                "tv": classification.total_variation(ev.probs_test, reference.probs_test)}
    generator = torch.Generator().manual_seed(seed)
    draws = ev.test.sample(PREDICTIVE_DRAWS, generator)
    reference_draws = reference.test.sample(PREDICTIVE_DRAWS, generator)
    return {"w2": wasserstein2(draws, reference_draws)}


#: The reference as a runner of ``compare`` (``--reference hmc``; not one of the methods).
METHOD = Method("hmc", "the NUTS reference (pyro_flat.compare.reference)", run_hmc, cost=50.0)
