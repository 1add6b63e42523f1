"""Tracing a Pyro model once: its latent sites, their transforms and initial values, and the
plate that is subsampled at every step (:class:`DataPlate`).

:func:`trace_model` is what an SG-MCMC kernel's setup runs; it also checks every observed
site's shapes once (:mod:`.observed_shapes`), so that no step pays for it.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyro.poutine as poutine
import torch
from pyro.infer.autoguide.initialization import InitMessenger
from torch.distributions import biject_to

from pyro_flat.target.flat_prior import FlatNormalPrior
from pyro_flat.target.layout import FlatLayout, is_identity_transform
from pyro_flat.target.observed_shapes import check_observed_site
from pyro_flat.target.sites import latent_sites
from pyro_flat.target.subsample import InjectIndices

__all__ = ["DataPlate", "TracedModel", "trace_model"]

#: A model observed on this many points or more, run full batch, is told what a step costs.
FULL_BATCH_HINT_POINTS = 10_000
#: The minibatch the full-batch hint compares with.
HINT_BATCH = 128
#: What a model whose network draws its weights inside the data plate should do instead.
_RUN_THE_NETWORK_OUTSIDE = (
    "run the network outside the plate: draw the indices first (`with pyro.plate(...) as "
    "ind: pass`), compute the network on x[ind], then re-enter the plate for the observation")



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


class TracedModel(NamedTuple):
    """What :func:`trace_model` finds in a model."""

    #: The latent sites in execution order.
    layout: FlatLayout
    #: Initial *unconstrained* values from the init strategy.
    init: dict[str, torch.Tensor]
    #: The subsampled plate, or ``None`` for a full-batch model.
    plate: DataPlate | None
    #: The sites whose prior is summed in closed form on the flat vector.
    flat_prior: FlatNormalPrior | None
    #: ``N``, the number of data points the likelihood sums over: the subsampled plate's size,
    #: else the full size of the plate that encloses every observed site (the one named by
    #: ``data_plate`` where several do); ``None`` when no plate says it.
    num_data: int | None


def _data_size(plate: DataPlate | None, common: dict[str, Any],
               data_plate: str | None) -> int | None:
    if plate is not None:
        return int(plate.size)
    if data_plate is not None and data_plate in common:
        return int(common[data_plate].full_size)
    return int(next(iter(common.values())).full_size) if len(common) == 1 else None


def trace_model(
    model: Callable,
    model_args: tuple,
    model_kwargs: dict,
    init_strategy: Callable,
    subsample_size: int | None = None,
    data_plate: str | None = None,
) -> TracedModel:
    """Run the model once to find its latent sites, their transforms, initial values and data plate.

    Every observed site is checked here, once: a value and distribution that broadcast into a
    larger log-density (targets ``(N, 1)`` against a mean ``(B,)``) raise ``ValueError``
    naming the site and both shapes (:mod:`pyro_flat.target.observed_shapes`). A model that
    raises here after drawing latent sites inside a plate (a network with ``PyroSample``
    weights run inside the data plate) raises ``ValueError`` naming those sites, from the
    model's own error.

    Returns
    -------
    TracedModel
        ``(layout, init, plate, flat_prior, num_data)``.
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

    tracer = poutine.trace(InitMessenger(init_strategy)(setup_model))
    with torch.no_grad():
        try:
            trace = tracer.get_trace(*args, **kwargs)
        except (RuntimeError, ValueError) as error:
            hint = _latents_in_plates_hint(tracer.msngr.trace)
            if hint is None:
                raise
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"the model raised {type(error).__name__}: {first_line}\n{hint}"
                             ) from error

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
                f"PyroSample parameter of a network, {_RUN_THE_NETWORK_OUTSIDE}"
            )
        transform = biject_to(fn.support)
        unconstrained = transform.inv(value).detach()
        # The flat vector holds the unconstrained value, whose shape differs from the site's
        # for shape-changing transforms (simplex 3 -> 2, LKJ Cholesky 3x3 -> 3, ...).
        shapes[name] = unconstrained.shape
        if not is_identity_transform(transform):
            transforms[name] = transform
        init[name] = unconstrained
    if not shapes:
        raise ValueError("the model has no latent sample sites to sample")
    layout = FlatLayout.from_shapes(shapes, transforms)
    return TracedModel(layout, init, plate, FlatNormalPrior.from_trace(layout, trace.nodes),
                       _data_size(plate, common, data_plate))


def _latents_in_plates_hint(partial: Any) -> str | None:
    """What to tell a user whose model raised while being traced, when latent sites were
    sampled inside a plate before it did (``None`` if none were): the usual cause is a
    network with ``PyroSample`` weights run inside the data plate, whose weights then get one
    draw per data point."""
    local = []
    for name, site in partial.nodes.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        plates = [f.name for f in site["cond_indep_stack"] if f.vectorized and f.size > 1]
        if plates:
            local.append(f"{name!r} (shape {tuple(site['value'].shape)}, in plate "
                         f"{plates[0]!r})")
    if not local:
        return None
    return ("Before it raised, these latent sites were sampled inside a plate: "
            + ", ".join(local) + ". If they are PyroSample parameters of a network, the "
            f"network ran inside the data plate and drew its weights once per data point: "
            f"{_RUN_THE_NETWORK_OUTSIDE}.")


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
