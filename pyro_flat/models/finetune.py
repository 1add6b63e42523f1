r"""Bayesian fine-tuning of a trained network: a chosen part Bayesian, the rest frozen.

Two ways to choose the part, each giving an ordinary :class:`~pyro_flat.models.bnn.BNN` that
every kernel and SVI tool runs through ``MCMC``/``SVI``:

* **The head** (:class:`TrainedNetwork`): the last ``nn.Linear`` (or a named module applied
  last) Bayesian, the backbone before it frozen at its trained values. The backbone's
  features can be computed once per data point (:meth:`TrainedNetwork.features`, ``N x H``
  numbers in memory) and the model run on them (:meth:`TrainedNetwork.head_model`), so that
  an SG step costs the head alone; or recomputed at every step
  (:meth:`TrainedNetwork.network_model`, no feature memory). Both models name their sites
  alike (``net.head.weight``, ...), so draws of one predict with the other on raw inputs.
* **Low-rank adapters** (:func:`add_lora`): chosen ``nn.Linear`` layers get
  :math:`W x + b + \frac{\alpha}{r} B A x` with factors :math:`A` (``r x in``) and :math:`B`
  (``out x r``); the adapter factors carry the prior (:func:`lora_parameter_names` for
  ``make_bayesian(..., include=...)``), everything else is frozen.

Frozen means a buffer: not a ``pyro.param`` site, so ``SVI`` does not fit it and the kernels
do not move it. The frozen parts run in evaluation mode (BatchNorm's running statistics,
Dropout off).

References
----------
Kristiadi, A., Hein, M. and Hennig, P. (2020). Being Bayesian, even just a bit, fixes
overconfidence in ReLU networks. ICML. Hu, E. et al. (2022). LoRA: low-rank adaptation of
large language models. ICLR. Yang, A. X. et al. (2024). Bayesian low-rank adaptation for
large language models. ICLR.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
from torch import nn

from pyro_flat import validation
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Likelihood
from pyro_flat.models.nn import make_bayesian

__all__ = ["LoRALinear", "TrainedNetwork", "add_lora", "freeze_", "lora_parameter_names"]


def freeze_(module: nn.Module) -> nn.Module:
    """Turn every parameter of ``module`` into a buffer of the same name and value, in place,
    and put it in evaluation mode; returns it."""
    for layer in module.modules():
        for name, p in list(layer.named_parameters(recurse=False)):
            delattr(layer, name)
            layer.register_buffer(name, p.detach())
    return module.eval()


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, new)


class _HeadOnly(nn.Module):
    """The head on precomputed features (sites ``head.*``)."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features)


class _BackboneAndHead(nn.Module):
    """The frozen backbone, then the head (sites ``head.*``, as :class:`_HeadOnly`'s)."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(x)
        return self.head(features)


class TrainedNetwork:
    r"""A trained ``net`` split into a frozen backbone and a head to make Bayesian.

    Target of the models it builds: :math:`p(\theta_{head} \mid \mathcal D) \propto
    p(\theta_{head}) \prod_n p(y_n \mid \mathrm{head}_\theta(\phi(x_n)))`, :math:`\phi` the
    backbone at its trained values.

    Parameters
    ----------
    net : nn.Module
        The trained network (copied: ``net`` itself is left as it is).
    head : str, optional
        The name (as in ``named_modules()``) of the module applied last; default the last
        ``nn.Linear``. ``net(x)`` must equal ``head(backbone(x))``, which :meth:`features`
        checks on its first rows.

    Examples
    --------
    >>> import torch, pyro
    >>> from pyro.infer import MCMC
    >>> from pyro_flat.infer import SGLD
    >>> from pyro_flat.models.likelihoods import Categorical
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    >>> x, y = torch.randn(100, 4), torch.randint(0, 3, (100,))
    >>> trained = TrainedNetwork(net)
    >>> features = trained.features(x)  # once: every SG step then costs the head alone
    >>> model = trained.head_model(Categorical(), subsample_size=32)
    >>> mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=5, warmup_steps=5,
    ...             disable_progbar=True)
    >>> mcmc.run(features, y)
    >>> sorted(mcmc.get_samples())
    ['net.head.bias', 'net.head.weight']
    """

    def __init__(self, net: nn.Module, head: str | None = None):
        if not isinstance(net, nn.Module):
            raise ValueError(f"net must be a torch.nn.Module (the trained network), got "
                             f"{type(net).__name__}")
        if head is None:
            linear = [n for n, m in net.named_modules() if isinstance(m, nn.Linear)]
            if not linear:
                raise ValueError("the network has no nn.Linear layer; name the head module "
                                 "with head=...")
            head = linear[-1]
        modules = dict(net.named_modules())
        if head not in modules or head == "":
            raise ValueError(f"head must name a submodule of the network (as in "
                             f"named_modules()), got {head!r}")
        self.head_name = head
        self.head = copy.deepcopy(modules[head])
        self.backbone = copy.deepcopy(net)
        _replace(self.backbone, head, nn.Identity())
        freeze_(self.backbone)
        # kept until features() has checked the split on data (then dropped)
        self._reference: nn.Module | None = freeze_(copy.deepcopy(net))

    def features(self, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """The backbone's output at ``x``, in chunks of ``batch_size`` rows, without
        gradients: ``(N, ...)``, the inputs of :meth:`head_model`."""
        batch_size = validation.integer_at_least("batch_size", batch_size, 1)
        with torch.no_grad():
            if self._reference is not None:
                probe = x[:8]
                try:
                    same = torch.allclose(self._reference(probe),
                                          self.head(self.backbone(probe)), rtol=1e-4, atol=1e-5)
                except RuntimeError:  # e.g. shapes that do not fit
                    same = False
                if not same:
                    raise ValueError(f"the network's output is not head(backbone(x)) with head "
                                     f"{self.head_name!r}: the head must be the module applied "
                                     "last; name it with head=...")
                self._reference = None
            return torch.cat([self.backbone(chunk) for chunk in x.split(batch_size)])

    def head_model(self, likelihood: Likelihood, *, prior_scale: float = 1.0,
                   scale_rule: str = "fixed", subsample_size: int | None = None) -> BNN:
        """The Bayesian head as a model of the features: run it on
        ``(trained.features(x), y)``. The head's prior is ``make_bayesian``'s; the kernels'
        chains start at the trained head (``init="current"``)."""
        module = make_bayesian(_HeadOnly(copy.deepcopy(self.head)), prior_scale,
                               scale_rule=scale_rule, init="current")
        return BNN(module, likelihood, subsample_size=subsample_size)

    def network_model(self, likelihood: Likelihood, *, prior_scale: float = 1.0,
                      scale_rule: str = "fixed", subsample_size: int | None = None) -> BNN:
        """The same posterior as a model of the inputs, the frozen backbone run at every
        evaluation (no feature memory): run it on ``(x, y)``. Its sites are
        :meth:`head_model`'s, so either's draws predict with this one on new inputs."""
        module = _BackboneAndHead(copy.deepcopy(self.backbone), copy.deepcopy(self.head))
        module = make_bayesian(module, prior_scale, scale_rule=scale_rule, include="head",
                               init="current")
        return BNN(module, likelihood, subsample_size=subsample_size)


class LoRALinear(nn.Module):
    r"""A frozen ``nn.Linear`` with a low-rank adapter:
    :math:`W x + b + \frac{\alpha}{r} B (A x)`, ``lora_a`` (``r x in``) and ``lora_b``
    (``out x r``) its only parameters (``B = 0`` at the start, so the output is the trained
    layer's)."""

    def __init__(self, linear: nn.Linear, rank: int, alpha: float | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        rank = validation.integer_at_least("rank", rank, 1)
        self.register_buffer("weight", linear.weight.detach().clone())
        self.register_buffer("bias", None if linear.bias is None else
                             linear.bias.detach().clone())
        w = linear.weight
        a = torch.randn(rank, linear.in_features, generator=generator, dtype=w.dtype)
        self.lora_a = nn.Parameter(a.to(w.device) / math.sqrt(linear.in_features))
        self.lora_b = nn.Parameter(torch.zeros(linear.out_features, rank, dtype=w.dtype,
                                               device=w.device))
        self.scaling = (rank if alpha is None else validation.positive("alpha", alpha)) / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = nn.functional.linear(x, self.weight, self.bias)
        return base + self.scaling * nn.functional.linear(
            nn.functional.linear(x, self.lora_a), self.lora_b)


def add_lora(net: nn.Module, layers: str | Iterable[str], rank: int = 4,
             alpha: float | None = None, generator: torch.Generator | None = None
             ) -> nn.Module:
    """A copy of ``net`` with the ``nn.Linear`` layers named in ``layers`` given low-rank
    adapters (:class:`LoRALinear`) and every other parameter frozen (a buffer).

    Make the adapters Bayesian with ``make_bayesian(adapted,
    include=lora_parameter_names(adapted), init="current")``: the chains then start at
    :math:`B = 0`, the trained network.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    >>> adapted = add_lora(net, ["0", "2"], rank=2)
    >>> lora_parameter_names(adapted)
    ['0.lora_a', '0.lora_b', '2.lora_a', '2.lora_b']
    >>> x = torch.randn(5, 4)
    >>> bool(torch.allclose(adapted(x), net(x)))  # B = 0: the trained network's output
    True

    References
    ----------
    Hu, E. et al. (2022). LoRA: low-rank adaptation of large language models. ICLR.
    """
    if not isinstance(net, nn.Module):
        raise ValueError(f"net must be a torch.nn.Module (the trained network), got "
                         f"{type(net).__name__}")
    names = [layers] if isinstance(layers, str) else list(layers)
    if not names:
        raise ValueError("layers must name at least one nn.Linear module of the network")
    modules = dict(net.named_modules())
    for name in names:
        if not isinstance(modules.get(name), nn.Linear):
            raise ValueError(f"layers must name nn.Linear modules of the network, got {name!r}")
    adapted = copy.deepcopy(net)
    freeze_(adapted)
    for name in names:
        _replace(adapted, name, LoRALinear(modules[name], rank, alpha, generator))
    return adapted


def lora_parameter_names(module: nn.Module) -> list[str]:
    """The names of the adapter factors of ``module``'s :class:`LoRALinear` layers."""
    return [f"{name}.{factor}" if name else factor
            for name, m in module.named_modules() if isinstance(m, LoRALinear)
            for factor in ("lora_a", "lora_b")]
