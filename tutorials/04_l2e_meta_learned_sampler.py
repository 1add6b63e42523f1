# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Learning to Explore: using and meta-training L2E
#
# L2E (Kim et al. 2024) is a momentum SG-MCMC sampler whose kinetic-energy gradients come from
# a small network (9 → 32 → 32 → 2) shared by every parameter of the BNN. pyro_flat ships
# meta-parameters that this project trained itself (`benchmarks/l2e_meta_train.py`, its log in
# `benchmarks/results/`), so `L2E(model)` works out of the box. This tutorial
#
# 1. samples a Bayesian MLP on scikit-learn's digits with L2E, SGLD and cyclical SGLD at an
#    equal number of gradient evaluations and compares their Bayesian model averages;
# 2. runs a few outer steps of L2E's meta-training (antithetic evolution strategies) on a
#    small task, the same machinery that produced the shipped meta-parameters.
#
# Run it as a script (`python tutorials/04_l2e_meta_learned_sampler.py`) or as a notebook with
# jupytext. `PYRO_FLAT_QUICK=1` makes it run in seconds (CI does this).

# %%
import os

import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import MCMC

from pyro_flat.datasets import load_dataset
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import L2E, SGLD, CyclicalSGLD
from pyro_flat.infer.mcmc.l2e.training import MetaTrainConfig, MetaTrainer, make_task
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical

QUICK = os.environ.get("PYRO_FLAT_QUICK") == "1"
STEPS, DRAWS = (400, 8) if QUICK else (6000, 20)
OUTER_STEPS, INNER_STEPS = (3, 60) if QUICK else (30, 400)
torch.set_num_threads(1)

# %% [markdown]
# ## A Bayesian MLP on digits
#
# The model is tutorial 01's one line, `BNN(net, Categorical(), subsample_size=128)`: Pyro's
# subsampling idiom, with the observations scaled by N / B. L2E reads the dataset size N from
# the plate: its default step size is the authors' `sqrt(step_mult / N)`.

# %%
data = load_dataset("digits")


def make_model():
    net = torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    return BNN(net, Categorical(), prior_scale=3.0, scale_rule="fan_in", subsample_size=128)


# %% [markdown]
# ## Three samplers at an equal gradient budget
#
# Each spends `STEPS` minibatch gradients and keeps `DRAWS` draws: SGLD and L2E thin evenly
# over the second half; cyclical SGLD keeps the end of each of its cosine cycles. SGLD's step
# is an SGD learning rate of 0.2 on the mean loss (`step_size = lr / N`).

# %%
n, lr = data.num_train, 0.2
thin = STEPS // 2 // DRAWS
cycle = STEPS // (2 * DRAWS)


def kernel_for(name, model):
    if name == "L2E":
        return L2E(model, num_steps_per_sample=thin)  # the shipped meta-parameters
    if name == "SGLD":
        return SGLD(model, step_size=lr / n, num_steps_per_sample=thin)
    return CyclicalSGLD(model, step_size=2 * lr / n, cycle_length=cycle)


scores = {}
for name in ("L2E", "SGLD", "cyclical SGLD"):
    pyro.set_rng_seed(0)
    model = make_model()
    kernel = kernel_for(name, model)
    mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=DRAWS, disable_progbar=QUICK)
    mcmc.run(data.x_train, data.y_train)
    probs = bma_probs(model.net, mcmc.get_samples(), data.x_test)
    scores[name] = {"accuracy": classification.accuracy(probs, data.y_test),
                    "NLL": classification.nll(probs, data.y_test),
                    "ECE": classification.ece(probs, data.y_test),
                    "gradients": kernel.num_steps}
    print(f"{name:14s}", "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in scores[name].items()))

# %% [markdown]
# With `warmup_steps=DRAWS`, every sampler runs `2 * DRAWS` calls of `sample`: SGLD and L2E
# take `thin` SG steps per call, cyclical SGLD one cosine cycle of `STEPS / (2 DRAWS)` steps,
# so the budgets match (the `gradients` column).
#
# ## Meta-training
#
# The meta-loss of the meta-parameters φ on a task is the negative log-likelihood, on the
# task's held-out data, of the model average of snapshots taken at the end of an inner L2E run
# from a fresh initialisation. Its gradient is estimated by antithetic evolution strategies:
# the inner run at φ + σε and at φ − σε share the task, the initialisation, the minibatches
# and the noise. Adam with gradient-norm clipping takes the outer step. `MetaTrainer.run`
# checkpoints (and resumes) a long run; here a few outer steps on one small task.

# %%
task = make_task("digits", "mlp", 16, 1, seed=0)
config = MetaTrainConfig(outer_steps=OUTER_STEPS, inner_steps=INNER_STEPS,
                         num_snapshots=5, snapshot_every=INNER_STEPS // 10, seed=0)
trainer = MetaTrainer(config, task_sampler=lambda generator: task, log=None)
history = [trainer.step()["loss"] for _ in range(OUTER_STEPS)]
print("meta-loss per outer step:", [round(v, 3) for v in history])

# %% [markdown]
# The shipped meta-parameters come from `python benchmarks/l2e_meta_train.py` (a task
# distribution of MLPs and CNNs of several widths and depths on MNIST-1D, digits and a
# synthetic regression); `trainer.net` is a `MetaNet` that `L2E(model, meta_params=...)`
# accepts, as does an `.npz` file in this project's layout or the authors' haiku layout.
#
# ## A picture

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
names = list(scores)
ax1.bar(names, [scores[k]["NLL"] for k in names], color=["C0", "C1", "C2"])
ax1.set_ylabel("test NLL of the model average")
ax1.set_title(f"digits, {STEPS} gradients each")
ax2.plot(range(1, len(history) + 1), history, marker="o")
ax2.set_xlabel("outer step")
ax2.set_ylabel("meta-loss (BMA NLL)")
ax2.set_title("meta-training")
fig.tight_layout()
fig.savefig(os.environ.get("PYRO_FLAT_FIGURE", "l2e.png"))
