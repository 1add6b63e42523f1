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
# # Bayesian fine-tuning of a trained network
#
# Most networks worth making Bayesian are already trained. Here a torchvision ResNet-18 is
# trained by SGD on local data (scikit-learn's 8x8 digits, upsampled to 16x16; nothing is
# downloaded), then only its last layer is made Bayesian, on the features of the frozen
# backbone computed once. We compare, on the same head:
#
# - the **MAP network** itself (the SGD fit);
# - the **last-layer Laplace** approximation, with its prior precision chosen by the marginal
#   likelihood (`pyro_flat.infer.laplace`);
# - **EntropyMCMC**, flat-seeking SG-MCMC, through Pyro's `MCMC`;
# - **sharpness-aware SVI** (`SharpnessAwareELBO`) with a mean-field guide.
#
# The digits 0-4 are the classes; the digits 5-9 are the out-of-distribution (OOD) inputs, so
# the OOD AUROC asks whether a method knows that a "7" is none of the five classes it learnt.
# Each method's draws are also scored by the kernel Stein discrepancy (KSD) to the head's
# posterior, which needs no reference run.
#
# `PYRO_FLAT_QUICK=1` (what CI and the documentation build run) trains for a few epochs and
# keeps few draws; without it the run is longer and the numbers steadier.

# %%
import os

import matplotlib.pyplot as plt
import pyro
import torch
import torchvision
from pyro.infer import MCMC, SVI
from pyro.infer.autoguide import AutoNormal
from sklearn.datasets import load_digits

from pyro_flat import plots
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.predictive import bma_probs, guide_draws
from pyro_flat.evaluation.stein import stein_discrepancy
from pyro_flat.infer import EntropyMCMC, SharpnessAwareELBO
from pyro_flat.infer.laplace import LastLayerLaplace
from pyro_flat.models.finetune import TrainedNetwork
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import init_to_network

QUICK = os.environ.get("PYRO_FLAT_QUICK") == "1"
EPOCHS = 6 if QUICK else 30
DRAWS = 40 if QUICK else 200
SVI_STEPS = 300 if QUICK else 3000
torch.set_num_threads(1 if QUICK else torch.get_num_threads())
pyro.set_rng_seed(0)

# %% [markdown]
# ## Data and the trained network
#
# The images are standardised and repeated over three channels, as the ResNet expects. A user
# with a folder of images would load it with `torchvision.datasets.ImageFolder` instead.

# %%
digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
images = torch.nn.functional.interpolate(images, size=16, mode="bilinear").repeat(1, 3, 1, 1)
images = (images - images.mean()) / images.std()
labels = torch.tensor(digits.target)
inside = labels < 5
g = torch.Generator().manual_seed(0)
order = torch.randperm(int(inside.sum()), generator=g)
x_in, y_in = images[inside][order], labels[inside][order]
split = int(0.7 * len(x_in))
x_train, y_train, x_test, y_test = x_in[:split], y_in[:split], x_in[split:], y_in[split:]
x_ood = images[~inside][:len(x_test)]
print(f"{len(x_train)} training, {len(x_test)} test and {len(x_ood)} OOD images")

net = torchvision.models.resnet18(num_classes=5)
optimiser = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
for _ in range(EPOCHS):
    net.train()
    for batch in torch.randperm(len(x_train), generator=g).split(64):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(net(x_train[batch]), y_train[batch]).backward()
        optimiser.step()
# BatchNorm's running statistics of the final weights, averaged over the training set (its
# running averages lag behind the weights after a short training)
with torch.no_grad():
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average
    net.train()
    for batch in x_train.split(256):
        net(batch)
net.eval()
with torch.no_grad():
    map_probs, map_ood = net(x_test).softmax(-1), net(x_ood).softmax(-1)
print(f"MAP test accuracy {classification.accuracy(map_probs, y_test):.3f}")

# %% [markdown]
# ## The head on the frozen backbone
#
# `TrainedNetwork` splits the network at its last `nn.Linear` (`fc`, 512 to 5): the backbone
# is frozen (its parameters become buffers, BatchNorm uses its running statistics) and its
# features are computed once per image. Every SG step then costs the head alone.

# %%
trained = TrainedNetwork(net)
features = {name: trained.features(x) for name, x in
            (("train", x_train), ("test", x_test), ("ood", x_ood))}
head_net = trained.network_model(Categorical()).net  # predicts on images from head draws
print("features:", tuple(features["train"].shape))

# %% [markdown]
# ## Last-layer Laplace
#
# The GGN of the head, Kronecker-factored, around the trained head; the prior precision
# maximises the Laplace marginal likelihood. `sample_layer` draws the head, here under the
# head model's site names; `LaplaceGuide(laplace)` would be the whole network's guide (for
# `Predictive` on `BNN(make_bayesian(net), ...)`), every backbone site at its trained value.

# %%
laplace = LastLayerLaplace(net, "classification", "kron").fit(x_train, y_train)
delta = laplace.optimize_prior_precision()
print(f"prior precision {delta:.3g}, log marginal likelihood "
      f"{laplace.log_marginal_likelihood():.1f}, log det of the posterior precision "
      f"{laplace.log_det_precision():.1f}")
laplace_probs, laplace_ood = laplace.predictive(x_test), laplace.predictive(x_ood)
weights, biases = zip(*laplace.sample_layer(DRAWS, torch.Generator().manual_seed(0)),
                      strict=True)
laplace_draws = {"net.head.weight": torch.stack(weights), "net.head.bias": torch.stack(biases)}

# %% [markdown]
# ## EntropyMCMC on the head
#
# The same prior precision, as a prior scale $1/\sqrt\delta$, so that every method targets
# the same posterior. The chain starts at the trained head.

# %%
prior_scale = delta ** -0.5
model = trained.head_model(Categorical(), prior_scale=prior_scale, subsample_size=128)
n = len(x_train)
kernel = EntropyMCMC(model, step_size=0.05 / n, eta=0.05 / n / 0.025, num_steps_per_sample=20)
mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=DRAWS // 2, disable_progbar=True)
mcmc.run(features["train"], y_train)
mcmc_draws = mcmc.get_samples()

# %% [markdown]
# ## Sharpness-aware SVI on the head
#
# A mean-field guide started at the trained head, fitted with `SharpnessAwareELBO` (two
# gradients a step, the second at the guide's means moved up the loss by 0.05).

# %%
pyro.clear_param_store()
guide = AutoNormal(model, init_loc_fn=init_to_network, init_scale=0.01)
svi = SVI(model, guide, pyro.optim.Adam({"lr": 3e-3}), SharpnessAwareELBO(rho=0.05))
for _ in range(SVI_STEPS):
    svi.step(features["train"], y_train)
svi_draws = guide_draws(guide, DRAWS, features["train"], y_train)

# %% [markdown]
# ## Scores
#
# Accuracy, NLL and ECE on the test digits, the OOD AUROC of the predictive entropy (test
# against the digits 5-9), and the KSD of the draws to the head's posterior (the U-statistic,
# minibatch scores; the MAP network is one point, without a KSD).

# %%
results = {"MAP network": (map_probs, map_ood, None), "Laplace (probit)": (
    laplace_probs.float(), laplace_ood.float(), laplace_draws)}
for name, draws in (("EntropyMCMC", mcmc_draws), ("SA-SVI", svi_draws)):
    results[name] = (bma_probs(head_net, draws, x_test), bma_probs(head_net, draws, x_ood),
                     draws)
for name, (probs, probs_ood, draws) in results.items():
    auroc = classification.ood_auroc(
        classification.predictive_entropy(probs, reduction="none"),
        classification.predictive_entropy(probs_ood, reduction="none"))
    ksd = float("nan") if draws is None else stein_discrepancy(
        model, draws, features["train"], y_train)
    print(f"{name:18s} accuracy {classification.accuracy(probs, y_test):.3f}  "
          f"NLL {classification.nll(probs, y_test):.3f}  "
          f"ECE {classification.ece(probs, y_test):.3f}  OOD AUROC {auroc:.3f}  KSD {ksd:.3g}")

# %% [markdown]
# ## Figures
#
# The reliability diagram of each method and the densities of its predictive entropy on test
# and OOD digits: a method that knows what it does not know puts the OOD entropies to the
# right.

# %%
fig, axes = plt.subplots(2, len(results), figsize=(4 * len(results), 7))
for column, (name, (probs, probs_ood, _)) in enumerate(results.items()):
    plots.reliability_diagram(probs, y_test, ax=axes[0, column], label=name)
    plots.uncertainty_histograms(probs, probs_ood, ax=axes[1, column], label=name)
fig.tight_layout()
fig.savefig(os.environ.get("PYRO_FLAT_FIGURE", "finetune_calibration_and_ood.png"))

# %% [markdown]
# ## What to take from it
#
# - The head on cached features makes every method cheap: here an SG step costs a 512-by-5
#   matrix product instead of a ResNet pass (`benchmarks/finetune_feature_cache.py` measures
#   124 times on 32x32 images).
# - Laplace is the baseline that costs one pass over the data; a sampler or SVI has to beat it
#   on the same head to be worth its cost.
# - The KSD ranks draws by their distance to the posterior of the head without a reference
#   run; it is not a predictive score, and a method can predict well from draws that are far
#   from the posterior.
