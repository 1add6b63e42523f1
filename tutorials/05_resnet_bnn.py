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
# # A torchvision ResNet as a Bayesian neural network
#
# Any `torch.nn.Module` becomes a Pyro model with `pyro_flat.models.nn.make_bayesian`: every weight
# gets a Gaussian prior and turns into a `PyroSample` site, named as in `named_parameters()`.
# Here we take torchvision's `resnet18` (random weights: nothing is downloaded), decide what
# to do with its BatchNorm layers, sample the weights with SGHMC through Pyro's `MCMC`, and
# recompute BatchNorm statistics for every draw before predicting.
#
# `PYRO_FLAT_QUICK=1` runs on tiny fake images (`torchvision.datasets.FakeData`) on the CPU
# in seconds (CI does this). Without it the tutorial trains on CIFAR-10 through
# `pyro_flat.datasets` (downloaded into `$PYRO_FLAT_DATA` on first use, with SVHN as the
# out-of-distribution set); that run wants a GPU (`PYRO_FLAT_DEVICE=cuda`).

# %%
import os

import pyro
import torch
import torchvision
from pyro.infer import MCMC

from pyro_flat import plots
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import SGHMC
from pyro_flat.infer.mcmc.sharpness import find_batchnorm
from pyro_flat.models.batchnorm import recompute_batchnorm
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import bayesian_parameter_names, make_bayesian

QUICK = os.environ.get("PYRO_FLAT_QUICK") == "1"
DEVICE = torch.device(os.environ.get("PYRO_FLAT_DEVICE", "cpu"))
torch.set_num_threads(1 if QUICK else torch.get_num_threads())
pyro.set_rng_seed(0)

# %% [markdown]
# ## Data
#
# Quick mode: 256 random 3×8×8 "images" in 10 classes from `FakeData` (its labels are
# random, so there is nothing to learn beyond memorising: the point is the mechanics), and
# uniform noise images as the out-of-distribution inputs. Full mode: CIFAR-10 and SVHN,
# standardised per channel by `load_dataset`.

# %%
if QUICK:
    def fake(size, seed):
        ds = torchvision.datasets.FakeData(size=size, image_size=(3, 8, 8), num_classes=10,
                                           random_offset=seed,
                                           transform=torchvision.transforms.ToTensor())
        x = torch.stack([ds[i][0] for i in range(size)])
        y = torch.tensor([int(ds[i][1]) for i in range(size)])
        return x, y

    x_train, y_train = fake(256, 0)
    x_test, y_test = fake(64, 10_000)
    mean, std = x_train.mean((0, 2, 3), keepdim=True), x_train.std((0, 2, 3), keepdim=True)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    x_ood = torch.randn_like(x_test) * 2.0
else:
    from pyro_flat.datasets import load_dataset

    data = load_dataset("cifar10", download=True)
    x_train, y_train, x_test, y_test, x_ood = (data.x_train, data.y_train, data.x_test,
                                               data.y_test, data.x_ood[:10_000])
x_train, y_train, x_test, y_test, x_ood = (t.to(DEVICE) for t in
                                           (x_train, y_train, x_test, y_test, x_ood))
num_train = len(x_train)
print(f"{num_train} training images of shape {tuple(x_train.shape[1:])}, {len(x_test)} test, "
      f"{len(x_ood)} OOD")

# %% [markdown]
# ## The network and its priors
#
# `resnet18(num_classes=10)` with `weights=None`. For small images we use the usual CIFAR stem:
# a 3×3 first convolution with stride 1 and no max-pooling.
#
# **BatchNorm policy.** `make_bayesian` leaves normalisation layers deterministic by default:
# their affine weight and bias become fixed *buffers* (left as `nn.Parameter`, they would be
# `pyro.param` sites that MCMC never moves), and their running statistics stay buffers that
# the network updates in training mode. `bayesian_batchnorm=True` would put priors on the
# affine parameters too. The convolution and linear weights get `N(0, s² / fan_in)` priors.

# %%
net = torchvision.models.resnet18(weights=None, num_classes=10)
net.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
net.maxpool = torch.nn.Identity()
net = make_bayesian(net.to(DEVICE), prior_scale=1.0, scale_rule="fan_in")
sites = bayesian_parameter_names(net)
print(len(sites), "sampled sites, e.g.", sites[:3], "...", sites[-2:])
print(len(find_batchnorm(net)), "BatchNorm layers with fixed affine parameters and running "
      "statistics")

# %% [markdown]
# ## Sampling
#
# The likelihood is `Categorical(logits=net(x))` on minibatches, scaled by `N / B`:
# `BNN(net, Categorical(), subsample_size=B)`, which takes the network made Bayesian above as
# it is (its sites are now named `net.conv1.weight`, ...). SGHMC is SGD with momentum plus
# noise: `SGHMC.from_sgd(model, lr, momentum, N)` takes the SGD learning rate on the *mean*
# loss. The network stays in training mode while sampling, so BatchNorm normalises with the
# minibatch statistics, as in SGD training.

# %%
batch, lr = (32, 0.01) if QUICK else (128, 0.05)
steps_per_draw, draws, warmup = (4, 4, 2) if QUICK else (390, 20, 40)  # full: one epoch/draw
model = BNN(net, Categorical(), subsample_size=batch)
kernel = SGHMC.from_sgd(model, lr * (1 - 0.9), 0.9, num_train,
                        num_steps_per_sample=steps_per_draw)
net.train()
mcmc = MCMC(kernel, num_samples=draws, warmup_steps=warmup, disable_progbar=QUICK)
mcmc.run(x_train, y_train)
samples = mcmc.get_samples()
print({k: tuple(v.shape) for k, v in list(samples.items())[:2]})

# %% [markdown]
# ## BatchNorm statistics for every draw
#
# A draw is a set of weights; the running mean and variance left in the BatchNorm layers
# belong to whatever weights ran last in training mode. `recompute_batchnorm` resets them and
# recomputes them for one draw on the training inputs (as SWA and SWAG do), after which the
# network predicts in evaluation mode with that draw. The model average is the mean of the
# per-draw class probabilities. (On `FakeData`, whose labels are random, accuracy stays at
# chance and the numbers below show the mechanics only; the full mode gives real ones.)


# %%
net.eval()
probs, probs_ood = 0.0, 0.0
for i in range(draws):
    draw = {k: v[i] for k, v in samples.items()}
    recompute_batchnorm(net, draw, x_train, batch_size=batch)
    one = {k: v[None] for k, v in draw.items()}
    probs = probs + bma_probs(net, one, x_test) / draws
    probs_ood = probs_ood + bma_probs(net, one, x_ood) / draws
stale = bma_probs(net, samples, x_test)  # every draw with the statistics of the last one
for name, p in [("recomputed statistics", probs), ("stale statistics", stale)]:
    print(f"{name:22s} accuracy {classification.accuracy(p, y_test):.3f}  "
          f"NLL {classification.nll(p, y_test):.3f}  ECE {classification.ece(p, y_test):.3f}")
entropy_in = classification.predictive_entropy(probs, reduction="none")
entropy_out = classification.predictive_entropy(probs_ood, reduction="none")
print(f"OOD AUROC (predictive entropy): {classification.ood_auroc(entropy_in, entropy_out):.3f}")

# %% [markdown]
# ## A picture: uncertainty in and out of distribution

# %%
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(4, 3.5), layout="constrained")
plots.uncertainty_histograms(probs.cpu(), probs_ood.cpu(), ax=ax, label="ResNet-18 SGHMC")
fig.savefig(os.environ.get("PYRO_FLAT_FIGURE", "resnet_uncertainty.png"))
