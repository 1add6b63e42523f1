"""The networks that every method of ``pyro-flat compare`` shares.

The Pyro model around them is :class:`pyro_flat.models.bnn.BNN` with the task's likelihood,
``Categorical()`` or ``HeteroskedasticGaussian(min_scale=1e-3)``
(:meth:`pyro_flat.compare.common.Context.bnn`, :mod:`pyro_flat.compare.task`); the number of
outputs is the number of classes, or 2 (mean and raw scale) for regression.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pyro_flat.compare.config import Settings

#: Architectures accepted by ``--model``.
MODELS = ("mlp", "cnn")


def build_mlp(in_features: int, num_classes: int, hidden: Sequence[int]) -> torch.nn.Sequential:
    """``in_features - hidden... - num_classes`` with ReLU between the linear layers."""
    layers: list[torch.nn.Module] = []
    width = in_features
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, num_classes))
    return torch.nn.Sequential(*layers)


def build_cnn(
    length: int, num_classes: int, channels: Sequence[int], hidden: int = 100
) -> torch.nn.Sequential:
    """A small 1-D CNN for signals of ``length`` values (MNIST-1D).

    The input ``(batch, length)`` is viewed as one channel; each entry of ``channels`` adds a
    convolution (kernel 5, padding 2, stride 2) with ReLU, halving the length; then one
    hidden linear layer of ``hidden`` units and the output layer. No normalisation layers, so
    that every draw predicts without recomputed statistics.

    Examples
    --------
    >>> net = build_cnn(40, 10, channels=(16, 32))
    >>> net(torch.randn(8, 40)).shape
    torch.Size([8, 10])
    """
    layers: list[torch.nn.Module] = [torch.nn.Unflatten(1, (1, length))]
    width, size = 1, length
    for c in channels:
        layers += [torch.nn.Conv1d(width, c, kernel_size=5, stride=2, padding=2), torch.nn.ReLU()]
        width, size = c, (size - 1) // 2 + 1
    layers += [torch.nn.Flatten(), torch.nn.Linear(width * size, hidden), torch.nn.ReLU(),
               torch.nn.Linear(hidden, num_classes)]
    return torch.nn.Sequential(*layers)


def build_cnn2d(
    image_shape: Sequence[int], num_classes: int, channels: Sequence[int], hidden: int = 100
) -> torch.nn.Sequential:
    """A small 2-D CNN for images of ``image_shape = (channels, height, width)`` (MNIST-5k,
    MNIST, CIFAR-10).

    Each entry of ``channels`` adds a convolution (kernel 5, padding 2, stride 2) with ReLU,
    halving height and width; then one hidden linear layer of ``hidden`` units and the output
    layer. No normalisation layers, as in :func:`build_cnn`.

    Examples
    --------
    >>> net = build_cnn2d((1, 28, 28), 10, channels=(16, 32))
    >>> net(torch.randn(8, 1, 28, 28)).shape
    torch.Size([8, 10])
    """
    width, height, size = image_shape[0], image_shape[1], image_shape[2]
    layers: list[torch.nn.Module] = []
    for c in channels:
        layers += [torch.nn.Conv2d(width, c, kernel_size=5, stride=2, padding=2), torch.nn.ReLU()]
        width, height, size = c, (height - 1) // 2 + 1, (size - 1) // 2 + 1
    layers += [torch.nn.Flatten(), torch.nn.Linear(width * height * size, hidden),
               torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes)]
    return torch.nn.Sequential(*layers)


def build_network(
    name: str, input_shape: Sequence[int], num_classes: int, settings: Settings
) -> torch.nn.Sequential:
    """The plain (non-Bayesian) network ``--model name`` for inputs of ``input_shape``.

    The MLP flattens image inputs first (its layers are then numbered from 1); ``cnn`` is the
    1-D CNN for flat inputs (a signal) and the 2-D CNN for images ``(channels, height, width)``.
    """
    shape = tuple(input_shape)
    if name == "mlp":
        net = build_mlp(math.prod(shape), num_classes, settings.hidden)
        return torch.nn.Sequential(torch.nn.Flatten(), *net) if len(shape) > 1 else net
    if name == "cnn":
        if len(shape) == 1:
            return build_cnn(shape[0], num_classes, settings.channels)
        if len(shape) == 3:
            return build_cnn2d(shape, num_classes, settings.channels)
        raise ValueError(f"model 'cnn' reads signals (n,) or images (channels, height, width), "
                         f"got shape {shape}")
    raise ValueError(f"model must be one of {', '.join(MODELS)}, got {name!r}")


def describe(name: str, input_shape: Sequence[int], num_classes: int, settings: Settings) -> str:
    """A short description of the architecture, e.g. ``mlp 40-100-100-10``."""
    if name == "mlp":
        widths = [math.prod(input_shape), *settings.hidden, num_classes]
        return "mlp " + "-".join(map(str, widths))
    chans = "-".join(map(str, settings.channels))
    conv = "conv1d" if len(input_shape) == 1 else "conv2d"
    return f"cnn {conv} {chans} (k5, s2), 100, {num_classes}"
