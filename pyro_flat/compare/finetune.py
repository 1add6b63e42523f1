"""``pyro-flat compare --protocol finetune``: every method on the last layer of a network that
SGD trained first.

Per seed, the ``--model`` network is trained on the MAP loss by SGD
(:func:`pyro_flat.compare.sgd.train_map`, ``Settings.finetune_steps`` steps), then split at its
last linear layer (:class:`pyro_flat.models.finetune.TrainedNetwork`): the backbone is frozen
and its features of the training, test and OOD inputs computed once. The data set the methods
see is those features, the network they make Bayesian is the last layer (``model="head"``)
starting at its trained values, so every method, its evaluation and its cost are those of the
head; the ``sgd`` row continues the head's SGD from the trained values (the MAP network), and
``laplace`` is the last-layer Laplace approximation of that MAP.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pyro_flat.compare.common import Context
from pyro_flat.compare.config import Plan, Settings


def pretrain(data: Any, settings: Settings, model: str, seed: int
             ) -> tuple[Any, dict[str, torch.Tensor], str]:
    """Train ``model`` on ``data`` (seeded by ``seed``); the data set of its backbone's
    features, the trained last layer's state (for ``model="head"``) and a description."""
    import pyro

    from pyro_flat.compare.models import describe
    from pyro_flat.compare.sgd import train_map
    from pyro_flat.compare.task import num_outputs
    from pyro_flat.models.finetune import TrainedNetwork

    steps = settings.finetune_steps
    plan = Plan(num_draws=1, warmup_draws=0, thin=steps, num_cycles=1, warmup_cycles=0,
                cycle_length=steps, draws_per_cycle=1)  # (train_map reads none of it)
    ctx = Context(data, settings, plan, seed, model, show_progress=False)
    pyro.set_rng_seed(seed)
    net = ctx.network()
    train_map(ctx, net, settings.finetune_steps)
    net.eval()
    trained = TrainedNetwork(net)
    features = {split: trained.features(getattr(data, f"x_{split}"))
                for split in ("train", "test", "ood")}
    head = trained.head
    state = {f"0.{name}": value.detach().clone() for name, value in head.state_dict().items()}
    view = dataclasses.replace(data, x_train=features["train"], x_test=features["test"],
                               x_ood=features["ood"],
                               input_shape=tuple(features["train"].shape[1:]))
    arch = (f"the last layer of {describe(model, data.input_shape, num_outputs(data), settings)}"
            f" trained by {settings.finetune_steps} SGD steps")
    return view, state, arch
