"""L2E: SG-MCMC with meta-learned kinetic-energy gradients (Learning to Explore)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from pyro_flat import validation
from pyro_flat.infer.mcmc.base import SGMCMCKernel
from pyro_flat.infer.mcmc.estimators import Estimate
from pyro_flat.infer.mcmc.l2e.meta_net import (
    FRICTION,
    L2EState,
    LearnedKinetic,
    MetaNet,
    StandardKinetic,
    as_meta_net,
    l2e_step_,
)
from pyro_flat.infer.mcmc.state import KernelState, StateField

#: Said when the learned kinetic energy runs on a full batch (no minibatch gradient noise).
FULL_BATCH_WARNING = (
    "L2E on a full batch: its meta-learned dynamics were trained on minibatch gradients and "
    "rely on their noise to spread; without it the draws sit near the posterior mean with "
    "sds of about 0.01 to 0.1 times the posterior's (the conformance matrix's regression and "
    "MLP), so they do not represent the posterior. Minibatch the model (subsample_size=B, or "
    "a subsampled data plate) or use kinetic_energy='standard' or another kernel")


class L2E(SGMCMCKernel):
    r"""Learning to Explore: momentum SG-MCMC whose kinetic-energy gradients come from a small
    meta-learned network shared by all parameters.

    Target :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)` when :math:`(\alpha, \beta)` are the
    gradients :math:`(\nabla_\theta g, \nabla_r g)` of a kinetic energy :math:`g`; the learned
    network is not constrained to be such a gradient, so with it the chain is a meta-learned
    approximate sampler (as in the paper). One gradient and two evaluations of the network per
    step (Kim et al. 2024, Eq. 6, as in the authors' ``algorithms/l2e.py``):

    .. math::

        r &\leftarrow r - \epsilon\,\big(\nabla \hat U(\theta) + \alpha + C \beta\big)
            + \sqrt{2 C \epsilon T}\;\xi, \qquad \xi \sim \mathcal{N}(0, I) \\
        \theta &\leftarrow \theta + \epsilon\, \beta'

    where :math:`(\alpha, \beta) = 10^{-3}\,\mathrm{MLP}_\phi(\text{features}(\nabla \hat U / N,
    \theta, r, m))` and :math:`\beta'` is re-evaluated with the new :math:`r`. The features of an
    element are the mean-loss gradient :math:`\nabla \hat U / N`, the parameter, the momentum and
    six moving averages :math:`m_d \leftarrow d\,m_d + (1-d)\nabla\hat U/N` (:math:`d \in
    \{0.1, 0.5, 0.9, 0.99, 0.999, 0.9999\}`), each normalised over its Pyro site (the authors
    normalise per parameter tensor): :math:`x/\sqrt{10^{-5} + \mathrm{mean}(x^2)}`. ``r`` and
    ``m`` start at zero. See :mod:`pyro_flat.infer.mcmc.l2e.meta_net`.

    **Conversions.** The authors' code runs on the mean loss :math:`\ell` (with weight decay
    ``wd``) and hard-codes :math:`N = 50000`: ``r <- r - eps (50000 grad l + alpha + C beta) +
    sqrt(2 C noise_mult) xi`` with ``eps = sqrt(step_mult / 50000)``. Here
    :math:`\nabla U = N \nabla \ell` with the model's own ``N`` (a prior of precision
    :math:`N \cdot \mathrm{wd}`), and ``step_size=None`` means :math:`\epsilon = \sqrt{
    \text{step\_mult} / N}`. The paper's noise is :math:`2 C \epsilon` (``temperature=1``, the
    default here); the authors' ``2 C noise_mult`` is ``temperature = noise_mult / step_size``
    (about 0.16 with their ``noise_mult = 1e-3``, ``step_mult = 2`` on CIFAR-10), a tempered
    sampler: :meth:`authors_settings` gives those arguments. With ``kinetic_energy="standard"``
    (:math:`g = \tfrac12\lVert r\rVert^2`: :math:`\alpha = 0`, :math:`\beta = r`) the step is
    :class:`~pyro_flat.infer.SGHMC`'s with ``friction = C``, unit mass.

    **Cost.** Per step, besides the gradient, two passes of the network over all parameters
    (about 1,400 multiply-adds per parameter each). On x86-64 CPUs with AVX2 they run in a
    compiled kernel built on first use (:mod:`pyro_flat.infer.mcmc.l2e.native`; torch's
    slower kernels elsewhere). On small networks these passes, not the gradient, dominate the
    step; docs/methods/l2e.md, "Cost", gives the step time against SGLD's.

    Parameters
    ----------
    model : callable, optional
        A Pyro model (or give ``potential_fn`` and ``initial_params``).
    step_size : float, optional
        :math:`\epsilon` on ``U``; ``None`` gives :math:`\sqrt{\text{step\_mult}/N}`.
    meta_params : MetaNet, path, mapping or None
        The network's parameters: a :class:`~pyro_flat.infer.mcmc.l2e.meta_net.MetaNet`, an
        ``.npz`` file (this project's format or the authors' haiku layout ``linear_0.w`` ...),
        a mapping of those names to arrays, or ``None`` for the parameters shipped with
        pyro_flat (meta-trained by :mod:`pyro_flat.infer.mcmc.l2e.training`; see
        docs/methods/l2e.md).
    step_mult : float
        The authors' step multiplier, used when ``step_size`` is ``None``; positive.
    num_data : int, optional
        ``N``, the dataset size; defaults to the size of the model's data plate (the
        subsampled one, or the plate that encloses every observed site). Needed when there is
        none (a ``potential_fn``, or observed sites in no plate), with the learned kinetic
        energy or with ``step_size=None``; an error says so.
    friction : float
        :math:`C > 0` (the authors' 0.1).
    kinetic_energy : {"learned", "standard"}
        ``"standard"`` replaces the network by :math:`g = \tfrac12\lVert r\rVert^2`.
    **kwargs
        The arguments of :class:`SGMCMCKernel` (``temperature``, ``subsample_size``,
        ``num_steps_per_sample``, ``step_size_schedule``, ...).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> pyro.set_rng_seed(0)
    >>> from pyro.infer import MCMC
    >>> from pyro_flat.infer import L2E
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    ...     with pyro.plate("data", len(x), subsample_size=50) as i:
    ...         pyro.sample("y", dist.Normal(x[i] @ w, 0.5), obs=y[i])
    >>> x = torch.randn(500, 2); y = x @ torch.tensor([1.0, -2.0]) + 0.5 * torch.randn(500)
    >>> kernel = L2E(model, num_steps_per_sample=5)  # shipped meta-parameters
    >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=20, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["w"].shape
    torch.Size([20, 2])
    >>> round(kernel.base_step_size, 4)  # its rule's sqrt(2 / 500): step_size was omitted
    0.0632

    References
    ----------
    Kim, S., Kim, M. & Lee, J. (2024). Learning to explore for stochastic gradient MCMC.
    arXiv:2408.09140. Code: github.com/ciao-seohyeon/l2e.
    """

    #: L2E has its own rule for an omitted step size (the authors' sqrt(step_mult / N)), and
    #: its learned kinetic energy is not written for a metric.
    supports_adaptation = False  # its meta-learned step sqrt(2 / N) is part of the rule
    supports_preconditioner = False
    has_step_size_rule = True

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        meta_params: Any = None,
        step_mult: float = 2.0,
        num_data: int | None = None,
        friction: float = FRICTION,
        kinetic_energy: str = "learned",
        **kwargs: Any,
    ):
        super().__init__(model, step_size, **kwargs)
        self._rule_step_size: float | None = None
        self.step_mult = validation.positive("step_mult", step_mult)
        self.num_data = None if num_data is None else validation.integer_at_least(
            "num_data", num_data, 1)
        self.friction = validation.positive("friction", friction)
        if kinetic_energy not in ("learned", "standard"):
            raise ValueError(f"kinetic_energy must be 'learned' or 'standard', got "
                             f"{kinetic_energy!r}")
        self.kinetic_energy = kinetic_energy
        self.meta_net = as_meta_net(meta_params) if kinetic_energy == "learned" else None

    @staticmethod
    def authors_settings(num_data: int, step_mult: float = 2.0, noise_mult: float = 1e-3
                         ) -> dict[str, float]:
        """``step_size`` and ``temperature`` that reproduce the authors' noise ``2 C noise_mult``
        and step ``sqrt(step_mult / N)``: ``L2E(model, **L2E.authors_settings(N))``."""
        n = validation.integer_at_least("num_data", num_data, 1)
        eps = math.sqrt(validation.positive("step_mult", step_mult) / n)
        return {"step_size": eps,
                "temperature": validation.nonnegative("noise_mult", noise_mult) / eps}

    def rule_step_size(self) -> float:
        """The authors' step :math:`\\sqrt{\\text{step\\_mult} / N}`, in force when
        ``step_size`` is omitted (computed once per run: every SG step reads it)."""
        if self._rule_step_size is None:
            self._rule_step_size = math.sqrt(self.step_mult / self._data_size(strict=True))
        return self._rule_step_size

    def _data_size(self, strict: bool = False) -> int:
        """``N``: ``num_data``, else what the model's data plate says. Unknown, it is an error
        where it matters (the step rule, ``strict``; the learned kinetic energy's features),
        and 1 for the standard kinetic energy, which does not read the features."""
        if self.num_data is not None:
            return self.num_data
        n = None if self.target is None else self.target.num_data  # known once set up
        if n is not None:
            return n
        if strict:
            raise ValueError(
                "step_size=None needs the dataset size N: pass num_data, or use a model whose "
                "observed sites lie in a pyro.plate over the data (or subsample_size)"
            )
        if self.kinetic_energy == "learned":
            raise ValueError(
                "L2E's meta-network reads the per-datum gradient grad U / N, so it needs the "
                "dataset size N, and none was found: pass num_data=N (the number of data "
                "points U sums over), or observe the data in a pyro.plate over it"
            )
        return 1

    # ------------------------------------------------------------------ kernel state

    def state_fields(self) -> tuple[StateField, ...]:
        """The per-element state: the momentum ``r`` and the six gradient moving averages
        ``m_d``, zero at the start and after a non-finite step. Both live in the features
        buffer (:class:`~pyro_flat.infer.mcmc.l2e.meta_net.L2EState`) the meta-network reads."""
        d = self.layout.size
        chains = self.vectorized_chains or 1
        # features are normalised per site of each chain: the chains' rows lie one after another
        segments = [(c * d + s.offset, c * d + s.stop) for c in range(chains)
                    for s in self.layout.sites]

        def rows(x: torch.Tensor) -> torch.Tensor:  # one row per chain (views)
            return x.view(chains, d, *x.shape[1:])

        return (
            StateField("features", "the meta-network's per-element features",
                       init=lambda state: L2EState.zeros(state.position.reshape(-1), segments),
                       persistent=False),
            StateField("momentum", "r, the momentum",
                       init=lambda state: rows(state.features.r), reset=True),
            StateField("grad_moments", "(n, 6) gradient moving averages m_d",
                       init=lambda state: rows(state.features.moments), reset=True),
        )

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        self._rule_step_size = None  # N may differ from the last run's
        super().setup(warmup_steps, *args, **kwargs)
        #: ``N``, the data size the meta-network's features are scaled by (1, unused, for the
        #: standard kinetic energy when it is unknown).
        self.data_size = self._data_size()
        if self.step_size is None and self.step_size_schedule is None:
            self.rule_step_size()  # N is known now: say so at the start if it is not
        if self.kinetic_energy == "learned" and self.model is not None and \
                self.target.plate is None:
            warnings.warn(FULL_BATCH_WARNING, RuntimeWarning, stacklevel=2)
        if self.kinetic_energy == "standard":
            self._kinetic: StandardKinetic | LearnedKinetic = StandardKinetic()
        else:
            z = self.position
            self._kinetic = LearnedKinetic(self.meta_net.to(z.dtype, z.device))

    #: The meta-learned drift was trained on minibatch gradients at the authors' step, where
    #: the minibatch noise is far above the injected noise by design: reported, not warned.
    warns_on_gradient_noise = False
    watches_momentum = False  # its learned kinetic energy need not give r ~ N(0, MT)

    def momentum_friction(self) -> float:
        return self.friction

    def update(self, state: KernelState, estimate: Estimate, step_size: float) -> None:
        l2e_step_(state.position.view(-1), state.features, estimate.step_grad.view(-1),
                  self.data_size, step_size, self.temperature, self._kinetic, self.friction)

    @property
    def momentum(self) -> torch.Tensor:
        """The current momentum ``r`` (flat; ``(K, d)`` for vectorised chains)."""
        return self.outward(self.state.momentum)


__all__ = ["L2E", "MetaNet"]
