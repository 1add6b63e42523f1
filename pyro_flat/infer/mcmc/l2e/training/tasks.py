r"""The task distribution of L2E meta-training: small BNNs on data generated here.

A :class:`Task` is a network (an ``nn.Module`` evaluated with :func:`torch.func.functional_call`
on views of one flat parameter vector), a training set, a held-out set and a likelihood; its
potential is :math:`U(\theta) = \tfrac{1}{2 s^2}\lVert\theta\rVert^2 - \tfrac{N}{B}\sum_{i \in
\mathcal{B}} \log p(y_i \mid x_i, \theta)` with an ``N(0, s^2)`` prior on every weight, exactly
the potential :class:`pyro_flat.infer.L2E` sees for the same BNN written as a Pyro model.

:func:`sample_task` draws from the meta-training distribution: MLPs (depth 1-2, width 16/32/64)
and CNNs (1 or 2 conv layers, 4 or 8 channels) on MNIST-1D and scikit-learn digits, and MLPs on
a synthetic regression (a random teacher network). Everything outside this list (a deeper or
wider network, another data set) is held out from meta-training; docs/methods/l2e.md compares
the shipped meta-parameters with SGLD on such held-out tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn
from torch.func import functional_call

from pyro_flat.datasets import load_dataset

__all__ = ["CNN_CHANNELS", "CNN_DEPTHS", "META_DATASETS", "MLP_DEPTHS", "MLP_WIDTHS", "Task",
           "make_task", "sample_task"]

#: Data sets of the meta-training distribution.
META_DATASETS: tuple[str, ...] = ("mnist1d", "digits", "teacher_regression")
#: Widths and depths of the meta-training MLPs.
MLP_WIDTHS: tuple[int, ...] = (16, 32, 64)
#: Depths (hidden layers) of the meta-training MLPs.
MLP_DEPTHS: tuple[int, ...] = (1, 2)
#: Channels and conv layers of the meta-training CNNs.
CNN_CHANNELS: tuple[int, ...] = (4, 8)
#: Conv layers of the meta-training CNNs.
CNN_DEPTHS: tuple[int, ...] = (1, 2)


@dataclass
class Task:
    """One inner problem of meta-training (or a held-out benchmark task)."""

    name: str
    net: nn.Module
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    likelihood: str  # "categorical" or "gaussian"
    noise_std: float = 1.0
    prior_scale: float = 1.0
    batch_size: int = 128

    def __post_init__(self) -> None:
        params = dict(self.net.named_parameters())
        self.names = list(params)
        self.shapes = [p.shape for p in params.values()]
        bounds, start = [], 0
        for p in params.values():
            bounds.append((start, start + p.numel()))
            start += p.numel()
        self.segments = bounds
        self.num_params = start
        self.buffers = dict(self.net.named_buffers())

    @property
    def num_data(self) -> int:
        return int(self.x_train.shape[0])

    def initial_flat(self) -> torch.Tensor:
        """The network's own PyTorch initialisation as one flat vector."""
        return torch.cat([p.detach().reshape(-1) for p in self.net.parameters()]).clone()

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: flat[a:b].view(s) for n, (a, b), s
                in zip(self.names, self.segments, self.shapes, strict=True)}

    def outputs(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.net, (self.views(flat), self.buffers), (x,))

    def log_lik(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-datum log-likelihood ``log p(y_i | x_i, theta)`` from the network outputs."""
        if self.likelihood == "categorical":
            return -nn.functional.cross_entropy(out, y, reduction="none")
        z = (y - out.squeeze(-1)) / self.noise_std
        return -0.5 * z * z - math.log(self.noise_std) - 0.5 * math.log(2 * math.pi)

    def potential_and_grad(self, flat: torch.Tensor, idx: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, grad U)`` on the minibatch ``idx`` (likelihood scaled by ``N / B``)."""
        leaf = flat.detach().requires_grad_()
        with torch.enable_grad():
            ll = self.log_lik(self.outputs(leaf, self.x_train[idx]), self.y_train[idx])
            u = -ll.sum() * (self.num_data / len(idx)) + 0.5 * leaf.square().sum() / (
                self.prior_scale**2)
            (grad,) = torch.autograd.grad(u, leaf)
        return u.detach(), grad


def _mlp(in_dim: int, out_dim: int, width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    d = in_dim
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


def _cnn(signal_shape: tuple[int, ...], out_dim: int, channels: int, depth: int) -> nn.Module:
    """Conv (kernel 3, stride 2) + ReLU blocks, then a linear read-out; 1-D or 2-D inputs."""
    two_d = len(signal_shape) == 2
    conv = nn.Conv2d if two_d else nn.Conv1d
    layers: list[nn.Module] = [nn.Unflatten(1, (1, *signal_shape))]
    c = 1
    for _ in range(depth):
        layers += [conv(c, channels, 3, stride=2, padding=1), nn.ReLU()]
        c = channels
    layers.append(nn.Flatten())
    with torch.no_grad():
        n = nn.Sequential(*layers)(torch.zeros(1, math.prod(signal_shape))).shape[1]
    layers.append(nn.Linear(n, out_dim))
    return nn.Sequential(*layers)


@lru_cache(maxsize=8)
def _data(name: str, seed: int) -> tuple[torch.Tensor, ...]:
    if name == "teacher_regression":
        g = torch.Generator().manual_seed(1000 + seed)
        x = torch.randn(1200, 8, generator=g)
        w1 = torch.randn(8, 32, generator=g) / math.sqrt(8)
        w2 = torch.randn(32, generator=g) / math.sqrt(32)
        f = torch.tanh(x @ w1) @ w2 * 2.0
        y = f + 0.3 * torch.randn(1200, generator=g)
        return x[:1000], y[:1000], x[1000:], y[1000:]  # the last 200 are a test set
    data = load_dataset(name, seed=seed)
    return data.x_train, data.y_train, data.x_test, data.y_test


def _split(x: torch.Tensor, y: torch.Tensor, val_size: int) -> tuple[torch.Tensor, ...]:
    """The last ``val_size`` training points become the meta-validation set (test sets stay
    untouched, for benchmarks)."""
    return x[:-val_size], y[:-val_size], x[-val_size:], y[-val_size:]


def make_task(dataset: str, arch: str, width: int, depth: int, *, seed: int = 0,
              val_size: int = 256) -> Task:
    """A task on ``dataset`` (see
    :data:`~pyro_flat.infer.mcmc.l2e.training.tasks.META_DATASETS`; also any classification
    name of :func:`pyro_flat.datasets.load_dataset`) with an ``"mlp"`` or ``"cnn"`` network;
    the network's initial weights depend on ``seed``."""
    x, y, xv, yv = _split(*_data(dataset, 0)[:2], val_size)
    regression = dataset == "teacher_regression"
    out_dim = 1 if regression else int(y.max()) + 1
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if arch == "mlp":
            net = _mlp(x.shape[1], out_dim, width, depth)
        elif arch == "cnn":
            shape = (8, 8) if dataset == "digits" else (x.shape[1],)
            net = _cnn(shape, out_dim, width, depth)
        else:
            raise ValueError(f"arch must be 'mlp' or 'cnn', got {arch!r}")
    return Task(
        name=f"{dataset}/{arch}-{width}x{depth}", net=net, x_train=x, y_train=y,
        x_val=xv, y_val=yv,
        likelihood="gaussian" if regression else "categorical",
        noise_std=0.3 if regression else 1.0,
    )


def sample_task(generator: torch.Generator) -> Task:
    """One task of the meta-training distribution, drawn with ``generator``."""
    def pick(options: tuple) -> object:
        return options[int(torch.randint(len(options), (), generator=generator))]

    dataset = pick(META_DATASETS)
    arch = "mlp" if dataset == "teacher_regression" else pick(("mlp", "mlp", "cnn"))
    if arch == "mlp":
        width, depth = pick(MLP_WIDTHS), pick(MLP_DEPTHS)
    else:
        width, depth = pick(CNN_CHANNELS), pick(CNN_DEPTHS)
    seed = int(torch.randint(2**31, (), generator=generator))
    return make_task(str(dataset), str(arch), int(width), int(depth), seed=seed)


TaskSampler = Callable[[torch.Generator], Task]
