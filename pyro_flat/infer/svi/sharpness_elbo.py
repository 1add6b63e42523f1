r"""F-SGVB: the ELBO of the sharpness-aware posterior, as a Pyro loss for ``SVI``.

Nguyen et al. (2023, eq. 7) fit a Gaussian :math:`q(w) = \mathcal N(\mu, \sigma^2)` to the
sharpness-aware posterior by minimising
:math:`\mathbb E_{z}\big[\max_{\|\mu' - \mu\|_{D^{-1}} \le \rho} L(\mu' + \sigma \odot z)\big]
+ \mathrm{KL}(q \,\|\, p)`, the inner maximum taken by one normalised ascent step on the
means, with the reparameterised noise :math:`z` held fixed. :class:`SharpnessAwareELBO` is that
loss for :class:`pyro.infer.SVI`: both gradient passes of a particle happen inside
:meth:`~SharpnessAwareELBO.loss_and_grads`, so any ``pyro.optim`` optimiser takes the step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyro
import torch
from pyro.infer.autoguide import AutoContinuous, AutoDelta, AutoNormal
from pyro.infer.util import torch_item
from pyro.util import get_rng_state, set_rng_state, warn_if_nan

from pyro_flat import validation
from pyro_flat.infer.svi.lean_elbo import LeanELBO
from pyro_flat.infer.svi.lean_guides import LeanGuide
from pyro_flat.models.batchnorm import find_batchnorm, kept_running_stats
from pyro_flat.optim.ascent import ascent_perturbation

#: Name tokens (split at ``.`` and ``_``) that mark a guide parameter as a *mean*, each with the
#: tokens tried, in order, for its paired *scale*.
MEAN_TOKENS: dict[str, tuple[str, ...]] = {
    "loc": ("scale", "sigma", "std"),
    "locs": ("scales",),
    "mu": ("sigma", "scale", "std"),
    "mean": ("std", "scale", "sigma"),
}
_SCALE_TOKENS = frozenset({"scale", "scales", "sigma", "std"})
_SPLIT = re.compile(r"([._])")


def _autoguides(guide: Any) -> list[Any]:
    if not isinstance(guide, torch.nn.Module):
        return []
    return [m for m in guide.modules() if isinstance(m, (AutoDelta, AutoNormal, AutoContinuous))]


def default_mean_and_scale(name: str, store_names: Iterable[str], guide: Any = None) -> (
        tuple[bool, str | None]):
    """The documented rule: is guide parameter ``name`` a mean, and which parameter is its scale.

    Parameters of Pyro's autoguides (``guide`` itself or any of its submodules, e.g. in an
    ``AutoGuideList``) go by their structure, whatever the model's site names: every parameter
    of an :class:`~pyro.infer.autoguide.AutoDelta` is a mean without a scale; ``{p}.locs.{site}``
    of an :class:`~pyro.infer.autoguide.AutoNormal` named ``p`` is a mean with scale
    ``{p}.scales.{site}``; ``{p}.loc`` of an ``AutoContinuous`` guide (``AutoDiagonalNormal``,
    ``AutoMultivariateNormal``, ``AutoLowRankMultivariateNormal``, ...) is a mean with scale
    ``{p}.scale``; their other parameters are not means.

    Other (hand-written) parameters go by name: ``name`` is split into tokens at ``.`` and
    ``_``; it is a mean if one of its tokens is in :data:`MEAN_TOKENS` (``loc``, ``locs``,
    ``mu``, ``mean``) and none is a scale token (``scale``, ``scales``, ``sigma``, ``std``). Its
    scale is the first existing parameter named as ``name`` with the last mean token replaced by
    one of its scale tokens: ``w_loc`` -> ``w_scale``, ``b_mu`` -> ``b_sigma``,
    ``layer.weight_mean`` -> ``layer.weight_std``.
    """
    names = set(store_names)
    for m in _autoguides(guide):
        pre = f"{m._pyro_name}." if m._pyro_name else ""
        if not name.startswith(pre):
            continue
        rest = name[len(pre):]
        if isinstance(m, AutoDelta):
            return True, None
        if isinstance(m, AutoNormal):
            if rest.startswith("locs."):
                return True, pre + "scales." + rest[len("locs."):]
            return False, None
        if isinstance(m, AutoContinuous):
            if rest == "loc":
                return True, (pre + "scale") if pre + "scale" in names else None
            return False, None
    parts = _SPLIT.split(name)
    tokens = [p.lower() for p in parts[::2]]
    if _SCALE_TOKENS.intersection(tokens):
        return False, None
    hits = [i for i, t in enumerate(tokens) if t in MEAN_TOKENS]
    if not hits:
        return False, None
    i = hits[-1]
    original = parts[2 * i]
    for token in MEAN_TOKENS[tokens[i]]:
        candidate = token.upper() if original.isupper() else (
            token.capitalize() if original[:1].isupper() else token)
        trial = "".join(parts[:2 * i] + [candidate] + parts[2 * i + 1:])
        if trial in names:
            return True, trial
    return True, None


class SharpnessAwareELBO(LeanELBO):
    r"""The sharpness-aware ELBO of F-SGVB: the ELBO of :class:`~pyro.infer.Trace_ELBO` whose
    gradient is taken at means moved one ascent step up the loss.

    **Target**: the Gaussian (or delta) guide closest to the sharpness-aware posterior
    :math:`q_{SA}(w) \propto \exp\big(-\max_{\|w' - w\| \le \rho} L(w')\big)\, p(w)`,
    through :math:`\min_{\mu,\sigma}\ \mathbb E_z\big[\max_{\|\mu'-\mu\|_{D^{-1}} \le \rho}
    \ell(\mu', \sigma; z)\big]`, with :math:`\ell` the single-sample negative ELBO.

    **One particle** (the guide's noise :math:`z` drawn once, used by both passes):

    .. math::

        g &= \nabla_\mu\, \ell(\mu, \sigma; z), \qquad
            w = \mu + \sigma \odot z, \\
        \mu' &= \mu + \rho\, \frac{D g}{\sqrt{g^\top D g}}, \qquad
            D = I \ \ \text{or}\ \ D = \mathrm{diag}(1/\sigma)\ (\texttt{geometry=True}), \\
        \nabla_{(\mu, \sigma)} &\mathrel{+}= \tfrac{1}{P}\,
            \nabla_{(\mu', \sigma)}\, \ell(\mu', \sigma; z)
            \quad\text{(accumulated into the parameters at } \mu\text{)}.

    :math:`D g / \sqrt{g^\top D g}` is the steepest-ascent direction in the ball
    :math:`(\mu'-\mu)^\top D^{-1} (\mu'-\mu) \le \rho^2`, so the step has that norm exactly
    :math:`\rho`. :math:`\ell` is Pyro's single-particle ELBO estimator (``Trace_ELBO``'s
    surrogate), so :math:`g` is its *pathwise* gradient: the gradient of the whole negative log
    joint (likelihood and prior) at :math:`w`, as :class:`~pyro_flat.infer.SASGLD` ascends the
    whole potential. The means are moved in the unconstrained space where Pyro's optimiser moves
    them; then the same noise is replayed (the random-number state is restored before the second
    run of the guide and model, so the model also sees the same minibatch) and the means are
    restored exactly after the backward pass. The returned loss is the ELBO estimate at
    :math:`\mu`, as ``Trace_ELBO`` returns. A zero or non-finite :math:`g` gives
    :math:`\mu' = \mu` (the step is :func:`pyro_flat.optim.ascent.ascent_perturbation`).

    **The paper's ambiguity about** :math:`\sigma`: here :math:`\sigma` (and every other
    parameter that is not a mean, e.g. in the model) takes its gradient at :math:`\mu'`, not at
    :math:`\mu`. The objective is :math:`F(\mu,\sigma) = \mathbb E_z \max_{\delta}
    \ell(\mu + \delta, \sigma; z)`; by Danskin's theorem its gradient in :math:`\sigma` is the
    partial derivative *at the maximiser* :math:`\mu + \delta^\star`, so taking it at
    :math:`\mu` would descend a different objective (the plain ELBO in :math:`\sigma`). It also
    keeps one backward pass per particle. The KL part of :math:`\ell` is Trace_ELBO's
    Monte Carlo estimate at :math:`w' = \mu' + \sigma z`: the entropy term does not depend on
    :math:`\mu`, the prior term moves with the likelihood, as in SASGLD.

    **Which parameters are means, which are scales** (:func:`default_mean_and_scale`): for Pyro's
    autoguides by their structure, ``AutoNormal.locs.*`` / ``AutoNormal.scales.*``,
    ``AutoDiagonalNormal.loc`` / ``.scale`` (also ``AutoMultivariateNormal``,
    ``AutoLowRankMultivariateNormal``: their ``loc``, with ``scale`` as diagonal weight), every
    parameter of an ``AutoDelta`` (then the loss is SAM on the MAP objective); for hand-written
    guides by name, names whose ``.``/``_``-separated tokens contain ``loc``, ``mu`` or ``mean``
    (scale: the same name with ``scale``, ``sigma`` or ``std``). ``mean_params`` (names, or a
    predicate of the name) and ``scale_params`` (``{mean: scale}``) override the rule. The
    geometry variant needs a scale for every mean; a missing one raises ``ValueError`` naming it.

    **Particles.** With ``num_particles = P`` run one after the other, every particle has its
    own :math:`z`, :math:`g` and :math:`\mu'`: the paper's :math:`\mathbb E_z \max`. With
    ``vectorize_particles=True`` the ``P`` particles share one guide run, and so one set of
    means: :math:`g` is then the gradient of the ``P``-particle average and one ascent step is
    shared by them (SAM on the ``P``-sample ELBO; the maximum moves outside the average over
    those ``P`` particles). Both coincide for ``P = 1`` and both are ``Trace_ELBO`` at
    ``rho = 0``.

    With :class:`~pyro_flat.infer.LocalReparameterization` wrapping model and guide, the replayed
    random state also replays the pre-activation noise: that is F-SGVB-LRT.

    **Lean path**: for the guides :class:`~pyro_flat.infer.LeanELBO` covers (``AutoNormal``,
    ``AutoDiagonalNormal``, ``AutoDelta``, also under local reparameterisation) both passes are
    LeanELBO's, with its cost; for other guides (``AutoLowRankMultivariateNormal``,
    ``AutoMultivariateNormal``, hand-written guides) both passes run on ``Trace_ELBO``'s traces,
    still with the ascent step, and a ``UserWarning`` says so once (:meth:`fallback_message`).

    **Cost**: two forward and backward passes per particle (the first backward only to the
    means), so about twice the ELBO it is built on (docs/methods/sharpness_aware_svi.md).
    With ``rho = 0`` the second pass is skipped: loss and gradients are ``Trace_ELBO``'s at the
    same seed (to float rounding on the lean path, exactly otherwise).

    Parameters
    ----------
    rho : float
        Radius :math:`\rho \ge 0` of the ball around the means (the paper uses 0.05 on
        CIFAR-10); ``0`` is ``Trace_ELBO``.
    geometry : bool
        Use :math:`D = \mathrm{diag}(1/\sigma)` (the paper's "+ Geometry" variant) instead of
        :math:`D = I`.
    radius : {"metric", "euclidean"}
        What :math:`\rho` bounds in the geometry variant. ``"metric"`` (default, the paper's):
        the :math:`D^{-1}` norm, :math:`\sqrt{e^\top D^{-1} e} = \rho`; the step's Euclidean
        length is then :math:`\rho\,\|Dg\|_2 / \sqrt{g^\top D g}`, which grows with
        :math:`1/\sigma` (several times :math:`\rho` for the small scales of a trained
        BNN guide), so F-SGVB and its geometry variant at the same ``rho`` take steps of different
        lengths. ``"euclidean"``: the same direction :math:`Dg` scaled to Euclidean length
        :math:`\rho`, :math:`e = \rho\, Dg / \|Dg\|_2`, to compare the two variants at the
        same radius. Without ``geometry`` both are SAM's step.
    mean_params : iterable of str or callable, optional
        The mean parameters (param-store names), or a predicate ``name -> bool``; replaces the
        name rule for means.
    scale_params : mapping, optional
        ``{mean name: scale name}``; replaces the name rule for scales (used by ``geometry``).
    batchnorm_modules : iterable of torch.nn.Module
        BatchNorm layers whose running statistics must not move in the perturbed pass, besides
        those :func:`~pyro_flat.infer.mcmc.sharpness.find_batchnorm` finds on the model: their
        buffers are restored after it, so they move once per step, from the pass at :math:`\mu`.
    **kwargs
        The arguments of :class:`pyro.infer.Trace_ELBO` (``num_particles``,
        ``vectorize_particles``, ``max_plate_nesting``, ``retain_graph``, ...).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import SVI
    >>> from pyro.infer.autoguide import AutoNormal
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)
    >>> pyro.clear_param_store()
    >>> x = torch.randn(50, 2); y = x @ torch.tensor([1.0, -1.0]) + 0.5 * torch.randn(50)
    >>> guide = AutoNormal(model)
    >>> svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), SharpnessAwareELBO(rho=0.05))
    >>> for _ in range(100):
    ...     loss = svi.step(x, y)
    >>> guide.median()["w"]  # doctest: +SKIP
    tensor([ 1.0041, -0.9779])

    References
    ----------
    Nguyen, V.-A., Vuong, T.-L., Phan, H., Do, T.-T., Phung, D. & Le, T. (2023). Flat Seeking
    Bayesian Neural Networks. NeurIPS (F-SGVB, eq. 7 and its one-step solution).
    Foret, P. et al. (2021). Sharpness-aware minimization for efficiently improving
    generalization. ICLR.
    """

    def __init__(
        self,
        rho: float = 0.05,
        geometry: bool = False,
        *,
        radius: str = "metric",
        mean_params: Iterable[str] | Callable[[str], bool] | None = None,
        scale_params: Mapping[str, str] | None = None,
        batchnorm_modules: Iterable[torch.nn.Module] = (),
        **kwargs: Any,
    ):
        self.rho = validation.nonnegative("rho", rho)
        self.geometry = bool(geometry)
        if radius not in ("metric", "euclidean"):
            raise ValueError(f"radius must be 'metric' or 'euclidean', got {radius!r}")
        self.radius = radius
        if mean_params is not None and not callable(mean_params):
            if isinstance(mean_params, str):
                raise ValueError("mean_params must be an iterable of names or a predicate, "
                                 f"got the string {mean_params!r}")
            mean_params = frozenset(mean_params)
        self.mean_params = mean_params
        self.scale_params = dict(scale_params) if scale_params is not None else None
        self.batchnorm_modules = list(batchnorm_modules)
        for m in self.batchnorm_modules:
            if not isinstance(m, torch.nn.modules.batchnorm._NormBase):
                raise ValueError("batchnorm_modules must hold BatchNorm modules, got "
                                 f"{type(m).__name__}")
        self._rule_cache: tuple[tuple[str, ...], list[tuple[str, str | None]]] | None = None
        super().__init__(**kwargs)

    # ----------------------------------------------------------------------------- the rule

    def _classify(self, guide: Any, names: tuple[str, ...]) -> list[tuple[str, str | None]]:
        """``(mean, scale or None)`` for the means among the guide's parameters ``names``."""
        store_names = list(pyro.get_param_store().keys())
        out = []
        for name in names:
            is_mean, scale = default_mean_and_scale(name, store_names, guide)
            if self.mean_params is not None:
                is_mean = (self.mean_params(name) if callable(self.mean_params)
                           else name in self.mean_params)
            if not is_mean:
                continue
            if self.scale_params is not None:
                scale = self.scale_params.get(name)
            out.append((name, scale))
        return out

    def _means(self, guide: Any, names: tuple[str, ...]) -> list[tuple[str, torch.Tensor,
                                                                     torch.Tensor | None]]:
        """``(name, unconstrained mean tensor, scale or None)`` for the guide's mean params
        among its parameters ``names``."""
        store = pyro.get_param_store()
        if self._rule_cache is None or self._rule_cache[0] != names:
            self._rule_cache = (names, self._classify(guide, names))
        out = []
        for name, scale in self._rule_cache[1]:
            sigma = None
            if self.geometry:
                if scale is None or scale not in store:
                    raise ValueError(
                        f"geometry=True needs a scale for the mean parameter {name!r}; pass "
                        "scale_params={mean: scale} (or use geometry=False)")
                sigma = store[scale].detach()
                if sigma.shape != store._params[name].shape:
                    sigma = sigma.expand_as(store._params[name])
            out.append((name, store._params[name], sigma))
        if self.mean_params is not None and not callable(self.mean_params):
            missing = sorted(self.mean_params - {n for n, _, _ in out})
            if missing:
                raise ValueError(f"mean_params names {missing} are not parameters of the guide")
        return out

    def fallback_message(self, reason: str) -> str:
        """What happens for a guide the lean path does not cover: with ``rho > 0`` the
        sharpness-aware step on Trace_ELBO's traces, with ``rho = 0`` Trace_ELBO."""
        if self.rho == 0.0:
            return super().fallback_message(reason)
        return (
            f"{type(self).__name__} takes its sharpness-aware step on Trace_ELBO's traces here "
            f"instead of LeanELBO's lean path ({reason}): loss_and_grads (what SVI.step calls) "
            f"still takes the gradient at the guide's means moved one ascent step of radius "
            f"rho={self.rho:g} (the means chosen by mean_params or default_mean_and_scale, e.g. "
            "an AutoContinuous guide's loc; the other parameters take their gradient there "
            "too), with two traced passes of model and guide per particle, about twice "
            "Trace_ELBO's cost; loss() and differentiable_loss() are Trace_ELBO's at the "
            "unmoved means"
        )

    # ------------------------------------------------------------------------- the estimator

    def _ascent_step(self, grads: list[torch.Tensor | None],
                     means: list[tuple[str, torch.Tensor, torch.Tensor | None]]
                     ) -> list[torch.Tensor | None] | None:
        """:math:`\\rho D g / \\sqrt{g^\\top D g}` per mean (None where a mean has no
        gradient); None if g is zero or non-finite."""
        metric = [s.reciprocal() for _, _, s in means] if self.geometry else None
        step = ascent_perturbation(grads, self.rho, metric=metric)
        if step is None or metric is None or self.radius == "metric":
            return step
        length = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(e) for e in step if e is not None]))
        return [None if e is None else e.mul_(self.rho / float(length)) for e in step]

    def _batchnorm(self, model: Any) -> list[torch.nn.Module]:
        found = {id(m): m for m in find_batchnorm(model)}
        found.update({id(m): m for m in self.batchnorm_modules})
        return list(found.values())

    def _backward(self, surrogate: Any, model_trace: Any, guide_trace: Any) -> None:
        """Accumulate ``surrogate / P`` into the parameters, as ``Trace_ELBO`` does."""
        trainable_params = any(site["type"] == "param" for trace in (model_trace, guide_trace)
                               for site in trace.nodes.values())
        if trainable_params and getattr(surrogate, "requires_grad", False):
            (surrogate / self.num_particles).backward(retain_graph=self.retain_graph)

    def _sharp_particle(self, model, guide, args, kwargs, vectorized: bool) -> float:
        rng = get_rng_state()
        get = self._get_vectorized_trace if vectorized else self._get_trace
        model_trace, guide_trace = get(model, guide, args, kwargs)
        loss, surrogate = self._differentiable_loss_particle(model_trace, guide_trace)
        names = tuple(n for n, s in guide_trace.nodes.items() if s["type"] == "param")
        means = [t for t in self._means(guide, names) if t[1].requires_grad]
        if not (means and getattr(surrogate, "requires_grad", False)):
            # nothing to perturb: this pass is Trace_ELBO's
            self._backward(surrogate, model_trace, guide_trace)
            return loss
        grads = torch.autograd.grad(surrogate, [m for _, m, _ in means], allow_unused=True)
        del model_trace, guide_trace, surrogate

        def second_pass() -> None:
            model_trace, guide_trace = get(model, guide, args, kwargs)
            _, surrogate = self._differentiable_loss_particle(model_trace, guide_trace)
            self._backward(surrogate, model_trace, guide_trace)

        self._at_perturbed_means(list(grads), means, model, rng, second_pass)
        return loss

    def _lean_sharp_particle(self, lean: LeanGuide, model: Callable, args: tuple,
                             kwargs: dict) -> float:
        """One particle on the lean path (:class:`~pyro_flat.infer.svi.LeanELBO`)."""
        rng = get_rng_state()
        first, draw = self.particle(lean, model, args, kwargs)
        loss = torch_item(first)
        means = [t for t in self._means(lean.guide, draw.params) if t[1].requires_grad]
        if not (means and getattr(first, "requires_grad", False)):
            if getattr(first, "requires_grad", False):  # nothing to perturb: LeanELBO's pass
                (first / self.num_particles).backward(retain_graph=self.retain_graph)
            return loss
        grads = torch.autograd.grad(first, [m for _, m, _ in means], allow_unused=True)
        del first, draw

        def second_pass() -> None:
            second, _ = self.particle(lean, model, args, kwargs)
            (second / self.num_particles).backward(retain_graph=self.retain_graph)

        self._at_perturbed_means(list(grads), means, model, rng, second_pass)
        return loss

    def _at_perturbed_means(self, grads: list[torch.Tensor | None],
                            means: list[tuple[str, torch.Tensor, torch.Tensor | None]],
                            model: Any, rng: Any, second_pass: Callable[[], None]) -> None:
        """Move the means by the ascent step, replay the random state, run ``second_pass``
        (which accumulates the gradients), and restore the means exactly."""
        step = self._ascent_step(grads, means)
        saved = []  # (mean, its value at mu) for the means that move
        if step is not None:
            with torch.no_grad():
                for (_, m, _), e in zip(means, step, strict=True):
                    if e is not None:
                        saved.append((m, m.detach().clone()))
                        m.add_(e)
        try:
            with kept_running_stats(self._batchnorm(model)):  # stats move once per step
                set_rng_state(rng)  # the same noise z (and minibatch) as the first pass
                second_pass()
        finally:
            with torch.no_grad():
                for m, value in saved:
                    m.copy_(value)  # exact restore, not mu' - e

    def loss_and_grads(self, model: Callable, guide: Callable, *args: Any,
                       **kwargs: Any) -> float:
        """Estimate the ELBO at the current parameters and accumulate the sharpness-aware
        gradients into them (see the class docstring). Returns the loss at :math:`\\mu`."""
        if self.rho == 0.0:
            return super().loss_and_grads(model, guide, *args, **kwargs)
        lean = self.lean_guide(guide, args, kwargs)
        if lean is not None:
            loss = 0.0
            for _ in range(self.num_particles):
                loss += self._lean_sharp_particle(lean, model, args, kwargs) / self.num_particles
            warn_if_nan(loss, "loss")
            return loss
        if self.vectorize_particles:
            if self.max_plate_nesting == float("inf"):
                self._guess_max_plate_nesting(model, guide, args, kwargs)
            # one trace holds all P particles: its loss is their sum (as in Trace_ELBO)
            loss = self._sharp_particle(model, guide, args, kwargs, vectorized=True) \
                / self.num_particles
        else:
            loss = 0.0
            for _ in range(self.num_particles):
                loss += self._sharp_particle(model, guide, args, kwargs, vectorized=False) \
                    / self.num_particles
        warn_if_nan(loss, "loss")
        return loss
