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
# # A first BNN: EntropyMCMC, SGLD and ArviZ
#
# We write a Bayesian MLP as a Pyro model in one line (`pyro_flat.models.bnn.BNN`), sample its
# posterior with SGLD and with Entropy-MCMC through Pyro's own `MCMC` driver, export the draws
# to ArviZ, and score the Bayesian model average (BMA) on held-out digits and on
# out-of-distribution inputs.
#
# Run it as a script (`python tutorials/01_first_bnn_entropy_mcmc.py`) or open it as a notebook
# with jupytext. `PYRO_FLAT_QUICK=1` makes it run in seconds (CI does this).

# %%
import os

import arviz as az
import pyro
import torch
from pyro.infer import MCMC

import pyro_flat
from pyro_flat.datasets import load_dataset
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import SGLD, EntropyMCMC
from pyro_flat.infer.mcmc.entropy import select_draws
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical

QUICK = os.environ.get("PYRO_FLAT_QUICK") == "1"
STEPS_PER_DRAW, DRAWS, WARMUP = (4, 30, 10) if QUICK else (50, 40, 40)
torch.set_num_threads(1)
pyro.set_rng_seed(0)

# %% [markdown]
# ## Data and model
#
# scikit-learn's 8×8 digits ship with the package: no download. The OOD split holds inputs
# the network should be unsure about.

# %%
data = load_dataset("digits")
print(data.num_train, "training digits,", data.num_test, "test,", len(data.x_ood), "OOD")


def make_model():
    net = torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    # every weight and bias gets a Normal(0, 3^2 / fan_in) prior (a PyroModule with PyroSample),
    # the labels a Categorical likelihood, each model run a minibatch of 128 scaled by N / 128
    return BNN(net, Categorical(), prior_scale=3.0, scale_rule="fan_in", subsample_size=128)


print(make_model())

# %% [markdown]
# `BNN` is a plain Pyro model: its `forward(x, y)` is Pyro's subsampling idiom, which you
# would otherwise write by hand,
#
# ```python
# plate = pyro.plate("data", len(x), subsample_size=128)
# with plate as ind:       # draw the minibatch indices first
#     pass
# logits = net(x[ind])     # run the network outside the plate (its priors stay global)
# with plate:              # observe inside it: the log-likelihood is scaled by N / 128
#     pyro.sample("obs", dist.Categorical(logits=logits), obs=y[ind])
# ```
#
# and the network's sites are named after its parameters under `net.` (`net.0.weight`, ...).

# %% [markdown]
# ## Sampling
#
# Step sizes act on the summed potential `U`: an SGD learning rate `lr` on the mean loss is
# `lr / N`. Entropy-MCMC couples θ to a guiding copy θ_a with strength 1/η; the authors keep
# `step_size / eta = 0.025`.

# %%
lr, n = 0.2, data.num_train
runs = {}
for name in ("sgld", "entropy"):
    model = make_model()
    if name == "sgld":
        kernel = SGLD(model, step_size=lr / n, num_steps_per_sample=STEPS_PER_DRAW)
    else:
        kernel = EntropyMCMC(model, step_size=lr / n, eta=lr / n / 0.025,
                             num_steps_per_sample=STEPS_PER_DRAW)
    mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=WARMUP, disable_progbar=QUICK)
    mcmc.run(data.x_train, data.y_train)
    runs[name] = (model.net, mcmc)

# %% [markdown]
# ## ArviZ
#
# `pyro_flat.to_arviz` exports the draws, the kernel's per-draw statistics (`lp`, `grad_norm`,
# `diverging`, and for Entropy-MCMC `coupling_distance`) and, by default, the log-likelihood
# of every training point (which `az.loo` and `az.compare` need), a posterior-predictive
# replicate per draw and the observed labels (for `az.plot_ppc`).

# %%
net, mcmc = runs["entropy"]
idata = pyro_flat.to_arviz(mcmc)
print(idata)
print(az.summary(idata, var_names=["net.2.bias"], kind="stats"))
print("divergences:", int(idata.sample_stats["diverging"].sum()))
print(az.loo(idata))

# %% [markdown]
# ## Bayesian model average
#
# Entropy-MCMC's draws hold θ under the model's site names and θ_a under the same names with
# `"__guide"`; `select_draws` maps either back for prediction. The authors average both.

# %%
for name, (net, mcmc) in runs.items():
    samples = mcmc.get_samples()
    choices = ["theta"] if name == "sgld" else ["theta", "guide", "both"]
    for which in choices:
        draws = samples if name == "sgld" else select_draws(samples, which)
        probs = bma_probs(net, draws, data.x_test)
        probs_ood = bma_probs(net, draws, data.x_ood)
        auroc = classification.ood_auroc(classification.predictive_entropy(probs, reduction="none"),
                                  classification.predictive_entropy(probs_ood, reduction="none"))
        print(f"{name:8s} {which:6s} accuracy {classification.accuracy(probs, data.y_test):.3f}  "
              f"NLL {classification.nll(probs, data.y_test):.3f}  "
              f"ECE {classification.ece(probs, data.y_test):.3f}  OOD AUROC {auroc:.3f}")

# %% [markdown]
# ## A picture: calibration
#
# `pyro_flat.plots` draws on the Axes it is given (or on a new figure of its own) and returns
# the matplotlib figure.

# %%
import matplotlib.pyplot as plt  # noqa: E402

from pyro_flat import plots  # noqa: E402

net, mcmc = runs["entropy"]
probs = bma_probs(net, select_draws(mcmc.get_samples(), "both"), data.x_test)
fig, ax = plt.subplots(figsize=(4, 3.5), layout="constrained")
plots.reliability_diagram(probs, data.y_test, ax=ax, label="EntropyMCMC")
fig.savefig(os.environ.get("PYRO_FLAT_FIGURE", "reliability_entropy.png"))
