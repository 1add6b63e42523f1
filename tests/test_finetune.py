"""Bayesian fine-tuning (pyro_flat.models.finetune): the head on cached features is the same
posterior as the frozen network run at every step, every kernel and SVI run on it without
moving the backbone, and low-rank adapters start at the trained network."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer import MCMC, SVI
from pyro.infer.autoguide import AutoNormal

from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import SGLD, LeanELBO
from pyro_flat.infer.mcmc import registry
from pyro_flat.models.bnn import BNN
from pyro_flat.models.finetune import (
    TrainedNetwork,
    add_lora,
    lora_parameter_names,
)
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian


def trained_cnn():
    """A small CNN with BatchNorm and Dropout, 'trained' (random weights, BatchNorm statistics
    moved off their defaults), on 8x8 images of 3 classes."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Dropout(0.3),
        torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x = torch.randn(120, 1, 8, 8)
    y = torch.randint(0, 3, (120,))
    net.train()
    net(x)  # BatchNorm's running statistics move
    return net.eval(), x, y


def run_sgld(model, *args, seed=0, steps=3):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(SGLD(model, step_size=1e-3, num_steps_per_sample=steps), num_samples=4,
                warmup_steps=2, disable_progbar=True)
    mcmc.run(*args)
    return mcmc.get_samples()


def test_cached_features_and_the_frozen_network_give_the_same_chain():
    """Same seed, same minibatches: SGLD on the head over cached features and on the network
    with its backbone recomputed reach the same draws (to float rounding), and the draws of
    one predict on raw inputs with the other's network."""
    net, x, y = trained_cnn()
    trained = TrainedNetwork(net)
    features = trained.features(x)
    assert features.shape == (120, 16)
    cached = run_sgld(trained.head_model(Categorical(), subsample_size=30), features, y)
    full = run_sgld(trained.network_model(Categorical(), subsample_size=30), x, y)
    assert set(cached) == set(full) == {"net.head.weight", "net.head.bias"}
    for site in cached:
        torch.testing.assert_close(cached[site], full[site], rtol=1e-5, atol=1e-6)
    network = trained.network_model(Categorical()).net
    probs = bma_probs(network, cached, x[:10])
    assert probs.shape == (10, 3) and torch.allclose(probs.sum(-1), torch.ones(10))


def test_the_chain_starts_at_the_trained_head():
    net, x, y = trained_cnn()
    trained = TrainedNetwork(net)
    pyro.set_rng_seed(0)
    kernel = SGLD(trained.head_model(Categorical()), step_size=1e-12)
    mcmc = MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True)
    mcmc.run(trained.features(x), y)
    torch.testing.assert_close(mcmc.get_samples()["net.head.weight"][0], net[8].weight,
                               rtol=0, atol=1e-5)


#: The arguments a kernel needs besides the model and step size.
REQUIRED = {"CyclicalSGLD": {"cycle_length": 5}, "EntropyMCMC": {"eta": 0.01},
            "ContourSGLD": {"num_bins": 10, "auto_bins": True}, "SASGLD": {"rho": 0.01}}


@pytest.mark.parametrize("name", registry.KERNELS)
def test_every_kernel_runs_on_the_head(name):
    net, x, y = trained_cnn()
    trained = TrainedNetwork(net)
    features = trained.features(x)
    before = {k: v.clone() for k, v in trained.backbone.state_dict().items()}
    kernel = registry.KERNELS[name](trained.head_model(Categorical(), subsample_size=30),
                                    step_size=1e-3, **REQUIRED.get(name, {}))
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=2, disable_progbar=True)
    mcmc.run(features, y)
    draws = mcmc.get_samples()
    assert draws["net.head.weight"].shape[-2:] == (3, 16)
    assert all(torch.isfinite(v).all() for v in draws.values())
    for k, v in trained.backbone.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("name", registry.KERNELS)
def test_every_kernel_runs_on_low_rank_adapters(name):
    net, x, y = trained_cnn()
    adapted = add_lora(net, ["6", "8"], rank=2, generator=torch.Generator().manual_seed(0))
    names = lora_parameter_names(adapted)
    model = BNN(make_bayesian(adapted, 0.1, include=names, init="current"), Categorical(),
                subsample_size=30)
    kernel = registry.KERNELS[name](model, step_size=1e-4, **REQUIRED.get(name, {}))
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=2, disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples()  # (and EntropyMCMC's guide draws, "<site>__guide")
    assert {k.removesuffix("__guide") for k in draws} == {"net." + n for n in names}
    assert all(torch.isfinite(v).all() for v in draws.values())


def test_svi_fits_only_the_guide():
    """The backbone is buffers, not pyro.param sites: SVI's parameters are the guide's."""
    pyro.clear_param_store()
    net, x, y = trained_cnn()
    trained = TrainedNetwork(net)
    model = trained.network_model(Categorical(), subsample_size=30)
    guide = AutoNormal(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), LeanELBO())
    losses = [svi.step(x, y) for _ in range(20)]
    assert all(torch.isfinite(torch.tensor(losses)))
    names = list(pyro.get_param_store().keys())
    assert names and all(n.startswith("AutoNormal.") for n in names), names
    assert {n.split(".", 2)[-1] for n in names} == {"net.head.weight", "net.head.bias"}


def test_lora_adapters_start_at_the_trained_network_and_only_they_move():
    net, x, y = trained_cnn()
    adapted = add_lora(net, ["6", "8"], rank=2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(adapted(x), net(x))
    names = lora_parameter_names(adapted)
    assert names == ["6.lora_a", "6.lora_b", "8.lora_a", "8.lora_b"]
    assert [n for n, _ in adapted.named_parameters()] == names  # the rest frozen
    model = BNN(make_bayesian(adapted, 0.1, include=names, init="current"), Categorical(),
                subsample_size=30)
    draws = run_sgld(model, x, y)
    assert set(draws) == {"net." + n for n in names}
    assert draws["net.8.lora_b"].shape == (4, 3, 2)


def test_bad_inputs_name_the_argument():
    net, x, _ = trained_cnn()
    with pytest.raises(ValueError, match="head must name a submodule"):
        TrainedNetwork(net, head="nope")
    with pytest.raises(ValueError, match=r"not head\(backbone\(x\)\) with head '6'"):
        TrainedNetwork(net, head="6").features(x)
    with pytest.raises(ValueError, match="no nn.Linear"):
        TrainedNetwork(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(ValueError, match="layers must name nn.Linear modules"):
        add_lora(net, ["0"])
    with pytest.raises(ValueError, match="rank"):
        add_lora(net, ["8"], rank=0)
