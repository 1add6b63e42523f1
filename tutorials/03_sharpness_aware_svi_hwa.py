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
# # Sharpness-aware SVI, then HWA
#
# We fit a mean-field Gaussian to a Bayesian MLP twice with Pyro's own `SVI`: once with
# `Trace_ELBO` (Bayes by Backprop, "SGVB") and once with `pyro_flat.infer.SharpnessAwareELBO`
# (F-SGVB of Nguyen et al. 2023), which takes each gradient at means moved one ascent step of
# length ρ up the loss. Only the loss changes: same guide, optimiser, minibatches and steps.
# Then we continue the sharpness-aware fit with HWA (`pyro_flat.infer.HWA`): a cyclical learning
# rate whose variational parameters are averaged once per cycle. We score each fit by the
# Bayesian model average on held-out digits and measure the sharpness of its draws.
#
# Run it as a script (`python tutorials/03_sharpness_aware_svi_hwa.py`) or open it as a notebook
# with jupytext. `PYRO_FLAT_QUICK=1` makes it run in seconds (CI does this).

# %%
import os

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_flat.datasets import load_dataset
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.flatness import sharpness
from pyro_flat.evaluation.predictive import bma_probs, guide_draws
from pyro_flat.infer import HWA, SharpnessAwareELBO
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import init_to_network

QUICK = os.environ.get("PYRO_FLAT_QUICK") == "1"
STEPS, HWA_CYCLES, CYCLE, DRAWS = (150, 3, 10, 8) if QUICK else (3000, 20, 50, 32)
torch.set_num_threads(1)

# %% [markdown]
# ## Data and model
#
# scikit-learn's 8×8 digits, a 64-100-10 MLP with a Normal(0, 3²/fan_in) prior on every weight,
# and a Categorical likelihood on minibatches of 128: `BNN(net, Categorical(), ...)`, the
# one-line model of tutorial 01.

# %%
data = load_dataset("digits")


def make_fit(loss):
    """A fresh network, guide and SVI at the same seed: only the loss differs."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    model = BNN(net, Categorical(), prior_scale=3.0, scale_rule="fan_in", subsample_size=128)
    guide = AutoNormal(model, init_loc_fn=init_to_network, init_scale=0.01)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 3e-3}), loss)
    return model.net, model, guide, svi


def score(name, net, guide):
    draws = guide_draws(guide, DRAWS, data.x_train, data.y_train)
    probs = bma_probs(net, draws, data.x_test)
    sharp = sharpness(net, draws, data.x_train[:500], data.y_train[:500], rho=0.05)
    row = {"accuracy": classification.accuracy(probs, data.y_test),
           "nll": classification.nll(probs, data.y_test),
           "ece": classification.ece(probs, data.y_test),
           "sharpness": float(sharp.mean())}
    print(f"{name:22s} " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()))
    return row


# %% [markdown]
# ## SGVB and F-SGVB
#
# `SharpnessAwareELBO(rho)` is a drop-in Pyro loss. Per step and particle it draws the guide's
# noise z once, takes the gradient g of the single-sample negative ELBO with respect to the
# means, moves them to μ' = μ + ρ g/‖g‖, replays the same z (and minibatch) there and
# accumulates that gradient into the parameters at μ; any `pyro.optim` optimiser steps. The
# scales take their gradient at μ' too. It costs about two `Trace_ELBO` steps.

# %%
results, curves, fits = {}, {}, {}
for name, loss in (("SGVB (Trace_ELBO)", Trace_ELBO()),
                   ("F-SGVB (rho = 0.05)", SharpnessAwareELBO(rho=0.05))):
    net, model, guide, svi = make_fit(loss)
    curves[name] = [svi.step(data.x_train, data.y_train) for _ in range(STEPS)]
    results[name] = score(name, net, guide)
    fits[name] = net, svi

# %% [markdown]
# ## HWA on the sharpness-aware fit
#
# HWA wraps the same `SVI` object (still with `SharpnessAwareELBO`): its learning rate falls
# from 3e-3 to 3e-4 over each cycle, and the parameters at the end of every cycle are averaged.
# The averaged guide predicts.

# %%
net, svi = fits["F-SGVB (rho = 0.05)"]
hwa = HWA(svi, lr_bounds=(3e-4, 3e-3), cycle_length=CYCLE)
name = "F-SGVB + HWA"
curves[name] = [hwa.step(data.x_train, data.y_train) for _ in range(HWA_CYCLES * CYCLE)]
results[name] = score(name, net, hwa.averaged_guide())
print(hwa.num_snapshots, "snapshots averaged")

# %% [markdown]
# ## A picture: training loss and the measured sharpness
#
# The loss is the ELBO estimate at the current means (what `svi.step` returns), smoothed over
# 50 steps. The sharpness is the rise of the mean training loss after an ascent step of length
# 0.05 (`pyro_flat.evaluation.flatness.sharpness`), averaged over the guide's draws.

# %%
import matplotlib.pyplot as plt  # noqa: E402

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
for name, curve in curves.items():
    start = STEPS if name.endswith("HWA") else 0  # HWA continues the F-SGVB fit
    c = torch.tensor(curve)
    k = min(50, len(c))
    smooth = torch.nn.functional.avg_pool1d(c[None, None], k, stride=1)[0, 0]
    ax1.plot(range(start + k - 1, start + len(c)), smooth, label=name)
ax1.set(xlabel="SVI step", ylabel="loss (negative ELBO)", yscale="log")
ax1.legend()
names = list(results)
ax2.bar(range(len(names)), [results[n]["sharpness"] for n in names])
ax2.set_xticks(range(len(names)), names, rotation=15)
ax2.set(ylabel="sharpness of the draws")
fig.tight_layout()
fig.savefig(os.environ.get("PYRO_FLAT_FIGURE", "sharpness_aware_svi_hwa.png"))
