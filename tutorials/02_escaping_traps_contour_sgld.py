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
# # Escaping local traps with ContourSGLD, and reweighting
#
# SGLD follows the gradient of the energy plus a little noise: it settles in one mode and, when
# the barrier to the next mode is many nats high, it stays there for the whole run. Contour SGLD
# (Deng, Lin & Liang 2020) learns the distribution of the energy as it samples and divides the
# target by it: the barriers of the *flattened* target are low, the chain walks between modes,
# and importance weights take its draws back to the original target.
#
# We take a 1-D double well whose barrier is 17 nats high, run 8 chains of SGLD and 8 of
# ContourSGLD through Pyro's own `MCMC` for the same number of gradient evaluations, reweight
# the ContourSGLD draws, and look at the energy PDF it learned.
#
# Run it as a script (`python tutorials/02_escaping_traps_contour_sgld.py`) or open it as a
# notebook with jupytext. `PYRO_FLAT_QUICK=1` makes it run in seconds (CI does this).

# %%
import math
import os

import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import MCMC

from pyro_flat.infer import SGLD, ContourSGLD, reweight
from pyro_flat.plots import energy_pdf

QUICK = os.environ.get("PYRO_FLAT_QUICK") == "1"
STEPS = 10_000 if QUICK else 100_000  # gradient evaluations of each chain
CHAINS = 8
torch.set_num_threads(1)

# %% [markdown]
# ## A target with a trap
#
# Two equal Gaussian modes at ±3 of standard deviation 0.5; the energy
# $U(x) = -\log(\tfrac12 \mathcal N(x; -3, 0.5^2) + \tfrac12 \mathcal N(x; 3, 0.5^2))$ is
# about 17 nats higher at the barrier $x = 0$ than at the modes. We pass the energy directly
# as a `potential_fn` (a Pyro model would do as well) and add a little gradient noise, as a
# minibatch would. The site `x` holds one value per chain and the potential returns one
# energy per chain: `ContourSGLD(..., vectorized_chains=8)` runs 8 independent chains in one
# kernel, each with its own learned `g` (SGLD, whose chains share nothing, takes the sum).


# %%
def energy(x: torch.Tensor) -> torch.Tensor:
    a = -((x + 3) ** 2) / (2 * 0.25)
    b = -((x - 3) ** 2) / (2 * 0.25)
    return -(torch.logaddexp(a, b) - math.log(2) - 0.5 * math.log(2 * math.pi * 0.25))


def potential(params):
    x = params["x"]  # (chains,)
    noise = 0.5 * torch.randn(x.shape, dtype=x.dtype)  # N(0, 0.5^2) on the gradient only
    return energy(x) + noise * (x - x.detach())


grid = torch.linspace(-6, 6, 4001, dtype=torch.float64)
u_grid = energy(grid)
print(f"energy at the modes {float(u_grid.min()):.2f}, at the barrier "
      f"{float(energy(torch.tensor(0.0))):.2f}")

# %% [markdown]
# ## SGLD: trapped
#
# SGLD with step size 1e-2 from the left mode. The draws are thinned: 10 SG steps per draw.

# %%
start = {"x": torch.full((CHAINS,), -3.0, dtype=torch.float64)}
pyro.set_rng_seed(0)
sgld = SGLD(potential_fn=lambda p: potential(p).sum(), initial_params=start, step_size=1e-2,
            num_steps_per_sample=10)
mcmc_sgld = MCMC(sgld, num_samples=STEPS // 10, warmup_steps=0, disable_progbar=True)
mcmc_sgld.run()
x_sgld = mcmc_sgld.get_samples()["x"]  # (draws, chains)
print(f"SGLD: fraction of draws in the right mode {float((x_sgld > 0).double().mean()):.3f}")

# %% [markdown]
# ## ContourSGLD: the energy is cut into bins and the chain learns how much mass each holds
#
# The bins must bracket every energy on the way from one mode to the other, up to the barrier:
# here 24 bins of width 1 from 0 (the last bin also takes every energy above 24). The kernel
# learns `g`, a distribution over the bins, by stochastic approximation, and moves with the
# gradient multiplied by $1 + \zeta T\, \Delta\log g / \Delta u$: negative where the
# chain sits in a bin that `g` says is over-visited, which pushes it uphill, out of the trap.
# Each draw gets the importance weight $e^{\zeta\Phi(u)}$ at its energy $u$, where $\Phi$
# is the piecewise-linear $\log g$ whose slopes are the multiplier's (the per-draw statistic
# `log_weight`): it undoes exactly the flattening the moves apply.
#
# With `sa_power=1` (BlackJAX's gain) the fixed point is $g^\zeta \propto$ the mass of each
# bin under the target: the flattened target is flat in energy, and `g` only has to learn
# 17/10 nats with `zeta=10` (the paper's gain, the default, makes `g` learn all 17: fine on
# a long run, slow on a short one). `multiplier_clip` bounds the multiplier (the author's later
# code uses ±5) and `bounds` rejects moves that would leave $[-8, 8]$, where the target has
# no mass to speak of, so that an uphill push in the open-ended top bin cannot run away.
# For a BNN, whose energy is of order N times the loss, let the kernel place the bins from the
# warmup energies with `auto_bins=True`.

# %%
pyro.set_rng_seed(0)
csgld = ContourSGLD(potential_fn=potential, initial_params=start, step_size=1e-2,
                    num_bins=24, min_energy=0.0, bin_width=1.0, zeta=10.0, sa_power=1.0,
                    multiplier_clip=(-5.0, 5.0), bounds=(-8.0, 8.0), num_steps_per_sample=10,
                    vectorized_chains=CHAINS)
mcmc_csgld = MCMC(csgld, num_samples=STEPS // 10, warmup_steps=STEPS // 50,
                  disable_progbar=True)
mcmc_csgld.run()
x_csgld = mcmc_csgld.get_samples()["x"]
diagnostics = csgld.diagnostics()
log_weight = diagnostics["sample_stats"]["log_weight"]
right = (x_csgld > 0).double()
per_chain = torch.stack([reweight(right[:, c], log_weight[:, c]) for c in range(CHAINS)])
print(f"ContourSGLD: fraction of draws in the right mode {float(right.mean()):.3f} "
      "(the flattened target)")
print("reweighted mass of the right mode, chain by chain:",
      [round(float(p), 2) for p in per_chain])
print(f"averaged over the chains: {float(reweight(right, log_weight, chain_dim=1)):.3f} "
      f"± {float(per_chain.std() / CHAINS**0.5):.3f} (truth 0.5)")

# %% [markdown]
# ## Reweighting
#
# Estimates under the original target are weighted averages with the normalised weights
# `softmax(log_weight)`, or plain averages over draws resampled in proportion to their weights
# (`method="resample"`: systematic resampling, unbiased). A chain's weights `g^zeta` only
# compare with that chain's own draws, so `chain_dim=1` self-normalises each chain and gives
# every chain the same mass. A single chain's estimate is rough (each chain above crosses the
# barrier many times, but the weights concentrate on its visits to the bottom energy bins);
# the spread over the chains gives the standard error. Here the resampled draws of all chains
# against the target density, computed on a grid.

# %%
resampled = reweight(x_csgld, log_weight, "resample", chain_dim=1,
                     generator=torch.Generator().manual_seed(0))
density = torch.exp(-u_grid)
density /= density.sum() * (grid[1] - grid[0])

fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
axes[0].plot(x_sgld[:, 0].numpy(), lw=0.5, label="SGLD")
axes[0].plot(x_csgld[:, 0].numpy(), lw=0.5, alpha=0.7, label="ContourSGLD")
axes[0].set(xlabel="draw", ylabel="x", title="one chain of each")
axes[0].legend()
axes[1].plot(grid.numpy(), density.numpy(), color="black", label="target")
axes[1].hist(x_sgld.reshape(-1).numpy(), bins=120, range=(-6, 6), density=True, alpha=0.4,
             label="SGLD")
axes[1].hist(resampled.numpy(), bins=120, range=(-6, 6), density=True, alpha=0.4,
             label="ContourSGLD, resampled")
axes[1].set(xlabel="x", title="draws against the target")
axes[1].legend()
energy_pdf(diagnostics, ax=axes[2])
axes[2].set_title("learned energy PDF")
fig.tight_layout()

# %% [markdown]
# The right panel is `pyro_flat.plots.energy_pdf`: the learned $g$ (averaged over the chains,
# as a density over the energy bins) against the histogram of the energies the chains visited.
# With `sa_power=1`, $g^\zeta$, not $g$, is proportional to the mass of each bin under
# the target, so $g$ is much flatter than the energy distribution of the target. The
# chains' energies spread evenly up to the barrier: that is the flattening at work. Bins the
# chains never visit keep their initial value, which would be a sign that the bins do not
# bracket the energies.

# %%
figure = os.environ.get("PYRO_FLAT_FIGURE")
if figure:
    fig.savefig(figure, dpi=80)
else:
    plt.show()
