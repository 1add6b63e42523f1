"""``pyro-flat compare --protocol finetune``: every method on a part of a network that SGD
trained first.

Per seed, the ``--model`` network is trained on the MAP loss by SGD
(:func:`pyro_flat.compare.sgd.train_map`, ``Settings.finetune_steps`` steps). Then
(``Settings.finetune_part``):

* ``"head"``: the network is split at its last linear layer
  (:class:`pyro_flat.models.finetune.TrainedNetwork`), the backbone frozen and its features of
  the training, test and OOD inputs computed once; the data set the methods see is those
  features and the network they make Bayesian is the last layer, so every method, its
  evaluation and its cost are those of the head;
* ``"adapters"``: every linear layer gets a low-rank adapter
  (:func:`pyro_flat.models.finetune.add_lora`, rank ``Settings.lora_rank``), everything else
  frozen; the methods see the inputs and make the adapters' factors Bayesian.

Either way every network and chain starts at the trained values (``B = 0`` for adapters); the
``sgd`` row continues SGD from them (the MAP network), and ``laplace`` is the Laplace
approximation of that MAP (of the last layer, or of the adapters' factors).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pyro_flat.compare.common import Context
from pyro_flat.compare.config import Plan, Settings

#: The parts ``--finetune-part`` chooses from.
PARTS = ("head", "adapters")


def pretrain(data: Any, settings: Settings, model: str, seed: int
             ) -> tuple[Any, torch.nn.Module, str]:
    """Train ``model`` on ``data`` (seeded by ``seed``); the data set the methods see, the
    trained network they work on (``Context.trained``) and a description."""
    import pyro

    from pyro_flat.compare.models import describe
    from pyro_flat.compare.sgd import train_map
    from pyro_flat.compare.task import num_outputs
    from pyro_flat.models.finetune import TrainedNetwork, add_lora

    if settings.finetune_part not in PARTS:
        raise ValueError(f"finetune_part must be one of {PARTS}, got {settings.finetune_part!r}")
    steps = settings.finetune_steps
    plan = Plan(num_draws=1, warmup_draws=0, thin=steps, num_cycles=1, warmup_cycles=0,
                cycle_length=steps, draws_per_cycle=1)  # (train_map reads none of it)
    ctx = Context(data, settings, plan, seed, model, show_progress=False)
    pyro.set_rng_seed(seed)
    net = ctx.network()
    train_map(ctx, net, steps)
    net.eval()
    name = describe(model, data.input_shape, num_outputs(data), settings)
    if settings.finetune_part == "adapters":
        layers = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Linear)]
        adapted = add_lora(net, layers, rank=settings.lora_rank,
                           generator=torch.Generator().manual_seed(seed))
        return data, adapted, (f"rank-{settings.lora_rank} adapters on the linear layers of "
                               f"{name} trained by {steps} SGD steps")
    trained = TrainedNetwork(net)
    features = {split: trained.features(getattr(data, f"x_{split}"))
                for split in ("train", "test", "ood")}
    view = dataclasses.replace(data, x_train=features["train"], x_test=features["test"],
                               x_ood=features["ood"],
                               input_shape=tuple(features["train"].shape[1:]))
    return view, torch.nn.Sequential(trained.head), (
        f"the last layer of {name} trained by {steps} SGD steps")
