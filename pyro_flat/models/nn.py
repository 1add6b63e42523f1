"""Turn a plain ``torch.nn.Module`` into a Bayesian :class:`pyro.nn.PyroModule` in one line.

:func:`make_bayesian` converts a network in place and gives each chosen parameter an isotropic
Gaussian prior, so that the network becomes a Pyro model usable by ``pyro.infer.MCMC`` (with the
kernels of :mod:`pyro_flat.infer`) and by ``pyro.infer.SVI``::

    net = make_bayesian(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                            torch.nn.Linear(8, 1)), prior_scale=1.0)

Three details matter for speed and for sampler quality:

* Each prior is one prebuilt distribution object, ``Normal(0, s).expand(shape).to_event(d)``
  with ``loc``/``scale`` stride-0 views of 0-d tensors. PyroModule hands that same object to
  ``pyro.sample`` at every forward, so no distribution is built per step, and the kernels
  recognise the stride-0 form and evaluate the prior in closed form (a sum of squares).
* Each prior carries ``prior.pyro_flat_init``, a picklable :class:`LayerInit` that draws a fresh
  value the way the layer's own ``reset_parameters()`` does. :data:`init_to_network`, the
  kernels' default init strategy, uses it to start chains from the network's PyTorch
  initialisation instead of Pyro's ``uniform(-2, 2)`` in unconstrained space.
* Normalisation layers (BatchNorm, InstanceNorm, LayerNorm, GroupNorm, RMSNorm) keep their affine
  parameters deterministic by default, stored as *buffers* (fixed tensors): left as
  ``nn.Parameter`` they would become ``pyro.param`` sites, which MCMC does not sample and SVI
  would silently optimise.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_median, init_to_sample
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import _Context, _PyroModuleMeta, to_pyro_module_
from torch import nn
from torch.distributions import constraints

from pyro_flat.validation import positive

__all__ = [
    "LayerInit",
    "NetworkInit",
    "bayesian_parameter_names",
    "init_to_network",
    "make_bayesian",
    "plain_class",
]

#: Layers whose affine parameters stay deterministic unless ``bayesian_batchnorm=True``.
#: ``_NormBase`` covers BatchNorm*d, SyncBatchNorm and InstanceNorm*d.
NORM_LAYERS: tuple[type[nn.Module], ...] = tuple(
    t
    for t in (
        nn.modules.batchnorm._NormBase,
        nn.LayerNorm,
        nn.GroupNorm,
        getattr(nn, "RMSNorm", None),
    )
    if t is not None
)


# --------------------------------------------------------------------------------------------
# Prior families. A family maps (shape, scale, dtype, device) to a prebuilt Distribution whose
# event shape is the parameter's shape. Add a family by adding an entry to ``_PRIOR_FAMILIES``.
# --------------------------------------------------------------------------------------------


def _normal_prior(
    shape: torch.Size, scale: float, dtype: torch.dtype, device: torch.device
) -> dist.TorchDistribution:
    loc = torch.zeros((), dtype=dtype, device=device)
    scale_t = torch.full((), scale, dtype=dtype, device=device)
    # expand() keeps loc/scale as stride-0 views of the 0-d tensors: the kernels detect this
    # and compute the log-density as a sum of squares.
    return dist.Normal(loc, scale_t).expand(shape).to_event(len(shape))


_PRIOR_FAMILIES: dict[str, Callable[..., dist.TorchDistribution]] = {"normal": _normal_prior}
_SCALE_RULES = ("fixed", "fan_in")


# --------------------------------------------------------------------------------------------
# Recording the network's own initialisation.
# --------------------------------------------------------------------------------------------


def _own_parameters(layer: nn.Module) -> dict[str, nn.Parameter]:
    """``{name: parameter}`` of ``layer`` itself (not its children), every name of a parameter
    registered twice included, read without ``PyroModule``'s attribute lookup (which would
    draw a ``PyroSample``)."""
    return dict(layer.named_parameters(recurse=False, remove_duplicate=False))


def plain_class(cls: type) -> type:
    """The torch class behind a ``PyroModule[cls]`` mixin, else ``cls`` itself.

    Examples
    --------
    >>> from pyro.nn import PyroModule
    >>> plain_class(PyroModule[torch.nn.Linear]) is torch.nn.Linear
    True
    """
    for plain, mixin in _PyroModuleMeta._pyro_mixin_cache.items():
        if mixin is cls:
            return plain
    return cls


def _meta_template(layer: nn.Module) -> nn.Module:
    """A copy of ``layer`` without children, hooks or Pyro state, its own tensors on "meta".

    Meta tensors carry shape and dtype but no data, so the template costs almost no memory and
    pickles cheaply; :meth:`LayerInit.__call__` materialises a copy with ``to_empty``.
    """
    memo: dict[int, Any] = {}
    for child in layer.children():
        memo[id(child)] = None
    for p in layer.parameters(recurse=False):
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"),
                                   requires_grad=p.requires_grad)
    for b in layer.buffers(recurse=False):
        memo[id(b)] = torch.empty_like(b, device="meta")
    for key, value in layer.__dict__.items():
        if "hook" in key and isinstance(value, dict):
            memo[id(value)] = type(value)()
        elif key in ("_pyro_context", "_pyro_params", "_pyro_samples"):
            memo[id(value)] = None  # PyroModule state: not copied, dropped or reset below
    template = copy.deepcopy(layer, memo)
    plain = plain_class(type(layer))
    if plain is not type(layer):
        template.__class__ = plain
        for key in [k for k in template.__dict__ if k.startswith("_pyro_")]:
            del template.__dict__[key]
    elif isinstance(template, PyroModule):  # a user-defined PyroModule subclass: keep it usable
        template._pyro_name = ""
        template._pyro_context = _Context()
        template._pyro_params = OrderedDict()
        template._pyro_samples = OrderedDict()
    return template


class LayerInit:
    """A fresh initial value for one parameter, drawn as its layer's ``reset_parameters()`` does.

    Instances are attached by :func:`make_bayesian` to each prior as ``prior.pyro_flat_init``.
    They are plain picklable objects (no lambdas), so kernels holding them survive the spawn
    start method. Randomness comes from the global torch generator, hence is reproducible under
    ``pyro.set_rng_seed``.

    Parameters
    ----------
    layer : torch.nn.Module
        The module that owns the parameter directly (``recurse=False``).
    name : str
        The parameter's attribute name in ``layer``, e.g. ``"weight"``.
    fresh : bool, default True
        ``False``: always a copy of the parameter's value now (a trained network's value, for
        fine-tuning).

    Notes
    -----
    If ``layer`` has a ``reset_parameters()`` that (re)writes this parameter, each call builds a
    new copy of the layer from a template kept on the "meta" device, materialises it with
    ``to_empty`` on the parameter's device, runs ``reset_parameters()`` and returns the
    parameter. Otherwise (no ``reset_parameters``, one that fails without data, or one that
    leaves this parameter untouched) each call returns a copy of the value the parameter had at
    conversion time.

    Examples
    --------
    >>> layer = torch.nn.Linear(20, 3)
    >>> init = LayerInit(layer, "weight")
    >>> w1, w2 = init(), init()
    >>> bool((w1 != w2).any()), bool(w1.abs().max() <= 20**-0.5)
    (True, True)
    """

    def __init__(self, layer: nn.Module, name: str, fresh: bool = True):
        param = _own_parameters(layer).get(name)
        if param is None:
            raise ValueError(f"name must name a parameter of the layer, got {name!r}")
        self.name = name
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.device = param.device
        self.template: nn.Module | None = None
        self.value: torch.Tensor | None = None
        template = _meta_template(layer) if fresh else None
        if template is not None and self._dry_run(template):
            self.template = template
        else:
            self.value = param.detach().clone()

    def _dry_run(self, template: nn.Module) -> bool:
        """Whether ``reset_parameters()`` runs on meta tensors and writes this parameter."""
        if not callable(getattr(template, "reset_parameters", None)):
            return False
        trial = copy.deepcopy(template)
        before = _own_parameters(trial)[self.name]
        version = before._version
        try:
            with torch.no_grad():
                trial.reset_parameters()
        except Exception:
            return False
        after = _own_parameters(trial).get(self.name)
        if after is None or tuple(after.shape) != self.shape:
            return False
        # In-place initialisers bump the version counter; a rebinding creates a new tensor.
        return after is not before or after._version != version

    def __call__(self) -> torch.Tensor:
        """Return a new initial value with the parameter's shape, dtype and device."""
        if self.template is None:
            assert self.value is not None
            return self.value.clone()
        layer = copy.deepcopy(self.template).to_empty(device=self.device)
        with torch.no_grad():
            layer.reset_parameters()
        return _own_parameters(layer)[self.name].detach().to(self.dtype)

    def __repr__(self) -> str:
        how = "reset_parameters" if self.template is not None else "copy"
        return f"LayerInit({self.name!r}, shape={self.shape}, {how})"


# --------------------------------------------------------------------------------------------
# make_bayesian
# --------------------------------------------------------------------------------------------


def _matches(name: str, pattern: str) -> bool:
    return pattern == "" or name == pattern or name.startswith(pattern + ".")


def _patterns(arg: str, value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    try:
        patterns = list(value)
    except TypeError:
        raise ValueError(
            f"{arg} must be None or an iterable of parameter names or module prefixes, "
            f"got {value!r}"
        ) from None
    for p in patterns:
        if not isinstance(p, str):
            raise ValueError(f"{arg} entries must be strings, got {p!r}")
    return patterns


def _check_patterns(arg: str, patterns: list[str], names: list[str]) -> None:
    unknown = [p for p in patterns if not any(_matches(n, p) for n in names)]
    if unknown:
        raise ValueError(
            f"{arg} contains unknown parameter names {unknown}; valid names (or their module "
            f"prefixes) are {names}"
        )


def _fan_in(param: torch.Tensor, layer: nn.Module) -> int | None:
    """Fan-in for the ``fan_in`` rule: the parameter's own if it is a matrix/kernel, else its
    layer's ``weight``'s, else None."""
    if param.dim() >= 2:
        return nn.init._calculate_fan_in_and_fan_out(param)[0]
    weight = _own_parameters(layer).get("weight")
    if weight is None:
        weight = dict(layer.named_buffers(recurse=False)).get("weight")
    if isinstance(weight, torch.Tensor) and weight.dim() >= 2:
        return nn.init._calculate_fan_in_and_fan_out(weight)[0]
    return None


def _scale_lookup(
    prior_scale: float | Mapping[str, float], module_names: list[str]
) -> Callable[[str, str], float]:
    """Validate ``prior_scale`` and return ``lookup(module_name, param_name) -> scale``."""
    if not isinstance(prior_scale, Mapping):
        s = positive("prior_scale", prior_scale)
        return lambda module_name, param_name: s
    if not prior_scale:
        raise ValueError("prior_scale must be a positive number or a non-empty dict, got {}")
    scales: dict[str, float] = {}
    for key, value in prior_scale.items():
        if not isinstance(key, str) or key not in module_names:
            raise ValueError(
                f"prior_scale has unknown module name {key!r}; valid names (as in "
                f"named_modules(), '' is the whole network) are {module_names}"
            )
        scales[key] = positive(f"prior_scale[{key!r}]", value)
    by_length = sorted(scales, key=len, reverse=True)

    def lookup(module_name: str, param_name: str) -> float:
        for key in by_length:  # the longest (most specific) prefix wins
            if _matches(module_name, key):
                return scales[key]
        raise ValueError(
            f"prior_scale gives no scale for parameter {param_name!r}; add its module or a "
            "default under the key '' (the whole network)"
        )

    return lookup


def make_bayesian(
    module: nn.Module,
    prior_scale: float | Mapping[str, float] = 1.0,
    *,
    prior: str = "normal",
    scale_rule: str = "fixed",
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    bayesian_batchnorm: bool = False,
    init: str = "fresh",
) -> PyroModule:
    r"""Make ``module`` a Bayesian :class:`~pyro.nn.PyroModule` in place and return it.

    Each chosen ``nn.Parameter`` ``θ`` is replaced by a :class:`~pyro.nn.PyroSample` with the
    isotropic prior :math:`θ \sim \mathcal{N}(0, s^2 I)`, so that every forward pass of the
    module samples (or, under a kernel, reads) the parameter at the Pyro site named as in
    ``named_parameters()``, e.g. ``"fc1.weight"`` (see :func:`bayesian_parameter_names`).

    Parameters
    ----------
    module : torch.nn.Module
        The network. It is converted in place with :func:`pyro.nn.module.to_pyro_module_`.
        Move it to its device and dtype *before* converting: the priors are built on the
        parameters' device and dtype, and ``module.to(...)`` does not move PyroSample priors.
    prior_scale : float or dict of str to float, default 1.0
        The prior standard deviation ``s`` (before the ``scale_rule``), in ``(0, inf)``. A dict
        maps module names as in ``named_modules()`` to scales; a parameter takes the scale of
        the longest matching name, and ``""`` (the whole network) gives a default.
    prior : {"normal"}
        The prior family.
    scale_rule : {"fixed", "fan_in"}
        ``"fixed"``: ``s = prior_scale`` everywhere. ``"fan_in"``: ``s = prior_scale /
        sqrt(fan_in)``, with the fan-in of the owning layer's ``weight`` (a bias uses its
        layer's weight; a parameter of dim >= 2 uses its own; a layer without a weight of
        dim >= 2 keeps ``s = prior_scale``).
    include, exclude : str or iterable of str, optional
        Parameter names as in ``named_parameters()`` or module prefixes (``"fc1"`` selects
        ``"fc1.weight"`` and ``"fc1.bias"``). The Bayesian parameters are those included (all
        by default) and not excluded. Parameters left out stay ``nn.Parameter``, i.e.
        ``pyro.param`` sites: point estimates that ``SVI`` fits and MCMC kernels hold fixed.
    bayesian_batchnorm : bool, default False
        Normalisation layers (:data:`NORM_LAYERS`: BatchNorm, InstanceNorm, LayerNorm,
        GroupNorm, RMSNorm) keep deterministic affine parameters unless this is true. Their
        deterministic parameters are turned into *buffers* (fixed tensors in the
        ``state_dict`` under the same names), so that neither MCMC nor SVI sees them as
        parameters. Running statistics are left as they are, so a BatchNorm in training mode
        still updates them at each forward: call ``module.eval()`` to freeze them.
    init : {"fresh", "current"}, default "fresh"
        Where a kernel's chain starts (:func:`init_to_network`): ``"fresh"``, a new draw as
        the layer's ``reset_parameters()`` makes it; ``"current"``, the parameter's value now
        (a trained network's, for Bayesian fine-tuning).

    Returns
    -------
    pyro.nn.PyroModule
        ``module`` itself, now an instance of ``PyroModule[type(module)]``.

    Raises
    ------
    ValueError
        If an argument is invalid (the message names it and the accepted values), or if a
        chosen parameter is shared by several modules (tied weights are not supported).

    Notes
    -----
    Every prior is a prebuilt distribution object, built once here: PyroModule passes that same
    object to ``pyro.sample`` at every forward. It carries ``prior.pyro_flat_init``, a
    :class:`LayerInit` drawing from the layer's own PyTorch initialisation, which
    :data:`init_to_network` uses to start chains.

    Examples
    --------
    >>> import pyro
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
    ...                           torch.nn.Tanh(), torch.nn.Linear(8, 1))
    >>> net = make_bayesian(net, prior_scale=1.0, scale_rule="fan_in")
    >>> bayesian_parameter_names(net)
    ['0.weight', '0.bias', '3.weight', '3.bias']
    >>> trace = pyro.poutine.trace(net).get_trace(torch.randn(5, 4))
    >>> trace.nodes["0.weight"]["fn"].base_dist.scale[0, 0].item()  # 1 / sqrt(4)
    0.5
    >>> "1.weight" in dict(net.named_buffers())  # BatchNorm affine: a fixed buffer
    True
    """
    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if prior not in _PRIOR_FAMILIES:
        raise ValueError(f"prior must be one of {sorted(_PRIOR_FAMILIES)}, got {prior!r}")
    if scale_rule not in _SCALE_RULES:
        raise ValueError(f"scale_rule must be one of {list(_SCALE_RULES)}, got {scale_rule!r}")
    if not isinstance(bayesian_batchnorm, bool):
        raise ValueError(f"bayesian_batchnorm must be True or False, got {bayesian_batchnorm!r}")
    if init not in ("fresh", "current"):
        raise ValueError(f"init must be 'fresh' or 'current', got {init!r}")
    module_names = [name for name, _ in module.named_modules()]
    scale_of = _scale_lookup(prior_scale, module_names)
    build_prior = _PRIOR_FAMILIES[prior]

    names = [name for name, _ in module.named_parameters()]
    include_p = _patterns("include", include)
    exclude_p = _patterns("exclude", exclude)
    if include_p is not None:
        _check_patterns("include", include_p, names)
    if exclude_p is not None:
        _check_patterns("exclude", exclude_p, names)

    owners: dict[str, tuple[str, nn.Module, str]] = {}
    for module_name, layer in module.named_modules():
        for attr in _own_parameters(layer):
            full = f"{module_name}.{attr}" if module_name else attr
            owners.setdefault(full, (module_name, layer, attr))
    is_norm = {n: isinstance(owners[n][1], NORM_LAYERS) for n in names}
    if include_p is not None and not bayesian_batchnorm:
        for pattern in include_p:
            matched = [n for n in names if _matches(n, pattern)]
            if all(is_norm[n] for n in matched):
                raise ValueError(
                    f"include entry {pattern!r} selects only normalisation-layer parameters, "
                    "which stay deterministic unless bayesian_batchnorm=True"
                )

    # Plan everything before changing anything: the fan-in of a bias needs its layer's weight.
    plan: list[tuple[nn.Module, str, str, Any]] = []  # (layer, attr, action, prior or None)
    chosen_ids = {}
    for name in names:
        module_name, layer, attr = owners[name]
        param = _own_parameters(layer)[attr]
        selected = (include_p is None or any(_matches(name, p) for p in include_p)) and not (
            exclude_p is not None and any(_matches(name, p) for p in exclude_p)
        )
        if is_norm[name] and not (selected and bayesian_batchnorm):
            plan.append((layer, attr, "buffer", None))
            continue
        if not selected:
            continue
        s = scale_of(module_name, name)
        if scale_rule == "fan_in":
            fan_in = _fan_in(param, layer)
            if fan_in is not None and fan_in > 0:
                s = s / math.sqrt(fan_in)
        prior_dist = build_prior(param.shape, s, param.dtype, param.device)
        prior_dist.pyro_flat_init = LayerInit(layer, attr, fresh=init == "fresh")
        chosen_ids[id(param)] = name
        plan.append((layer, attr, "sample", prior_dist))

    for module_name, layer in module.named_modules(remove_duplicate=False):
        for attr, p in _own_parameters(layer).items():
            full = f"{module_name}.{attr}" if module_name else attr
            if id(p) in chosen_ids and chosen_ids[id(p)] != full:
                raise ValueError(
                    f"parameter {chosen_ids[id(p)]!r} is shared with {full!r}; tied "
                    "parameters cannot be made Bayesian, exclude them"
                )

    to_pyro_module_(module)
    for layer, attr, action, prior_dist in plan:
        if action == "sample":
            setattr(layer, attr, PyroSample(prior_dist))
        else:
            value = layer._parameters[attr].detach()
            delattr(layer, attr)
            layer.register_buffer(attr, value)
    return module


def bayesian_parameter_names(module: nn.Module) -> list[str]:
    """The Pyro site names of the :class:`~pyro.nn.PyroSample` attributes of ``module``.

    Names are full site names as PyroModule produces them (``"fc1.weight"`` for a network
    converted as a whole), in ``named_modules()`` order.

    Examples
    --------
    >>> net = make_bayesian(torch.nn.Linear(3, 2), include=["weight"])
    >>> bayesian_parameter_names(net)
    ['weight']
    """
    return [name for _, name in pyro_sample_sites(module)]


def pyro_sample_sites(module: nn.Module) -> list[tuple[PyroModule, str]]:
    """Each :class:`~pyro.nn.PyroSample` attribute of ``module`` as ``(its PyroModule, its
    full site name)``, in ``named_modules()`` order."""
    out = []
    for module_name, layer in module.named_modules():
        if not isinstance(layer, PyroModule):
            continue
        prefix = layer.__dict__.get("_pyro_name", module_name)
        out.extend((layer, f"{prefix}.{attr}" if prefix else attr)
                   for attr in layer._pyro_samples)
    return out


# --------------------------------------------------------------------------------------------
# init_to_network
# --------------------------------------------------------------------------------------------


def _is_real(support: Any) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return isinstance(support, type(constraints.real))


def _find_init(fn: Any) -> Callable[[], torch.Tensor] | None:
    while fn is not None:
        init = getattr(fn, "pyro_flat_init", None)
        if init is not None:
            return init
        fn = getattr(fn, "base_dist", None)
    return None


def _uniform_like(fn: Any, shape: torch.Size, fan_in: int) -> torch.Tensor:
    reference = fn.sample().detach()  # for dtype and device
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return torch.empty(shape, dtype=reference.dtype, device=reference.device).uniform_(
        -bound, bound
    )


class NetworkInit:
    """Pyro init strategy that starts a network where PyTorch would initialise it.

    Called with a Pyro sample-site dict (keys ``"name"``, ``"fn"``, ``"value"``,
    ``"is_observed"``), it returns a constrained initial value:

    a. if the site's distribution carries ``pyro_flat_init`` (priors from
       :func:`make_bayesian`), a fresh draw from the layer's own ``reset_parameters()``;
    b. else, for a real-support site of dim >= 2, ``Uniform(-b, b)`` with
       ``b = 1/sqrt(fan_in)``, ``fan_in = shape[1] * prod(shape[2:])`` (PyTorch's default
       rule for Linear/Conv weights);
    c. else, for a site named ``"...bias"`` whose sibling ``"...weight"`` came earlier in the
       same trace, ``Uniform(-b, b)`` with that weight's fan-in;
    d. else :func:`~pyro.infer.autoguide.initialization.init_to_median`, and
       :func:`~pyro.infer.autoguide.initialization.init_to_sample` if that fails.

    Observed sites get their observed value. To apply rule (c) an instance remembers the
    weights of the current trace; the memory is cleared whenever a site name repeats (a new
    trace), so one instance, such as the module-level :data:`init_to_network`, can be reused
    across traces, models and chains. Calling an instance with no site returns a new instance,
    like Pyro's own ``init_to_*`` functions.

    Examples
    --------
    >>> import pyro
    >>> from pyro.infer.autoguide.initialization import InitMessenger
    >>> def model():
    ...     return pyro.sample("w", pyro.distributions.Normal(0.0, 10.0).expand([3, 100])
    ...                        .to_event(2))
    >>> w = InitMessenger(init_to_network())(model)()
    >>> bool(w.abs().max() <= 0.1)  # 1 / sqrt(100)
    True
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._fan_in: dict[str, int] = {}

    def __call__(self, site: dict | None = None) -> Any:
        if site is None:
            return NetworkInit()
        if site.get("is_observed"):
            return site["value"]
        fn = site["fn"]
        name = site["name"]
        if type(fn).__name__ == "_Subsample":  # a plate's index site: not ours to initialise
            return site["value"] if site.get("value") is not None else fn.sample()
        if name in self._seen:
            self._seen.clear()
            self._fan_in.clear()
        self._seen.add(name)

        shape = fn.shape()
        real = _is_real(fn.support)
        if real and len(shape) >= 2:
            self._fan_in[name] = shape[1] * math.prod(shape[2:])

        init = _find_init(fn)
        if init is not None:
            value = init()
            if value.shape == shape:
                return value
        if real and len(shape) >= 2:
            return _uniform_like(fn, shape, self._fan_in[name])
        if real and name.endswith("bias"):
            fan_in = self._fan_in.get(name[: -len("bias")] + "weight")
            if fan_in is not None:
                return _uniform_like(fn, shape, fan_in)
        try:
            return init_to_median(site, fallback=init_to_sample)
        except Exception:
            return init_to_sample(site)

    def __repr__(self) -> str:
        return "NetworkInit()"


#: The default :class:`NetworkInit` instance, safe to reuse across traces (see its docs).
init_to_network = NetworkInit()
