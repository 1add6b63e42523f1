r"""Draws of Pyro's common autoguides without running them: the guide half of
:class:`~pyro_flat.infer.svi.lean_elbo.LeanELBO`.

Each class here reproduces, for one autoguide, what its ``forward`` samples and what
``Trace_ELBO`` adds up from the guide's trace, without the trace: the same parameters read
through :func:`pyro.param` (so that :class:`pyro.infer.SVI` sees and optimises them), the same
random draws in the same order (so the same seed gives the same draw), the same values handed to
the model, and :math:`\log q` as the sum of the guide sites' log-densities:

- :class:`~pyro.infer.autoguide.AutoNormal`: per site
  :math:`u \sim \mathcal N(\mu, \sigma)` in the unconstrained space, the model sees
  :math:`x = T(u)`, :math:`\log q = \log\mathcal N(u; \mu, \sigma) - \log|\det J_T(u)|`;
- :class:`~pyro.infer.autoguide.AutoDiagonalNormal`: one :math:`u \sim \mathcal N(\mu,
  \mathrm{diag}\,\sigma^2)` over the concatenated unconstrained sites, cut into views per site;
- :class:`~pyro.infer.autoguide.AutoDelta`: :math:`x` is the parameter itself, :math:`\log q = 0`
  (its sites are masked).

A guide that is not exactly one of these (a subclass, ``create_plates``, a latent site inside a
plate, a guide wrapped in other handlers) is not drawn here: :func:`lean_guide` returns the
reason, and the ELBO falls back to ``Trace_ELBO``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro.infer.autoguide import AutoDelta, AutoDiagonalNormal, AutoNormal
from pyro.nn.module import _is_module_local_param_enabled
from pyro.poutine.messenger import _bound_partial, _context_wrap
from torch.distributions import biject_to
from torch.distributions.utils import _standard_normal

from pyro_flat.infer.svi.lrt import LocalReparameterization, _GuideRecorder
from pyro_flat.target import FlatLayout, FlatNormalPrior, is_identity_transform


@dataclass
class GuideDraw:
    """One draw of a guide: what the model sees and what the ELBO subtracts.

    ``values``: the constrained value of every latent site, to substitute into the model;
    ``log_q``: the sum of the guide sites' log-densities at the draw (``Trace_ELBO``'s guide
    term); ``params``: the store names of the guide parameters read, in order.
    """

    values: dict[str, torch.Tensor]
    log_q: torch.Tensor | float
    params: tuple[str, ...]
    latent: torch.Tensor | None = None  # the flat unconstrained draw (AutoDiagonalNormal)


@dataclass
class _Site:
    name: str
    shape: torch.Size
    transform: Any  # None for the identity
    event_dim: int


def _global_sites(guide: Any) -> list[_Site] | str:
    """The prototype's latent sites, or why the guide cannot be drawn here."""
    sites = []
    for name, site in guide.prototype_trace.iter_stochastic_nodes():
        if any(f.vectorized for f in site["cond_indep_stack"]):
            return f"latent site {name!r} is inside a plate"
        transform = biject_to(site["fn"].support)
        sites.append(_Site(name, site["value"].shape, None if is_identity_transform(transform)
                           else transform, site["fn"].event_dim))
    return sites


def _param(guide: Any, name: str, access: Callable[[], Any]) -> torch.Tensor:
    """``pyro.param(name)``, first registering the guide's parameter in the store if needed.

    A ``PyroModule`` puts its parameters in the param store when they are read inside its own
    context (as its ``forward`` does); ``access`` reads them there.
    """
    if name not in pyro.get_param_store():
        with guide._pyro_context:
            access()
    return pyro.param(name)


def _constrain(site: _Site, u: torch.Tensor, values: dict[str, torch.Tensor]
               ) -> torch.Tensor | float:
    """Put the site's constrained value ``x = T(u)`` in ``values``; return the guide's Delta
    site's log-density, ``T.inv.log_abs_det_jacobian(x, u)`` summed (0 for the identity)."""
    if site.transform is None:
        values[site.name] = u
        return 0.0
    x = site.transform(u)
    values[site.name] = x
    return site.transform.inv.log_abs_det_jacobian(x, u).sum()


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _standard_log_density(eps: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    r""":math:`-\tfrac12\sum\epsilon^2 - \sum\log\sigma - \tfrac n2\log 2\pi`; the part
    without gradient (:math:`\epsilon` is a constant) as one dot product."""
    e = eps.reshape(-1)
    return -(0.5 * torch.dot(e, e) + e.numel() * _HALF_LOG_2PI) - scale.log().sum()


def _normal_draw(loc: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``u = loc + eps * scale`` as ``Normal.rsample`` draws it, and :math:`\log\mathcal N(u;
    \mu, \sigma)` summed, written with the standardised draw:
    :math:`-\tfrac12\sum\epsilon^2 - \sum\log\sigma - \tfrac n2\log 2\pi`.

    ``Normal.log_prob`` computes :math:`((u - \mu)/\sigma)^2` from :math:`u`, whose derivative in
    :math:`\mu` is :math:`0` and in :math:`\sigma` cancels with that of :math:`u`: the same value
    and gradients up to rounding, with four fewer passes over the parameters.
    """
    eps = _standard_normal(loc.shape, dtype=loc.dtype, device=loc.device)
    return loc + eps * scale, _standard_log_density(eps, scale)


def _flat_prior(guide: Any, sites: list[_Site], shapes: list[torch.Size]
                ) -> FlatNormalPrior | None:
    """The sites' constant Normal priors, summed on their concatenated unconstrained draws."""
    layout = FlatLayout.from_shapes(
        {s.name: shape for s, shape in zip(sites, shapes, strict=True)},
        {s.name: s.transform for s in sites if s.transform is not None})
    return FlatNormalPrior.from_trace(layout, guide.prototype_trace.nodes)


class LeanGuide:
    """Base: draws a guide's sample and its log-density as ``Trace_ELBO`` would see them."""

    def __init__(self, guide: Any, lrt: LocalReparameterization | None):
        self.guide = guide
        self.lrt = lrt
        self.prefix = f"{guide._pyro_name}." if guide._pyro_name else ""

    def _remember(self, value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> None:
        """What the LRT recorder remembers of a Normal draw (for the model's layers)."""
        if self.lrt is not None:
            import weakref

            self.lrt._draws[id(value)] = (weakref.ref(value), loc, scale)

    #: Sites whose constant Normal prior :meth:`log_prior` sums on the flat draw; the model run
    #: leaves them out while their prior is the same object (see :mod:`.flat_prior`).
    flat_prior: FlatNormalPrior | None = None

    def draw(self) -> GuideDraw:  # pragma: no cover - abstract
        raise NotImplementedError

    def log_prior(self, draw: GuideDraw, missed: list[str]) -> torch.Tensor | float:
        """The flat prior's log-density at the draw; ``missed`` sites (their prior object
        changed, so the model run summed them) leave the flat prior for good first."""
        if self.flat_prior is None:
            return 0.0
        if missed:
            self.flat_prior.drop(missed)
        return self.flat_prior.log_density(draw.latent)


class LeanAutoNormal(LeanGuide):
    """:class:`~pyro.infer.autoguide.AutoNormal`: one Normal per site.

    The sites' means and scales are concatenated and drawn as one vector (each site's noise
    filled in its slice, in site order: the numbers ``Normal.rsample`` draws site by site), so
    the draw and its log-density take a handful of operations whatever the number of sites.
    """

    def __init__(self, guide: AutoNormal, sites: list[_Site], lrt: Any):
        super().__init__(guide, lrt)
        self.sites = sites
        self.names = [(f"{self.prefix}locs.{s.name}", f"{self.prefix}scales.{s.name}")
                      for s in sites]
        self.shapes = [biject_to(guide.prototype_trace.nodes[s.name]["fn"].support)
                       .inv.forward_shape(s.shape) for s in sites]
        self.sizes = [shape.numel() for shape in self.shapes]
        self.flat_prior = _flat_prior(guide, sites, self.shapes)

    def draw(self) -> GuideDraw:
        if self.lrt is not None:
            self.lrt._draws.clear()
        locs, scales = [], []
        for site, (loc_name, scale_name) in zip(self.sites, self.names, strict=True):
            access = functools.partial(self.guide._get_loc_and_scale, site.name)
            locs.append(_param(self.guide, loc_name, access))
            scales.append(_param(self.guide, scale_name, access))
        loc = torch.cat([t.reshape(-1) for t in locs])
        scale = torch.cat([t.reshape(-1) for t in scales])
        eps = torch.empty_like(loc, requires_grad=False)
        for part in eps.split(self.sizes):
            part.normal_()
        latent = loc + eps * scale
        log_q = _standard_log_density(eps, scale)
        values: dict[str, torch.Tensor] = {}
        for site, shape, u, site_loc, site_scale in zip(
                self.sites, self.shapes, latent.split(self.sizes), locs, scales, strict=True):
            u = u.view(shape)
            self._remember(u, site_loc, site_scale)
            log_q = log_q + _constrain(site, u, values)
        return GuideDraw(values, log_q, tuple(n for pair in self.names for n in pair), latent)


class LeanAutoDiagonalNormal(LeanGuide):
    """:class:`~pyro.infer.autoguide.AutoDiagonalNormal`: one Normal over all sites."""

    def __init__(self, guide: AutoDiagonalNormal, sites: list[_Site], lrt: Any):
        super().__init__(guide, lrt)
        self.sites = sites
        self.unconstrained = [guide._unconstrained_shapes[s.name] for s in sites]
        self.sizes = [shape.numel() for shape in self.unconstrained]
        self.names = (f"{self.prefix}loc", f"{self.prefix}scale")
        self.flat_prior = _flat_prior(guide, sites, self.unconstrained)

    def draw(self) -> GuideDraw:
        if self.lrt is not None:
            self.lrt._draws.clear()
        loc = _param(self.guide, self.names[0], lambda: self.guide.loc)
        scale = _param(self.guide, self.names[1], lambda: self.guide.scale)
        latent, log_q = _normal_draw(loc, scale)
        self._remember(latent, loc, scale)
        values: dict[str, torch.Tensor] = {}
        # one split (its backward is one concatenation), not one slice per site (whose
        # backward scatters into a full-size zero tensor each)
        pieces = latent.split(self.sizes)
        for site, shape, piece in zip(self.sites, self.unconstrained, pieces, strict=True):
            log_q = log_q + _constrain(site, piece.view(shape), values)
        return GuideDraw(values, log_q, self.names, latent)


class LeanAutoDelta(LeanGuide):
    """:class:`~pyro.infer.autoguide.AutoDelta`: the parameters are the values."""

    def __init__(self, guide: AutoDelta, sites: list[_Site], lrt: Any):
        super().__init__(guide, lrt)
        self.sites = sites
        self.names = tuple(f"{self.prefix}{s.name}" for s in sites)

    def draw(self) -> GuideDraw:
        values = {}
        for site, name in zip(self.sites, self.names, strict=True):
            values[site.name] = _param(self.guide, name, functools.partial(
                functools.reduce, getattr, site.name.split("."), self.guide))
        return GuideDraw(values, 0.0, self.names)


_KINDS: dict[type, type[LeanGuide]] = {
    AutoNormal: LeanAutoNormal,
    AutoDiagonalNormal: LeanAutoDiagonalNormal,
    AutoDelta: LeanAutoDelta,
}


def unwrap_lrt(guide: Any) -> tuple[Any, LocalReparameterization | None]:
    """``(inner guide, lrt)`` for ``lrt.guide(inner)``; ``(guide, None)`` otherwise."""
    fn = guide.func if isinstance(guide, _bound_partial) else guide
    if (isinstance(fn, functools.partial) and fn.func is _context_wrap
            and len(fn.args) == 2 and isinstance(fn.args[0], _GuideRecorder)):
        return fn.args[1], fn.args[0].lrt
    return guide, None


def lean_guide(guide: Any, args: tuple, kwargs: dict) -> LeanGuide | str:
    """A :class:`LeanGuide` for ``guide``, or the reason it has none.

    Sets the guide's prototype up (as its first call would) if it has not run yet.
    """
    inner, lrt = unwrap_lrt(guide)
    kind = _KINDS.get(type(inner))
    if kind is None:
        return (f"the guide is a {type(inner).__name__}, not one of "
                f"{', '.join(k.__name__ for k in _KINDS)}")
    if inner.create_plates is not None:
        return "the guide has create_plates"
    if inner._forward_hooks or inner._forward_pre_hooks:
        return "the guide has forward hooks"
    if _is_module_local_param_enabled():
        return "PyroModule local parameters are enabled"
    if inner.prototype_trace is None:
        inner._setup_prototype(*args, **kwargs)
    sites = _global_sites(inner)
    if isinstance(sites, str):
        return sites
    return kind(inner, sites, lrt)


