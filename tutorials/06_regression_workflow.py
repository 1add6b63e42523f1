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
# # Regression BNNs: the whole workflow
#
# A 1-D regression with a gap in the data, a small tanh network with a **learned** noise scale,
# written in one line with `pyro_flat.models.bnn.BNN`. We sample it with NUTS (the reference on a
# network this small), with SGLD and EntropyMCMC whose step sizes warmup chooses, and fit it by
# SVI; then we read everything in ArviZ (`summary`, `plot_trace`, `loo`, `compare`,
# `plot_ppc`) and draw the predictive band.
#
# Run it as a script (`python tutorials/06_regression_workflow.py`) or open it as a notebook
# with jupytext. `PYRO_FLAT_QUICK=1` makes it run in seconds (CI does this).

# %%
import os

import arviz as az
import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import MCMC, NUTS, SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_flat
from pyro_flat.evaluation import regression
from pyro_flat.evaluation.predictive import guide_draws
from pyro_flat.infer import SGLD, EntropyMCMC
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HomoskedasticGaussian
from pyro_flat.plots import predictive_band

QUICK = os.environ.get("PYRO_FLAT_QUICK") == "1"
DRAWS, WARMUP, SVI_STEPS = (20, 20, 50) if QUICK else (400, 400, 3000)
torch.set_num_threads(1)
pyro.set_rng_seed(0)

# %% [markdown]
# ## Data and the model in one line
#
# `y = sin(3x) + 0.15 e` on two intervals, with a gap in between where a good posterior
# should widen. `BNN(net, likelihood)` puts a `Normal(0, 1)` prior on every weight and bias
# and builds the Pyro model: the data plate, the network run on the minibatch outside it, the
# observations inside. `HomoskedasticGaussian()` learns the noise scale as the site
# `obs_scale` (`HalfNormal(1)` prior).

# %%
g = torch.Generator().manual_seed(0)
x = torch.cat([torch.rand(60, generator=g) * 1.5 - 2.0, torch.rand(60, generator=g) * 1.5 + 0.5])
y = torch.sin(3 * x) + 0.15 * torch.randn(120, generator=g)
x = x.unsqueeze(1)
x_grid = torch.linspace(-2.5, 2.5, 200).unsqueeze(1)


def make_model(subsample_size=None):
    net = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return BNN(net, HomoskedasticGaussian(), prior_scale=1.0, subsample_size=subsample_size)


print(make_model())

# %% [markdown]
# ## NUTS: the reference
#
# The network has 49 weights and the data 120 points: NUTS is affordable and is what the SG
# samplers should match.

# %%
nuts_model = make_model()
nuts = MCMC(NUTS(nuts_model, max_tree_depth=8), num_samples=DRAWS, warmup_steps=WARMUP,
            disable_progbar=True)
nuts.run(x, y)
idata = {"NUTS": pyro_flat.to_arviz(nuts)}

# %% [markdown]
# ## SGLD and EntropyMCMC without a step size
#
# Leave `step_size` out and warmup chooses it: at the start and after 1/4, 1/2 and 3/4 of
# warmup it estimates the largest curvature of the minibatch potential (power iteration on
# Hessian-vector products) and takes a fifth of the step at which the update would turn
# unstable. `preconditioner="diag"` also learns a diagonal metric from the gradients of
# warmup, frozen at its end, so that the sampler afterwards is exact for that metric. The
# chosen values are in `diagnostics()`.

# %%
sg_runs = {}
for name, kernel in {
    "SGLD": SGLD(make_model(subsample_size=40), preconditioner="diag", num_steps_per_sample=20),
    "EntropyMCMC": EntropyMCMC(make_model(subsample_size=40), eta=0.1, num_steps_per_sample=20),
}.items():
    mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=WARMUP, disable_progbar=True)
    mcmc.run(x, y)
    chosen = mcmc.diagnostics()["step_size_adaptation"]["chain 0"][-1]["step_size"]
    print(f"{name}: warmup chose step_size = {chosen:.3g}")
    # the log-likelihood of every point (not just a minibatch) for loo: the full-batch model
    idata[name] = pyro_flat.to_arviz(mcmc, model=make_model(), model_args=(x, y))
    sg_runs[name] = mcmc

# %% [markdown]
# ## SVI
#
# A mean-field Normal guide, then draws from it exported like MCMC draws (one chain).

# %%
pyro.clear_param_store()
svi_model = make_model(subsample_size=40)
guide = AutoNormal(svi_model)
svi = SVI(svi_model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
for _ in range(SVI_STEPS):
    svi.step(x, y)
svi_draws = guide_draws(guide, DRAWS, x, y)
idata["SVI"] = pyro_flat.to_arviz(svi_draws, model=make_model(), model_args=(x, y))

# %% [markdown]
# ## ArviZ: summary, trace, loo, compare
#
# The noise scale is the one latent every method must agree on (the data's 0.15). `r_hat`
# needs several chains; with one chain read `ess_bulk`: a few per cent of the draws means the
# chain is still correlated at that thinning.

# %%
for name, data in idata.items():
    print(name)
    print(az.summary(data, var_names=["obs_scale"], kind="all"))
az.plot_trace(idata["SGLD"], var_names=["obs_scale"])
print(az.compare(idata))

# %% [markdown]
# **Pareto k.** `az.loo` approximates leave-one-out by importance sampling each point's
# left-out posterior from the full one, smoothed by a Pareto fit; its shape `k` says whether
# that worked. `k < 0.7` (ArviZ's threshold for these draw counts): fine. Above: that point's
# term is unreliable, usually because it is influential (an outlier, or a point that pins a
# wiggle of the network). What to do: more draws (the threshold rises with the draws), a
# likelihood with heavier tails (a Student-t), or exact leave-one-out refits (K-fold CV) for
# those points; do not trust `compare`'s ranking while many points are above it.

# %%
for name, data in idata.items():
    loo = az.loo(data, pointwise=True)
    bad = int((loo.pareto_k > 0.7).sum())
    print(f"{name}: elpd_loo {float(loo.elpd_loo):.1f}, {bad} of {len(y)} points with k > 0.7")

# %% [markdown]
# ## Posterior predictive checks and the predictive band
#
# `to_arviz` exported a replicate of `y` per draw (`posterior_predictive`) and the data
# (`observed_data`), which is what `az.plot_ppc` needs. For the band over the input, run the
# model on a grid with Pyro's `Predictive`; `pyro_flat.evaluation.regression` turns the draws into a
# mean, a standard deviation and an interval, and scores them.

# %%
az.plot_ppc(idata["SGLD"], num_pp_samples=min(50, DRAWS))
fig, axes = plt.subplots(1, 3, figsize=(13, 3.5), sharey=True)
for ax, name in zip(axes, ["NUTS", "SGLD", "SVI"], strict=True):
    samples = nuts.get_samples() if name == "NUTS" else (
        sg_runs["SGLD"].get_samples() if name == "SGLD" else svi_draws)
    grid_draws = Predictive(make_model(), posterior_samples=samples)(x_grid)["obs"]
    summary = regression.predictive_summary(grid_draws, level=0.9)
    predictive_band(x_grid.squeeze(1), summary, x_obs=x.squeeze(1), y_obs=y, ax=ax, label=name)
    train_draws = Predictive(make_model(), posterior_samples=samples)(x)["obs"]
    fit = regression.predictive_summary(train_draws, level=0.9)
    print(f"{name}: RMSE {regression.rmse(fit.mean, y):.3f}, CRPS "
          f"{regression.crps(train_draws, y):.3f}, 90% coverage "
          f"{regression.interval_coverage(fit.lower, fit.upper, y):.2f}")
    ax.set_title(name)
fig.tight_layout()
fig.savefig(os.environ.get("PYRO_FLAT_FIGURE", "regression_workflow.png"))

# %% [markdown]
# The band should widen in the gap (x between -0.5 and 0.5) and beyond the data: that is the
# model knowing what it doesn't know. The coverage on the training points should sit near 0.9.
