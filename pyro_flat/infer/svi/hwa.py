r"""HWA: averaging the variational parameters of SVI over a cyclical learning rate.

From (pre-)trained variational parameters, :class:`HWA` runs the wrapped
:class:`pyro.infer.SVI` with a learning rate that falls linearly from :math:`\gamma_2` to
:math:`\gamma_1` over each cycle of :math:`c` steps,

.. math:: \gamma_t = \gamma_2 + (\gamma_1 - \gamma_2)\,\frac{t \bmod c}{c - 1}
    \quad (\gamma_t = \gamma_1 \text{ if } c = 1),

and after the last step of every cycle folds the current parameters :math:`\phi` into running
moments (Algorithm 1 of the HWA paper):

.. math:: \bar\phi \leftarrow \frac{n\bar\phi + \phi}{n + 1}, \qquad
    s \leftarrow \frac{n s + \phi^2}{n + 1}, \qquad \mathrm{var} = s - \bar\phi^2 .

The paper's variance recursion subtracts the squared mean inside the running average, which is
not the variance of the snapshots; the second-moment form above (SWAG's) is, and it is computed
with Welford's update, which has no cancellation when the variance is small. Averages are taken
per element in the *unconstrained* space, where Pyro's optimiser moves the parameters (a scale
parameter is averaged as its log). The paper leaves :math:`\gamma_1, \gamma_2, c` open: they are
arguments here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer import SVI

from pyro_flat import validation


class HWA:
    """Cyclical-learning-rate SVI whose variational parameters are averaged every cycle.

    Parameters
    ----------
    svi : pyro.infer.SVI
        With a :class:`pyro.optim.PyroOptim` optimiser (e.g. ``pyro.optim.Adam``); HWA sets the
        ``lr`` of its per-parameter torch optimisers before every step.
    lr_bounds : (float, float)
        :math:`(\\gamma_1, \\gamma_2)`, the lowest and the highest learning rate,
        ``0 < gamma1 <= gamma2``.
    cycle_length : int
        :math:`c \\ge 1` steps per cycle; one snapshot per cycle.
    scale : {"average", "snapshots"}
        The scales of the averaged guide (:meth:`swapped`, :meth:`averaged_guide`).
        ``"average"`` (default): every parameter, scales included, is its running average (a
        scale is averaged as its unconstrained value, e.g. its log). ``"snapshots"``: the
        paper's :math:`\\sigma^{HWA}` (Algorithm 1, line 11): each mean's scale is
        the standard deviation of that mean's snapshots, :math:`\\sqrt{s - \\bar\\mu^2}`
        (at least the smallest positive float), and the fitted scales are not used. Means
        and scales are paired by
        :func:`~pyro_flat.infer.svi.sharpness_elbo.default_mean_and_scale` (``AutoNormal``,
        ``AutoDiagonalNormal``, hand-written ``*_loc`` / ``*_scale`` guides); it needs two
        snapshots. ``"average"`` is the default because the spread of the snapshots measures
        how far the cyclical learning rate moves the means, which :math:`\\gamma_1,
        \\gamma_2, c` set, rather than the posterior's width that SVI fitted into the scales.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import SVI, Trace_ELBO, Predictive
    >>> from pyro.infer.autoguide import AutoNormal
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> pyro.clear_param_store()
    >>> y = torch.randn(100) + 3.0
    >>> guide = AutoNormal(model)
    >>> svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    >>> hwa = HWA(svi, lr_bounds=(0.001, 0.01), cycle_length=10)
    >>> for _ in range(100):
    ...     loss = hwa.step(y)
    >>> hwa.num_snapshots
    10
    >>> draws = Predictive(model, guide=hwa.averaged_guide(), num_samples=50)(y)

    References
    ----------
    Anonymous authors. HWA: Averaging hyperparameters in Bayesian neural networks leads to
    better generalization. Manuscript under double-blind review.
    Izmailov, P. et al. (2018). Averaging weights leads to wider optima and better
    generalization. UAI.
    """

    def __init__(self, svi: SVI, lr_bounds: tuple[float, float], cycle_length: int,
                 scale: str = "average"):
        if not isinstance(svi, SVI):
            raise ValueError(f"svi must be a pyro.infer.SVI, got {type(svi).__name__}")
        if not hasattr(svi.optim, "optim_objs"):
            raise ValueError("svi.optim must be a pyro.optim.PyroOptim (e.g. pyro.optim.Adam)")
        try:
            low, high = (float(v) for v in lr_bounds)
        except (TypeError, ValueError):
            raise ValueError(f"lr_bounds must be a pair (gamma1, gamma2), got {lr_bounds!r}"
                             ) from None
        validation.positive("lr_bounds[0]", low)
        validation.positive("lr_bounds[1]", high)
        if low > high:
            raise ValueError(f"lr_bounds must satisfy 0 < gamma1 <= gamma2, got {lr_bounds!r}")
        self.svi = svi
        self.lr_bounds = (low, high)
        self.cycle_length = validation.integer_at_least("cycle_length", cycle_length, 1)
        if scale not in ("average", "snapshots"):
            raise ValueError(f"scale must be 'average' or 'snapshots', got {scale!r}")
        self.scale = scale
        self.num_steps = 0
        self.num_snapshots = 0
        self._lr = low
        #: The ``pt_optim_args`` callable this HWA set on the optimiser (``None``: none yet).
        self._scheduled_args: Callable[..., dict[str, Any]] | None = None
        self.mean: dict[str, torch.Tensor] = {}
        #: Sum of squared deviations from the running mean (Welford), per parameter.
        self.squared_deviations: dict[str, torch.Tensor] = {}

    def learning_rate(self, step: int) -> float:
        """:math:`\\gamma_t` at step ``t`` (0-based)."""
        low, high = self.lr_bounds
        c = self.cycle_length
        if c == 1:
            return low
        return high + (low - high) * (step % c) / (c - 1)

    def _set_lr(self, lr: float) -> None:
        optim = self.svi.optim
        for opt in optim.optim_objs.values():
            for group in opt.param_groups:
                group["lr"] = lr
        # parameters first seen during this step get their optimiser from these arguments
        args = optim.pt_optim_args
        if isinstance(args, dict):
            args["lr"] = lr
        elif args is not self._scheduled_args:
            def scheduled(*a: Any, original: Callable[..., dict[str, Any]] = args
                          ) -> dict[str, Any]:
                return {**original(*a), "lr": self._lr}

            optim.pt_optim_args = self._scheduled_args = scheduled
        self._lr = lr

    def step(self, *args: Any, **kwargs: Any) -> float:
        """One SVI step at the scheduled learning rate; folds a snapshot at the end of a cycle."""
        self._set_lr(self.learning_rate(self.num_steps))
        loss = self.svi.step(*args, **kwargs)
        self.num_steps += 1
        if self.num_steps % self.cycle_length == 0:
            self.collect()
        return loss

    def collect(self) -> None:
        """Fold the current (unconstrained) parameters into the running moments."""
        store = pyro.get_param_store()
        n = self.num_snapshots
        for name in store.keys():
            value = store.get_param(name).unconstrained().detach()
            if name not in self.mean:
                if n:  # a parameter that appeared late: start its average now
                    raise RuntimeError(f"parameter {name!r} appeared after {n} snapshots")
                self.mean[name] = value.clone()
                self.squared_deviations[name] = torch.zeros_like(value)
                continue
            # Welford's update: the same mean and variance as the running second moment,
            # without its cancellation when the variance is small next to the squared mean
            delta = value - self.mean[name]
            self.mean[name].add_(delta, alpha=1 / (n + 1))
            self.squared_deviations[name].add_(delta * (value - self.mean[name]))
        self.num_snapshots = n + 1

    def variance(self) -> dict[str, torch.Tensor]:
        """Per-element variance of the snapshots, :math:`s - \\bar\\phi^2` (unconstrained)."""
        n = max(self.num_snapshots, 1)
        return {k: (d / n).clamp_min(0.0) for k, d in self.squared_deviations.items()}

    @property
    def second_moment(self) -> dict[str, torch.Tensor]:
        """Per-element running second moment :math:`s` of the snapshots (unconstrained)."""
        return {k: v + self.mean[k].square() for k, v in self.variance().items()}

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """Inside the block the parameters hold the averages; the live values after.

        The averages are written into the live (unconstrained) tensors and the live values
        written back on exit, so that guides built as ``PyroModule`` s, whose parameters are
        the store's tensors, see them too. Tensors a guide returns inside the block may be views
        of the parameters: clone what you keep (:meth:`averaged_guide` does).
        """
        if not self.num_snapshots:
            raise RuntimeError("HWA has no snapshot yet: run at least cycle_length steps")
        store = pyro.get_param_store()
        live = {k: store.get_param(k).unconstrained() for k in self.mean}
        averaged = self.averaged_values()
        saved = {k: v.detach().clone() for k, v in live.items()}
        try:
            with torch.no_grad():
                for k, v in live.items():
                    v.copy_(averaged[k])
            yield
        finally:
            with torch.no_grad():
                for k, v in live.items():
                    v.copy_(saved[k])

    def averaged_values(self) -> dict[str, torch.Tensor]:
        """The unconstrained parameter values of the averaged guide (see ``scale``)."""
        if self.scale == "average":
            return self.mean
        if self.num_snapshots < 2:
            raise RuntimeError("scale='snapshots' needs two snapshots: run at least "
                               "2 * cycle_length steps")
        from pyro_flat.infer.svi.sharpness_elbo import default_mean_and_scale

        constraints = pyro.get_param_store().get_state()["constraints"]
        variance = self.variance()
        values = dict(self.mean)
        for name in self.mean:
            is_mean, scale = default_mean_and_scale(name, self.mean, self.svi.guide)
            if not is_mean or scale is None:
                continue
            sd = variance[name].sqrt().clamp_min(torch.finfo(variance[name].dtype).tiny)
            to_scale = torch.distributions.transform_to(constraints[scale])
            values[scale] = to_scale.inv(sd.expand_as(self.mean[scale]))
        if values.keys() == self.mean.keys() and all(values[k] is self.mean[k] for k in values):
            raise RuntimeError("scale='snapshots' found no mean parameter with a scale in the "
                               "guide")
        return values

    def averaged_guide(self) -> Callable[..., Any]:
        """The wrapped guide with the averaged parameters, for ``Predictive`` and BMA.

        Each call runs the guide once with the averages swapped in, keeps copies of its sample
        values, and replays the guide on them with the live parameters restored.
        """
        guide = self.svi.guide

        def averaged(*args: Any, **kwargs: Any) -> Any:
            with self.swapped(), torch.no_grad(), poutine.block():  # unseen by outer handlers
                trace = poutine.trace(guide).get_trace(*args, **kwargs)
                for site in trace.nodes.values():
                    if site["type"] == "sample":
                        site["value"] = site["value"].detach().clone()
            return poutine.replay(guide, trace=trace)(*args, **kwargs)

        return averaged

    def state_dict(self) -> dict[str, Any]:
        return {"num_steps": self.num_steps, "num_snapshots": self.num_snapshots,
                "scale": self.scale,
                "mean": {k: v.clone() for k, v in self.mean.items()},
                "squared_deviations": {k: v.clone() for k, v in
                                       self.squared_deviations.items()},
                "lr_bounds": self.lr_bounds, "cycle_length": self.cycle_length}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.num_steps = int(state["num_steps"])
        self.num_snapshots = int(state["num_snapshots"])
        self.mean = {k: v.clone() for k, v in state["mean"].items()}
        if "squared_deviations" in state:
            self.squared_deviations = {k: v.clone()
                                       for k, v in state["squared_deviations"].items()}
        else:  # a state saved with the running second moment
            n = self.num_snapshots
            self.squared_deviations = {k: n * (v - self.mean[k].square()).clamp_min(0.0)
                                       for k, v in state["second_moment"].items()}
        self.lr_bounds = tuple(state["lr_bounds"])
        self.cycle_length = int(state["cycle_length"])
        self.scale = state.get("scale", "average")
