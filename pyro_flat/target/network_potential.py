r"""A :class:`~pyro_flat.models.bnn.BNN`'s potential as one pure function of the flat position.

For a model whose structure pyro_flat can read, the minibatch potential

.. math:: \hat U(z, \text{batch}) = \tfrac12 \sum_j p_j (z_j - m_j)^2
    - \log p(\sigma) - \log|\det J| - \frac{N}{B} \sum_{i \in \text{batch}}
    \log p\big(y_i \mid f_z(x_i), \sigma\big)

is written directly: the network through :func:`torch.func.functional_call` on a plain copy of
it, the Normal prior in closed form on the flat vector (precisions :math:`p`, means :math:`m`),
the likelihood's latents (a learned noise scale :math:`\sigma`) and its log-density in closed
form. No Pyro messenger runs, so the function can be compiled (:mod:`.compiled`). It is the same
potential as :class:`~.potential.ModelPotential` plus :class:`~.flat_prior.FlatNormalPrior`, to
float rounding.

:func:`read_network` says whether a model qualifies, and why not when it does not: a ``BNN``
with a built-in likelihood whose network's Bayesian parameters all have constant Normal priors
(:func:`~pyro_flat.models.nn.make_bayesian`'s), with no other ``nn.Parameter`` (point
estimates live in Pyro's parameter store) and no Dropout or BatchNorm in training mode (random,
or updating state at every step), minibatched by at most one of the kernel and the model.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import nn
from torch.func import functional_call

from pyro_flat.target.flat_prior import FlatNormalPrior
from pyro_flat.target.layout import FlatLayout
from pyro_flat.target.normal import HALF_LOG_2PI
from pyro_flat.target.tracing import DataPlate

__all__ = ["NetworkFunction", "NetworkPotential", "read_network"]

_LOG_2 = math.log(2.0)


def _random_or_stateful(module: nn.Module) -> bool:
    """Whether ``module`` draws random numbers (Dropout) or updates its running statistics
    (BatchNorm, InstanceNorm with ``track_running_stats``) at every call in training mode."""
    return module.training and (
        isinstance(module, nn.modules.dropout._DropoutNd)
        or (isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats))


@dataclass(frozen=True)
class _NetSite:
    """A Bayesian parameter: its slice of the flat vector and its name in the plain network."""

    path: str
    offset: int
    stop: int
    shape: torch.Size


class NetworkFunction:
    r"""The structure of a readable ``BNN``'s potential, without its data: call
    :meth:`energy` ``(z, x, y, batch, buffers, precision, loc)`` on one chain's flat ``z``
    (``(d,)``) and its minibatch indices ``batch`` (``(B,)``, or ``None``: every point). The
    tensors it reads are arguments, not constants, so one compiled graph serves every run of
    the same shapes; :attr:`key` identifies the function (equal keys, the same function of the
    inputs). The prior's normalising constant is left out."""

    def __init__(self, template: nn.Module, sites: list[_NetSite], likelihood: Any,
                 scale_site: tuple[int, float] | None, scale: float, key: tuple):
        self.template = template
        self.sites = sites
        self.likelihood = likelihood
        self.scale_site = scale_site
        self.scale = scale
        #: What identifies the function: equal keys, the same function of the inputs.
        self.key = key

    def energy(self, z: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
               batch: torch.Tensor | None, buffers: dict[str, torch.Tensor],
               precision: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        """The potential of one chain's flat ``z`` on the minibatch ``batch``."""
        if batch is not None:
            x, y = x.index_select(0, batch), y.index_select(0, batch)
        params = {s.path: z[s.offset:s.stop].view(s.shape) for s in self.sites}
        out = functional_call(self.template, {**buffers, **params}, (x,))
        u = 0.5 * (precision * (z - loc).square()).sum()
        sigma = None
        if self.scale_site is not None:  # the learned noise scale: HalfNormal, exp transform
            offset, prior_scale = self.scale_site
            log_sigma = z[offset]
            sigma = log_sigma.exp()
            u = u - (_LOG_2 - math.log(prior_scale) - HALF_LOG_2PI
                     - 0.5 * (sigma / prior_scale).square() + log_sigma)
        log_lik = _log_density(self.likelihood, out, y, sigma)
        return u - self.scale * log_lik.sum()


class NetworkPotential:
    r""":math:`\hat U(z, \text{batch})` of a readable ``BNN`` (see :func:`read_network`): its
    :class:`NetworkFunction` and the tensors the function reads.

    Examples
    --------
    >>> import torch
    >>> from pyro.infer.autoguide import init_to_sample
    >>> from pyro_flat.models.bnn import BNN
    >>> from pyro_flat.models.likelihoods import HomoskedasticGaussian
    >>> from pyro_flat.target import trace_model
    >>> net = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    >>> model = BNN(net, HomoskedasticGaussian())
    >>> x, y = torch.randn(10, 1), torch.randn(10)
    >>> traced = trace_model(model, (x, y), {}, init_to_sample)
    >>> fast = read_network(model, (x, y), {}, traced.layout, traced.plate, traced.flat_prior)
    >>> z = traced.layout.flatten(traced.init)
    >>> u = fast.function.energy(z, *fast.inputs(None)) + fast.constant
    >>> u.shape
    torch.Size([])
    """

    def __init__(self, function: NetworkFunction, buffers: dict[str, torch.Tensor],
                 x: torch.Tensor, y: torch.Tensor, flat_prior: FlatNormalPrior):
        self.function = function
        self.buffers = buffers
        self.x, self.y = x, y
        self.flat_prior = flat_prior
        #: The prior's normalising constant (summed outside the function).
        self.constant = float(flat_prior._const)

    def inputs(self, batch: torch.Tensor | None) -> tuple:
        """``(x, y, batch, buffers, precision, loc)``: the arguments of
        :meth:`NetworkFunction.energy` after ``z``."""
        return (self.x, self.y, batch, self.buffers, self.flat_prior.precision,
                self.flat_prior.loc)


def _log_density(likelihood: Any, out: torch.Tensor, y: torch.Tensor,
                 sigma: torch.Tensor | None) -> torch.Tensor:
    """Each target's log-density under a built-in likelihood, in closed form (the rule of
    :class:`~pyro_flat.models.bnn.BNN` for targets with a trailing dimension of size 1)."""
    from pyro_flat.models import likelihoods as lk

    if isinstance(likelihood, lk.Categorical):
        return -F.cross_entropy(out, y.squeeze(-1) if y.dim() == 2 else y, reduction="none")
    if isinstance(likelihood, lk.HeteroskedasticGaussian):
        mean, scale = out[:, 0], F.softplus(out[:, 1]) + likelihood.min_scale
    else:
        mean = out.squeeze(1) if out.dim() == 2 else out
        scale = None
    if y.dim() == mean.dim() + 1:
        y = y.squeeze(-1)
    if isinstance(likelihood, lk.Bernoulli):
        return -F.binary_cross_entropy_with_logits(mean, y, reduction="none")
    if scale is None:
        scale = sigma if likelihood.scale is None else likelihood.scale
    scale = torch.as_tensor(scale, dtype=mean.dtype)
    return -0.5 * ((y - mean) / scale).square() - scale.log() - HALF_LOG_2PI


def _plain_template(net: nn.Module, sites: dict[str, tuple[str, torch.Tensor]]
                    ) -> nn.Module | str:
    """A copy of ``net`` as plain torch modules, its tensors empty placeholders on "meta" (the
    values are passed at every call); or why it cannot be made."""
    from pyro_flat.models.nn import plain_class

    memo: dict[int, Any] = {}
    for module in net.modules():
        for key in ("_pyro_context", "_pyro_params", "_pyro_samples"):
            if key in module.__dict__:
                memo[id(module.__dict__[key])] = None
        for b in module.buffers(recurse=False):
            memo[id(b)] = torch.empty_like(b, device="meta")
    template = copy.deepcopy(net, memo)
    for name, module in template.named_modules():
        plain = plain_class(type(module))
        if issubclass(plain, PyroModule):
            return (f"module {name or 'net'!r} is a PyroModule subclass "
                    f"({type(module).__name__}), whose forward pyro_flat cannot read")
        module.__class__ = plain
        for key in [k for k in module.__dict__ if k.startswith("_pyro_")]:
            del module.__dict__[key]
    owners = dict(template.named_modules())
    for path, (_, like) in sites.items():
        owner, _, attr = path.rpartition(".")
        owners[owner].register_buffer(attr, torch.empty_like(like, device="meta"))
    return template


def read_network(model: Any, args: tuple, kwargs: dict, layout: FlatLayout,
                 plate: DataPlate | None, flat_prior: FlatNormalPrior | None
                 ) -> NetworkPotential | str:
    """The pure potential of ``model`` run on ``args``/``kwargs``, or a sentence saying why
    pyro_flat cannot read it (then the model keeps the Pyro path)."""
    from pyro_flat.models import likelihoods as lk
    from pyro_flat.models.bnn import BNN

    if not isinstance(model, BNN):
        return (f"the model is a {type(model).__name__}, not a pyro_flat.models.BNN: only a "
                "BNN's structure can be read")
    likelihood = model.likelihood
    builtin = (lk.Categorical, lk.Bernoulli, lk.HomoskedasticGaussian, lk.HeteroskedasticGaussian)
    if type(likelihood) not in builtin:
        return (f"the likelihood {type(likelihood).__name__} is not one of the built-in "
                f"{[c.__name__ for c in builtin]}")
    bound = _bind_forward(model, args, kwargs)
    if isinstance(bound, str):
        return bound
    x, y = bound
    if plate is not None and plate.slice_args and model.subsample_size is not None and (
            model.subsample_size < plate.batch_size):
        return ("both the kernel (subsample_size) and the BNN (subsample_size) subsample, the "
                "BNN within the kernel's minibatch")
    from pyro_flat.models.nn import plain_class

    net = model.net
    for name, module in net.named_modules():
        if _random_or_stateful(module):
            kind = plain_class(type(module)).__name__
            return (f"module {name!r} ({kind}) is in training mode, where it is random or "
                    "updates its state at every step: call net.eval() first")
        own = dict(module.named_parameters(recurse=False, remove_duplicate=False))
        if own:
            return (f"module {name!r} has nn.Parameter {sorted(own)}, a point "
                    "estimate read from Pyro's parameter store")
    if flat_prior is None:
        return "no site has a constant Normal prior (a prior pyro_flat sums in closed form)"
    flat_fns = flat_prior.fns
    by_name = {s.name: s for s in layout.sites}
    net_sites: dict[str, tuple[str, torch.Tensor]] = {}
    order = []
    for module_name, module in net.named_modules():
        if not isinstance(module, PyroModule):
            continue
        prefix = module.__dict__.get("_pyro_name", module_name)
        for attr, prior in module._pyro_samples.items():
            site = f"{prefix}.{attr}" if prefix else attr
            if flat_fns.get(site) is not prior:
                return (f"site {site!r} has no constant Normal prior (a prior pyro_flat sums in "
                        "closed form)")
            path = f"{module_name}.{attr}" if module_name else attr
            net_sites[path] = (site, torch.empty(by_name[site].shape, dtype=x.dtype,
                                                 device=x.device))
            order.append(site)
    scale_site = None
    others = [s for s in layout.names if s not in order]
    if isinstance(likelihood, lk.HomoskedasticGaussian) and likelihood.scale is None:
        if "obs_scale" not in by_name:
            return "the likelihood's latent site 'obs_scale' is not in the model's trace"
        others.remove("obs_scale")
        scale_site = (by_name["obs_scale"].offset, float(likelihood.prior_scale))
    if others:
        return f"latent sites {others} are neither the network's nor the likelihood's"
    template = _plain_template(net, net_sites)
    if isinstance(template, str):
        return template
    sites = [_NetSite(path, by_name[site].offset, by_name[site].stop,
                      by_name[site].shape) for path, (site, _) in net_sites.items()]
    buffers = dict(net.named_buffers())
    scale = 1.0 if plate is None else plate.size / plate.batch_size
    key = (_structure(net), tuple((s.path, s.offset, tuple(s.shape)) for s in sites),
           tuple((n, tuple(b.shape), b.dtype) for n, b in buffers.items()), repr(likelihood),
           scale_site, _tensor_key(x), _tensor_key(y), scale, layout.size)
    function = NetworkFunction(template, sites, copy.copy(likelihood), scale_site, scale, key)
    return NetworkPotential(function, buffers, x, y, flat_prior)


def _bind_forward(model: Any, args: tuple, kwargs: dict
                  ) -> tuple[torch.Tensor, torch.Tensor] | str:
    """``(x, y)`` from the arguments of ``BNN.forward``."""
    import inspect

    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as e:
        return f"the arguments do not bind to BNN.forward(x, y): {e}"
    x, y = bound.arguments.get("x"), bound.arguments.get("y")
    if not (torch.is_tensor(x) and torch.is_tensor(y)):
        return "BNN.forward needs tensors x and y (targets observed) to be read"
    return x, y


def _tensor_key(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, t.device)


def _structure(net: nn.Module) -> tuple:
    """The network's modules: names, classes (by identity) and training flags, and its printed
    form (which shows each layer's hyper-parameters)."""
    return (tuple((name, id(type(m)), m.training) for name, m in net.named_modules()),
            repr(net))
