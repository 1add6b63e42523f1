"""The minibatch potential of a Pyro model: the hot path of every SG-MCMC kernel.

For unconstrained parameters ``z``, constrained values ``x = T(z)`` and ``T = biject_to(support)``,

.. math::

    U(z) = -\\log p(x) - \\log|\\det J_T(z)|
           - \\frac{N}{B} \\sum_{i \\in \\text{batch}} \\log p(y_i \\mid x)

The model runs once per evaluation under ``_LogJoint``, a small messenger that substitutes
the latent values, injects the minibatch indices into the data plate and adds up the scaled
log-densities as the sites go by. Nothing is traced or recorded; Normal priors (the usual BNN
prior) are summed in closed form on the flat parameter vector (:mod:`.flat_prior`). On a
784-100-100-10 MLP the potential and its gradient cost about 1.1 times a hand-written
``functional_call`` log joint (``benchmarks/step_overhead.py``), about half of what a traced
model costs (``benchmarks/README.md``, "Notes on design choices").
The other Normal sites are summed in closed form as the model runs (:mod:`.normal`).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyro.poutine as poutine
import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from torch.distributions import biject_to
from torch.distributions.transforms import ComposeTransform, IndependentTransform

from pyro_flat.infer.mcmc.flat_prior import FlatNormalPrior
from pyro_flat.infer.mcmc.layout import FlatLayout
from pyro_flat.infer.mcmc.normal import normal_log_prob_sum
from pyro_flat.observed_shapes import check_observed_site
from pyro_flat.sites import latent_sites
from pyro_flat.subsample import InjectIndices

#: A model observed on this many points or more, run full batch, is told what a step costs.
FULL_BATCH_HINT_POINTS = 10_000
#: The minibatch the full-batch hint compares with.
HINT_BATCH = 128


@dataclass(frozen=True)
class DataPlate:
    """The plate that is subsampled at every step.

    ``size`` is ``N``, ``batch_size`` is ``B``. When ``slice_args`` is true the kernel, not the
    model, subsamples: model arguments whose leading dimension is ``N`` (``arg_positions`` and
    ``kwarg_names``) are sliced with the minibatch indices before the model runs.
    """

    name: str
    size: int
    batch_size: int
    slice_args: bool = False
    arg_positions: tuple[int, ...] = ()
    kwarg_names: tuple[str, ...] = ()


class UnknownLatentSite(RuntimeError):
    """The model sampled a latent site that has no value to substitute (``site``: its name)."""

    def __init__(self, site: str, message: str):
        super().__init__(message)
        self.site = site


def _is_identity(transform: torch.distributions.Transform) -> bool:
    while isinstance(transform, IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, ComposeTransform) and not transform.parts


class _LogJoint(Messenger):
    """Substitutes latent values, injects minibatch indices, and sums scaled log-densities.

    ``check_shapes``: refuse an observed site whose value and distribution broadcast into a
    larger log-density (:mod:`pyro_flat.observed_shapes`); off on the kernels' hot path, where
    :func:`trace_model` checked the sites once.
    """

    def __init__(
        self,
        values: dict[str, torch.Tensor],
        plate: DataPlate | None,
        batch: torch.Tensor | None,
        flat_prior_fns: dict[str, Any],
        include_prior: bool = True,
        check_shapes: bool = False,
    ):
        super().__init__()
        self.values = values
        self.plate = plate
        self.batch = batch
        self.flat_prior_fns = flat_prior_fns
        self.include_prior = include_prior
        self.check_shapes = check_shapes
        self.missed: list[str] = []
        self.log_joint: torch.Tensor | float = 0.0

    def _pyro_sample(self, msg: dict) -> None:
        if msg["is_observed"]:
            return
        value = self.values.get(msg["name"])
        if value is not None:
            msg["value"] = value
        elif (
            self.batch is not None
            and type(msg["fn"]) is _Subsample
            and msg["fn"].size == self.plate.size
            and msg["name"] == self.plate.name
        ):
            msg["value"] = self.batch

    def _pyro_post_sample(self, msg: dict) -> None:
        fn = msg["fn"]
        if type(fn) is _Subsample or msg["infer"].get("_deterministic"):
            return
        if not msg["is_observed"] and msg["name"] not in self.values:
            raise UnknownLatentSite(
                msg["name"],
                f"sample site {msg['name']!r} was not present when the kernel traced the model; "
                "SG-MCMC kernels need a model with a fixed set of latent sites",
            )
        if msg["is_observed"] and self.check_shapes:
            check_observed_site(msg)
        if not msg["is_observed"] and not self.include_prior:
            return
        scale, mask = msg["scale"], msg["mask"]
        if not msg["is_observed"] and msg["name"] in self.flat_prior_fns:
            if fn is self.flat_prior_fns[msg["name"]] and mask is None and _is_one(scale):
                return  # summed in closed form on the flat vector by FlatNormalPrior
            self.missed.append(msg["name"])
        if self.plate is not None and self.plate.slice_args:
            for frame in msg["cond_indep_stack"]:
                # A plate sized from the sliced arguments (e.g. ``pyro.plate("data", len(x))``)
                # sees only the minibatch's points and does not rescale: the kernel does, by
                # N / B (a data-parallel rank sees its part of the B points: still N / B).
                if frame.name == self.plate.name and frame.full_size != self.plate.size:
                    scale = scale * (self.plate.size / self.plate.batch_size)
        lp = None
        if mask is None and not msg["is_observed"]:
            lp = normal_log_prob_sum(fn, msg["value"])
        if lp is None:
            lp = scale_and_mask(fn.log_prob(msg["value"]), 1.0, mask).sum()
        self.log_joint = self.log_joint + (lp if _is_one(scale) else scale * lp)


def _is_one(scale: Any) -> bool:
    return isinstance(scale, float) and scale == 1.0


class ModelPotential:
    """``U(z, batch)`` of a Pyro model, for the unconstrained values ``z`` of its latent sites.

    Parameters
    ----------
    model : callable
        The Pyro model.
    model_args, model_kwargs
        Its arguments, fixed for the run.
    layout : FlatLayout
        The latent sites, with their transforms to the constrained space.
    plate : DataPlate or None
        The subsampled data plate, or None to run the model as it is (full batch, or the model's
        own plate subsampling).
    flat_prior : FlatNormalPrior, optional
        Sites whose constant Normal prior is left out of the model run; the caller adds
        ``flat_prior.value_and_grad_`` on the flat vector.

    Attributes
    ----------
    include_prior : bool
        ``False``: the likelihood term alone (no prior, no log-Jacobian), for a data-parallel
        rank whose part of the sum leaves the prior to another rank
        (:mod:`pyro_flat.distributed.data_parallel`).
    """

    include_prior: bool = True

    def __init__(
        self,
        model: Callable,
        model_args: tuple,
        model_kwargs: dict,
        layout: FlatLayout,
        plate: DataPlate | None,
        flat_prior: FlatNormalPrior | None = None,
    ):
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs)
        self.layout = layout
        self.plate = plate
        self._transformed = [s for s in layout.sites if s.transform is not None]
        self.flat_prior = flat_prior

    @property
    def _flat_prior_fns(self) -> dict[str, Any]:
        return {} if self.flat_prior is None else self.flat_prior.fns

    def _arguments(self, batch: torch.Tensor | None) -> tuple[tuple, dict]:
        plate = self.plate
        if batch is None or plate is None or not plate.slice_args:
            return self.model_args, self.model_kwargs
        args = list(self.model_args)
        for i in plate.arg_positions:
            args[i] = args[i].index_select(0, batch)
        kwargs = dict(self.model_kwargs)
        for k in plate.kwarg_names:
            kwargs[k] = kwargs[k].index_select(0, batch)
        return tuple(args), kwargs

    def __call__(
        self, params: dict[str, torch.Tensor], batch: torch.Tensor | None = None
    ) -> torch.Tensor:
        values = params
        log_det = 0.0
        if self._transformed:
            values = dict(params)
            for site in self._transformed:
                z = params[site.name]
                x = site.transform(z)
                if self.include_prior:
                    log_det = log_det + site.transform.log_abs_det_jacobian(z, x).sum()
                values[site.name] = x
        args, kwargs = self._arguments(batch)
        log_joint = _LogJoint(values, self.plate, batch, self._flat_prior_fns,
                              self.include_prior)
        with log_joint:
            self.model(*args, **kwargs)
        if log_joint.missed:
            # A prior object changed since setup: from now on it is summed in the model run.
            self.flat_prior.drop(log_joint.missed)
        return -(log_joint.log_joint + log_det)


def _leading_size(args: tuple, kwargs: dict) -> int | None:
    sizes = [a.shape[0] for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.dim() > 0]
    if not sizes:
        return None
    counts = Counter(sizes)
    return max(counts, key=lambda n: (counts[n], n))


def _observed_plates(trace: poutine.Trace) -> tuple[list[str], dict[str, Any]]:
    """Names of the observed sites, and the plates (frames) that enclose every one of them."""
    observed = [
        s
        for s in trace.nodes.values()
        if s["type"] == "sample" and s["is_observed"] and not s["infer"].get("_deterministic")
    ]
    common: dict[str, Any] | None = None
    for s in observed:
        frames = {f.name: f for f in s["cond_indep_stack"] if f.vectorized}
        common = frames if common is None else {k: v for k, v in common.items() if k in frames}
    return [s["name"] for s in observed], common or {}


def _hint_full_batch_cost(plates: dict[str, Any]) -> None:
    """Warn when a model observed on :data:`FULL_BATCH_HINT_POINTS` points or more runs full
    batch: every SG step then evaluates all of them, which the user may not have meant."""
    if not plates:
        return
    name, frame = max(plates.items(), key=lambda item: item[1].full_size)
    n = frame.full_size
    if n < FULL_BATCH_HINT_POINTS:
        return
    warnings.warn(
        f"every SG step evaluates the model on all {n:,} points of plate {name!r} (full "
        f"batch: no subsample_size), about {n / HINT_BATCH:,.0f} times the cost of a step on a "
        f"minibatch of {HINT_BATCH}. Give the kernel subsample_size=B (or the plate "
        "subsample_size=B) for minibatch steps; keep full batch if you mean it",
        UserWarning,
        stacklevel=4,
    )


def trace_model(
    model: Callable,
    model_args: tuple,
    model_kwargs: dict,
    init_strategy: Callable,
    subsample_size: int | None = None,
    data_plate: str | None = None,
) -> tuple[FlatLayout, dict[str, torch.Tensor], DataPlate | None, FlatNormalPrior | None]:
    """Run the model once to find its latent sites, their transforms, initial values and data plate.

    Every observed site is checked here, once: a value and distribution that broadcast into a
    larger log-density (targets ``(N, 1)`` against a mean ``(B,)``) raise ``ValueError``
    naming the site and both shapes (:mod:`pyro_flat.observed_shapes`).

    Returns
    -------
    layout : FlatLayout
        The latent sites in execution order.
    init : dict
        Initial *unconstrained* values from ``init_strategy``.
    plate : DataPlate or None
        The subsampled plate, or None for a full-batch model.
    flat_prior : FlatNormalPrior or None
        The sites whose prior is summed in closed form on the flat vector.
    """
    args, kwargs = tuple(model_args), dict(model_kwargs)
    setup_model = model
    slice_size = None
    if subsample_size is not None:
        # Trace on one minibatch (no full-data forward pass): slice every argument whose leading
        # dimension is N, the most common leading dimension, and inject indices into plates of N.
        slice_size = _leading_size(args, kwargs)
        if slice_size is None:
            arrays = [type(a).__name__ for a in (*args, *kwargs.values())
                      if hasattr(a, "shape") and not torch.is_tensor(a)]
            if arrays:
                raise ValueError(
                    f"subsample_size slices torch tensors, but the model's data arguments are "
                    f"{arrays}: convert them with torch.as_tensor (e.g. mcmc.run("
                    "torch.as_tensor(x), torch.as_tensor(y)))")
            raise ValueError(
                "subsample_size was given but the model has no tensor arguments to subsample; "
                "pass the data as model arguments (mcmc.run(x, y))"
            )
        if not 1 <= subsample_size <= slice_size:
            raise ValueError(
                f"subsample_size must be an integer in [1, {slice_size}] (the number of data "
                f"points), got {subsample_size}"
            )
        idx = torch.arange(subsample_size)
        positions = tuple(i for i, a in enumerate(args) if _sliceable(a, slice_size))
        names = tuple(k for k, a in kwargs.items() if _sliceable(a, slice_size))
        args = tuple(a.index_select(0, idx.to(a.device)) if i in positions else a
                     for i, a in enumerate(args))
        kwargs = {k: (a.index_select(0, idx.to(a.device)) if k in names else a)
                  for k, a in kwargs.items()}
        setup_model = InjectIndices(slice_size, idx)(model)

    with torch.no_grad():
        trace = poutine.trace(InitMessenger(init_strategy)(setup_model)).get_trace(*args, **kwargs)

    observed, common = _observed_plates(trace)
    for name in observed:  # once here, so that no SG step pays for it
        check_observed_site(trace.nodes[name])
    plate: DataPlate | None = None
    if slice_size is not None:
        sizes = (slice_size, subsample_size)
        candidates = {k: f for k, f in common.items() if f.full_size in sizes}
        name = _choose_plate(candidates, data_plate, "subsample_size")
        plate = DataPlate(name, slice_size, subsample_size, True, positions, names)
    else:
        subsampled = {k: f for k, f in common.items() if f.size < f.full_size}
        if subsampled or data_plate is not None:
            name = _choose_plate(subsampled or common, data_plate, "the model's subsampling")
            frame = common[name]
            plate = DataPlate(name, frame.full_size, frame.size)
        else:
            _hint_full_batch_cost(common)

    shapes, transforms, init = {}, {}, {}
    for name, site in latent_sites(trace).items():
        fn, value = site["fn"], site["value"]
        if fn.support.is_discrete:
            raise ValueError(
                f"site {name!r} is discrete ({type(fn).__name__}); SG-MCMC kernels need "
                "continuous latent sites: marginalise it out or make it observed"
            )
        if plate is not None and any(f.name == plate.name for f in site["cond_indep_stack"]):
            raise ValueError(
                f"latent site {name!r} is sampled inside the subsampled plate {plate.name!r}. "
                "Local latent variables are not supported by SG-MCMC kernels. If it is a "
                "PyroSample parameter of a network, run the network outside the plate: draw the "
                "indices first (`with pyro.plate(...) as ind: pass`), compute the network on "
                "x[ind], then re-enter the plate for the observation"
            )
        transform = biject_to(fn.support)
        unconstrained = transform.inv(value).detach()
        # The flat vector holds the unconstrained value, whose shape differs from the site's
        # for shape-changing transforms (simplex 3 -> 2, LKJ Cholesky 3x3 -> 3, ...).
        shapes[name] = unconstrained.shape
        if not _is_identity(transform):
            transforms[name] = transform
        init[name] = unconstrained
    if not shapes:
        raise ValueError("the model has no latent sample sites to sample")
    layout = FlatLayout.from_shapes(shapes, transforms)
    return layout, init, plate, FlatNormalPrior.from_trace(layout, trace.nodes)


def _sliceable(a: Any, size: int) -> bool:
    return torch.is_tensor(a) and a.dim() > 0 and a.shape[0] == size


def _choose_plate(candidates: dict[str, Any], requested: str | None, why: str) -> str:
    if requested is not None:
        if requested not in candidates:
            raise ValueError(
                f"data_plate={requested!r} is not a plate enclosing every observed site; "
                f"candidates: {sorted(candidates)}"
            )
        return requested
    if len(candidates) == 1:
        return next(iter(candidates))
    if not candidates:
        raise ValueError(
            f"{why} needs the observed sites inside a pyro.plate over the data "
            "(`with pyro.plate('data', N): pyro.sample(..., obs=y)`), and none was found"
        )
    raise ValueError(
        f"several plates enclose the observed sites ({sorted(candidates)}): "
        "name the one to subsample with data_plate=..."
    )
