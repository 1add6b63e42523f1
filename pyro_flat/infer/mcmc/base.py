"""The base of every pyro_flat SG-MCMC kernel: one ``pyro.infer.MCMC`` kernel, many update rules.

A subclass states its update rule (:class:`~pyro_flat.infer.mcmc.update_rule.UpdateRule`:
``update``, the state it carries beside the position as ``state_fields``, what it supports)
and, if it is not the plain minibatch gradient, its gradient estimator
(:mod:`~pyro_flat.infer.mcmc.estimators`). :class:`SGMCMCKernel` is the adapter to Pyro's
``MCMC`` (``setup``, ``sample``, ``diagnostics``, ``cleanup``) and the configuration common to
every kernel (step sizes and their schedules, thinning, vectorised chains); the work is done
by the objects it holds: what the run steps on (:mod:`~pyro_flat.infer.mcmc.run_target`, bound
through a :class:`pyro_flat.target.Target`), the chains (:mod:`~pyro_flat.infer.mcmc.chain`,
one row each), one SG step (:mod:`~pyro_flat.infer.mcmc.stepper`), the divergence policy
(:mod:`~pyro_flat.infer.mcmc.divergence`), warmup (:mod:`~pyro_flat.infer.mcmc.warmup`),
checkpoints (:mod:`~pyro_flat.infer.mcmc.checkpoint`), the per-draw statistics
(:mod:`~pyro_flat.infer.mcmc.recorder`) and what a draw holds
(:mod:`~pyro_flat.infer.mcmc.draw_layout`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pyro.util
import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from pyro_flat import validation
from pyro_flat.infer.mcmc import adaptation
from pyro_flat.infer.mcmc.adaptation import DiagonalMetric
from pyro_flat.infer.mcmc.arguments import (
    check_finite_arguments,
    check_initial_params,
    check_schedule,
    device_of,
)
from pyro_flat.infer.mcmc.chain import Chains
from pyro_flat.infer.mcmc.chains import ChainStreams
from pyro_flat.infer.mcmc.checkpoint import Checkpoints, state_fingerprint
from pyro_flat.infer.mcmc.compilation import Compilation, check_compile, set_up_compilation
from pyro_flat.infer.mcmc.configurational_temperature import (
    ConfigurationalTemperature,
    warn_if_temperature_off,
)
from pyro_flat.infer.mcmc.divergence import DivergencePolicy, warn_if_blown_up
from pyro_flat.infer.mcmc.draw_layout import DrawLayout
from pyro_flat.infer.mcmc.draw_mixing import DrawMixing, warn_if_draws_mix_slowly
from pyro_flat.infer.mcmc.estimators import MinibatchGradient
from pyro_flat.infer.mcmc.momentum_watch import MomentumWatch, warn_if_momentum_ran_hot
from pyro_flat.infer.mcmc.recorder import DrawRecorder
from pyro_flat.infer.mcmc.run_target import chain_inits, model_run_target, user_run_target
from pyro_flat.infer.mcmc.state import KernelState
from pyro_flat.infer.mcmc.stepper import SGStepper, StepResult
from pyro_flat.infer.mcmc.thinning import monitored_sites
from pyro_flat.infer.mcmc.update_rule import UpdateRule
from pyro_flat.infer.mcmc.warmup import Warmup
from pyro_flat.models.batchnorm import find_batchnorm, kept_running_stats
from pyro_flat.target.layout import FlatLayout
from pyro_flat.target.minibatch import ChainMinibatches
from pyro_flat.target.network_potential import read_network
from pyro_flat.target.target import Target

#: The default ``stability_fraction``: the adapted step as a fraction of the stability limit.
STABILITY_FRACTION = 0.2





class SGMCMCKernel(UpdateRule, MCMCKernel):
    r"""Base class of the stochastic-gradient MCMC kernels, for use with :class:`pyro.infer.MCMC`.

    The target is :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)` with the minibatch potential
    :math:`U(\theta) = -\log p(\theta) - \frac{N}{B}\sum_{i\in\mathcal{B}} \log p(y_i\mid\theta)`,
    in the unconstrained space of Pyro's transforms (plus their log-Jacobian). Step sizes act on
    ``U``: an SGD learning rate ``lr`` on the *mean* loss corresponds to ``step_size = lr / N``.

    Parameters
    ----------
    model : callable, optional
        A Pyro model. Give either ``model`` or ``potential_fn``.
    step_size : float, optional
        The step size :math:`\epsilon` on ``U``; positive and finite. Omitted (``None``, and no
        ``step_size_schedule``): warmup chooses it, as ``stability_fraction`` of the update's
        stability limit at the largest curvature of ``U``, estimated by power iteration on
        Hessian-vector products at the start of warmup and after 1/4, 1/2 and 3/4 of it
        (:mod:`pyro_flat.infer.mcmc.adaptation`); the chosen values are in
        ``diagnostics()["step_size_adaptation"]``, in the ``step_size`` statistic and in the
        ``pyro_flat.adaptation`` logger (level INFO). On a minibatched model the step is
        also at most the one at which the minibatch gradient noise is 5% of the injected
        noise (:mod:`pyro_flat.infer.mcmc.gradient_noise`; the underdamped updates instead
        raise their friction until the noise heats the chain by at most 5%,
        :mod:`pyro_flat.infer.mcmc.friction`). Needs ``warmup_steps >= 1``. Whatever the step, a
        minibatched run measures its gradient noise in warmup, reports the noise ratio and
        the excess temperature in ``diagnostics()["gradient_noise"]`` and warns when the
        chain runs more than 10% hotter than ``temperature``.
    potential_fn : callable, optional
        ``potential_fn(params) -> U`` for a dict of unconstrained tensors; needs
        ``initial_params`` (here or in ``MCMC``).
    initial_params : dict, optional
        Unconstrained starting values, one tensor per site.
    temperature : float
        :math:`T \ge 0`; ``T = 0`` is noiseless optimisation, ``T < 1`` a cold posterior.
    subsample_size : int, optional
        ``B``: minibatch a full-batch model. Model arguments whose leading dimension is ``N`` are
        sliced with fresh indices at every step and the data plate is scaled by ``N / B``. A
        model written with ``pyro.plate("data", N, subsample_size=B)`` is minibatched without it.
    num_steps_per_sample : int or "auto", optional
        SG steps per returned draw (thinning), ``>= 1``. ``"auto"``: warmup chooses it from
        the autocorrelations of the chain (:mod:`~pyro_flat.infer.mcmc.thinning`: about
        five draws per integrated autocorrelation time of the slowest small site that is no
        network weight, or of the energy), shown in ``diagnostics()["num_steps_per_sample"]``;
        needs ``warmup_steps >= 4``. Default: ``"auto"`` when warmup chooses the step size
        (no ``step_size`` and no ``step_size_schedule``) and ``warmup_steps >= 4``, else 1
        (with a warning after warmup when that is far too few).
    step_size_schedule : callable, optional
        ``t -> step size`` of the SG step index ``t = 0, 1, ...``, replacing ``step_size``.
    init_strategy : callable, optional
        A Pyro init strategy; the default, :func:`pyro_flat.models.nn.init_to_network`, starts from
        the network's own PyTorch initialisation.
    data_plate : str, optional
        The name of the plate to subsample, when several plates enclose the observations.
    max_nonfinite_steps : int
        A chain whose potential or gradient was non-finite at this many of its last
        ``2 * max_nonfinite_steps`` SG steps stops with an error that names the site and the
        step, also when finite and non-finite steps alternate (a chain that falls back to its
        last finite state and blows up again from there). Fewer non-finite steps only mark
        their draws ``diverging`` and skip the update.
    preconditioner : {None, "diag"}
        ``"diag"``: learn a diagonal metric :math:`P = 1/\mathrm{E}[\hat g^2]` from the
        gradients of warmup, together with the step size (so ``step_size`` must be omitted),
        and freeze it at the last estimate; the sampler after warmup is exact for that fixed
        metric. ``diagnostics()["inverse_mass"]`` holds :math:`P` per site. Only for kernels
        whose target does not depend on the metric (SGLD, SGHMC, CyclicalSGLD, ContourSGLD).
    stability_fraction : float
        The adapted step size as a fraction of the stability limit, in ``(0, 1)``; smaller is
        a smaller discretisation bias and slower mixing. Used only when warmup adapts.
    vectorized_chains : int, optional
        ``K``: run ``K`` independent chains in this one kernel, the potential of all of them
        evaluated at once (:mod:`~pyro_flat.infer.mcmc.chains`: ``torch.func.vmap`` over the
        chains of a model, each with its own minibatch; a ``potential_fn`` must then take
        parameters with a leading dimension ``K`` and return ``K`` energies, and its
        ``initial_params`` have that leading dimension). Chain ``k`` draws from its own random
        stream, seeded with ``torch.initial_seed() + k`` as Pyro seeds chain ``k`` of
        ``MCMC(num_chains=K)`` in a worker process, and is draw for draw the single-chain run
        after ``pyro.set_rng_seed(torch.initial_seed() + k)``. Draws have a leading dimension
        ``K`` (``mcmc.get_samples()`` gives ``(draws, K, ...)``), statistics are
        ``(draws, K)``; :func:`pyro_flat.to_arviz`, :func:`pyro_flat.get_samples` and
        :func:`pyro_flat.sample_stats` give ``K`` chains. With warmup adaptation all chains take
        the smallest of their step sizes (each chain keeps its own diagonal metric).
        ``vectorized_chains=1`` evaluates its chain as a single chain does (no ``vmap``, so it
        costs what one chain costs), with the chain dimension kept in the draws.
    compile : {False, True, "auto"}
        Compile the potential and its gradient with :func:`torch.compile`
        (:mod:`~pyro_flat.infer.mcmc.compilation`): one function of the flat position and the
        minibatch, for a :class:`~pyro_flat.models.bnn.BNN` with a built-in likelihood and
        constant Normal priors (:func:`~pyro_flat.target.network_potential.read_network`);
        the update is unchanged and the draws equal the eager path's to float rounding.
        ``True``: an error for a model that cannot be read; ``"auto"``: compiled where it can
        be and a short trial at the start of the run finds it faster; ``False``: eager.
        Compiling takes seconds (once per process and shape: a later run of the same shapes
        reuses it); ``diagnostics()["compile"]`` says what was chosen, why, and the times.

    Notes
    -----
    Per-draw statistics ``lp`` (``-U`` of a minibatch at the draw), ``step_size`` (of the
    step that produced the draw), ``grad_norm`` (``||grad U||`` at the draw) and ``diverging``
    are returned by :meth:`diagnostics` under ``"sample_stats"`` (one tensor per statistic,
    post-warmup draws only), so they reach the driver from worker processes too, and
    ``"divergences"`` lists the indices of diverging draws. ``lp`` and ``grad_norm`` come from
    the first SG step after the draw, which evaluates the potential at the draw anyway, so they
    cost nothing.

    The flat parameter vector (:attr:`position`, and every state field) has the widest
    floating dtype among the sites' initial values
    (:meth:`~pyro_flat.target.layout.FlatLayout.flat_dtype`): a float64
    network whose noise scale has a float32 prior is sampled in float64, every site included.

    Every observed site is checked once, when the kernel traces the model at setup: a value
    and distribution that broadcast into a larger log-density (targets ``(N, 1)`` against a
    mean ``(B,)``) raise ``ValueError`` naming the site and both shapes
    (:mod:`pyro_flat.target.observed_shapes`).
    """

    #: Names of the per-draw statistics this kernel records.
    stat_names: tuple[str, ...] = ("lp", "step_size", "grad_norm", "diverging")
    #: This rank's shard of the data of a data-parallel chain (set by
    #: :func:`pyro_flat.distributed.data_parallel`; ``None``: all the data is here).
    data_shard: Any = None
    #: Whether the SG steps of a draw learn that a chain is non-finite only at the draw's end,
    #: so that a step never waits for the host (:mod:`~pyro_flat.infer.mcmc.stepper`);
    #: ``None``: for chains on an accelerator, not on the CPU (where waiting costs nothing).
    #: Warmup steps that adapt always check at once.
    defer_finiteness_checks: bool | None = None

    def __init__(
        self,
        model: Callable | None = None,
        step_size: float | None = None,
        *,
        potential_fn: Callable | None = None,
        initial_params: dict[str, torch.Tensor] | None = None,
        temperature: float = 1.0,
        subsample_size: int | None = None,
        num_steps_per_sample: int | str | None = None,
        step_size_schedule: Callable[[int], float] | None = None,
        init_strategy: Callable | None = None,
        data_plate: str | None = None,
        max_nonfinite_steps: int = 100,
        preconditioner: str | None = None,
        stability_fraction: float = STABILITY_FRACTION,
        vectorized_chains: int | None = None,
        compile: bool | str = False,  # noqa: A002 (the name users expect, as torch's)
    ):
        if (model is None) == (potential_fn is None):
            raise ValueError("give exactly one of model and potential_fn")
        if (step_size is None and step_size_schedule is None and not self.supports_adaptation
                and not self.has_step_size_rule):
            raise ValueError(f"step_size is required: a finite number in (0, inf) ("
                             f"{type(self).__name__} does not declare supports_adaptation, so "
                             "warmup cannot choose it)")
        if preconditioner not in adaptation.PRECONDITIONERS:
            raise ValueError(
                f"preconditioner must be one of {adaptation.PRECONDITIONERS}, got "
                f"{preconditioner!r}"
            )
        if preconditioner is not None:
            if not self.supports_preconditioner:
                raise ValueError(
                    f"preconditioner={preconditioner!r} is not available for "
                    f"{type(self).__name__}: its update does not take a metric "
                    "(supports_preconditioner is False); use preconditioner=None"
                )
            if step_size is not None or step_size_schedule is not None:
                raise ValueError(
                    f"preconditioner={preconditioner!r} is learned in warmup together with the "
                    "step size: omit step_size and step_size_schedule"
                )
        if step_size_schedule is not None:
            check_schedule(step_size_schedule)
        if init_strategy is not None and not callable(init_strategy):
            raise TypeError(
                f"init_strategy must be a callable Pyro init strategy such as "
                f"pyro.infer.autoguide.init_to_median (or None for the network's own "
                f"initialisation), got {init_strategy!r}"
            )
        if subsample_size is not None:
            validation.integer_at_least("subsample_size", subsample_size, 1)
            if potential_fn is not None:
                raise ValueError("subsample_size needs a model; a potential_fn subsamples itself")
        self.model = model
        self.potential_fn = potential_fn
        self.step_size = None if step_size is None else validation.positive("step_size", step_size)
        self.temperature = validation.nonnegative("temperature", temperature)
        self.subsample_size = subsample_size
        self._adapt_requested = (
            self.supports_adaptation and step_size is None and step_size_schedule is None
        )
        #: Whether the thinning was left to its default (``"auto"`` when warmup chooses the
        #: step size, else 1; see ``_plan_thinning``).
        self._thinning_by_default = num_steps_per_sample is None
        if num_steps_per_sample is None:
            num_steps_per_sample = "auto" if self._adapt_requested else 1
        #: Whether warmup chooses the SG steps per draw (``num_steps_per_sample="auto"``).
        self.auto_thinning = isinstance(num_steps_per_sample, str)
        if self.auto_thinning:
            if num_steps_per_sample != "auto":
                raise ValueError(f"num_steps_per_sample must be an integer >= 1 or 'auto', "
                                 f"got {num_steps_per_sample!r}")
            self.num_steps_per_sample = num_steps_per_sample
        else:
            self.num_steps_per_sample = validation.integer_at_least(
                "num_steps_per_sample", num_steps_per_sample, 1
            )
        self.step_size_schedule = step_size_schedule
        self.init_strategy = init_strategy
        self.data_plate = data_plate
        self.max_nonfinite_steps = validation.integer_at_least(
            "max_nonfinite_steps", max_nonfinite_steps, 1
        )
        self.preconditioner = preconditioner
        self.stability_fraction = validation.in_range(
            "stability_fraction", stability_fraction, 0.0, 1.0, closed="()"
        )
        if stability_fraction != STABILITY_FRACTION and not self._adapt_requested:
            warnings.warn(
                f"{type(self).__name__}: stability_fraction={stability_fraction} is used only "
                "when warmup chooses the step size; with a step_size or step_size_schedule "
                "given it is ignored", UserWarning, stacklevel=2)
        self.vectorized_chains = None if vectorized_chains is None else (
            validation.integer_at_least("vectorized_chains", vectorized_chains, 1))
        #: ``compile=``: False, True or "auto" (:mod:`.compilation`).
        self.compile = check_compile(compile)
        #: What ``compile=`` chose for the current run (:class:`~.compilation.Compilation`).
        self.compilation: Compilation | None = None
        self.metric: DiagonalMetric | None = None
        #: What warmup measures and chooses (:class:`~pyro_flat.infer.mcmc.warmup.Warmup`).
        self.warmup = Warmup(self)
        self._kernel_initial_params = check_initial_params(initial_params)
        self._user_initial_params: dict[str, torch.Tensor] | None = None
        self._initial_params: dict[str, torch.Tensor] | None = None
        #: Saves the chain and continues it (:class:`~pyro_flat.infer.mcmc.checkpoint.Checkpoints`).
        self.checkpoints = Checkpoints(self)
        self._end_of_run_callbacks: list[Callable[[Any], None]] = []
        self.transforms = {} if model is None else None
        #: The gradient estimator the update moves with (:mod:`.estimators`).
        self.estimator = MinibatchGradient()
        self.state: KernelState | None = None
        #: The potential the chain moves on, and the chains' minibatches (set up by each run).
        self.target: Target | None = None
        self.minibatches: ChainMinibatches | None = None

    def steps_for_next_draw(self) -> int:
        """How many SG steps the next call of ``sample`` runs."""
        return self.warmup.steps_for_next_draw()

    # ------------------------------------------------------------------ MCMCKernel interface

    @property
    def initial_params(self) -> dict[str, torch.Tensor] | None:
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: dict[str, torch.Tensor]) -> None:
        self._user_initial_params = check_initial_params(params)

    @property
    def layout(self) -> FlatLayout:
        """Where each site lives in the flat parameter vector (after :meth:`setup`)."""
        return self._layout

    @property
    def in_warmup(self) -> bool:
        """Whether the draw being made is a warmup draw of the current run."""
        return self._draw < self._warmup_steps

    @property
    def draw_index(self) -> int:
        """The index of the draw being made in the current run, warmup draws first."""
        return self._draw

    @property
    def num_warmup_draws(self) -> int:
        """The warmup draws of the current run (``MCMC``'s ``warmup_steps``)."""
        return self._warmup_steps

    @property
    def adapts(self) -> bool:
        """Whether warmup chooses the step size (no ``step_size`` and no schedule given)."""
        return self._adapt_requested

    @property
    def thinning_by_default(self) -> bool:
        """Whether ``num_steps_per_sample`` was left to its default (``"auto"`` when warmup
        chooses the step size and can measure, else 1)."""
        return self._thinning_by_default

    @property
    def num_steps(self) -> int:
        """SG steps taken so far by this chain (continues across a resume): the state's
        ``num_steps``, 0 before a run."""
        return 0 if self.state is None else self.state.num_steps

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        self._warmup_steps = warmup_steps
        self._draw = 0
        k = self.vectorized_chains
        device = device_of(args, kwargs)
        # Vectorised chains: one random stream per chain, each consumed as a single chain
        # consumes torch's global one (see chains.py); a single chain uses the global stream.
        self.chain_streams = None if k is None else ChainStreams(k, torch.initial_seed(), device)
        if self.model is not None:
            check_finite_arguments(args, kwargs)
            if self.init_strategy is None:
                from pyro_flat.models.nn import init_to_network as init_strategy
            else:
                init_strategy = self.init_strategy
            run = model_run_target(self.model, args, kwargs, init_strategy=init_strategy,
                                   subsample_size=self.subsample_size,
                                   data_plate=self.data_plate, shard=self.data_shard,
                                   streams=self.chain_streams, device=device)
        else:
            init = self._user_initial_params or self._kernel_initial_params
            if init is None:
                raise ValueError("a potential_fn needs initial_params, in the kernel or in MCMC")
            run = user_run_target(self.potential_fn, init, k)
        layout, plate, inits = run.layout, run.plate, run.inits
        self.potential = run.potential
        #: The chains' minibatches (``None``: full batch, or a model that subsamples itself).
        self.minibatches: ChainMinibatches | None = run.minibatches
        self._layout = layout

        # A second random stream, for kernels that draw noise for auxiliary variables: seeded
        # from the main one so that runs are reproducible under pyro.set_rng_seed, and separate
        # so that the main stream (minibatches, noise of the parameters) is the same for all
        # kernels.
        def aux_seed() -> int:
            return int(torch.randint(2**62, ()))

        # (each vectorised chain draws it from its stream, as its single chain would; the
        # chains share chain 0's)
        seeds = [aux_seed()] if k is None else [self.chain_streams.run_as_global(c, aux_seed)
                                                 for c in range(k)]
        self.aux_generator = torch.Generator(device=device)
        self.aux_generator.manual_seed(seeds[0])
        self.warmup.reset()
        z = self.checkpoints.start_run()
        if z is None:
            given = self._user_initial_params or self._kernel_initial_params
            if given is not None and self.model is not None:
                inits = chain_inits(given, layout, k)
            z = torch.stack([layout.flatten(i) for i in inits])
            z = z.to(layout.flat_dtype(inits))  # the widest
            self.state = KernelState.create(z, self.state_fields())
        #: The chains: one row each, a single chain being one (:class:`~.chain.Chains`).
        self.chains = Chains(self.state, vectorized=k is not None)
        if self.checkpoints.last_finite is not None:
            self.chains.last_finite.copy_(self.checkpoints.last_finite)
        z = self.chains.position
        self.warmup.plan(warmup_steps, z)
        self._user_initial_params = None
        shard = self.data_shard
        #: The potential the chain moves on (:class:`~pyro_flat.target.Target`).
        self.target = Target(self.potential, layout, plate, None if shard is None else (
            lambda u, grad: shard.all_reduce_(u, grad, self.num_steps)), run.num_data)
        # one chain's potential (a single chain's, or vectorized_chains=1's) takes its row
        # without the chain dimension: it goes through no vmap
        self._bound = z if self.potential_chains is not None else z[0]
        self.target.bind(self._bound)
        self._grad_rows = (None if self.potential_chains is not None
                           else self.target.grad_buffer.unsqueeze(0))
        names = tuple(dict.fromkeys(self.stat_names + self.estimator.stat_names))
        self.recorder = DrawRecorder(names, self.stat_dtypes)
        #: The summaries of the draws after warmup, whose ESS the run's end checks
        #: (:mod:`.draw_mixing`).
        self.draw_mixing = DrawMixing(monitored_sites(layout, self.model))
        #: The draws' configurational temperature against the target's
        #: (:mod:`.configurational_temperature`).
        self.configurational_temperature = ConfigurationalTemperature(layout.sites, k or 1)
        #: The momenta of the draws after warmup against their law (:mod:`.momentum_watch`;
        #: ``None``: a kernel without one to watch).
        self.momentum_watch = (MomentumWatch(k or 1, layout.size, z.device)
                               if self.momentum_sd(1.0) is not None else None)
        #: Which chains' steps were non-finite, and when one must stop (:mod:`.divergence`).
        self.divergence = DivergencePolicy(k or 1, self.max_nonfinite_steps, z.device)
        defer = self.defer_finiteness_checks
        self._defers_checks = z.device.type != "cpu" if defer is None else bool(defer)
        #: The statistics of the pending draw, closed at the end of the draw's SG steps.
        self._closing: StepResult | None = None
        nan = torch.full((k or 1,), math.nan)
        #: What the last SG step saw (:class:`~.stepper.StepResult`).
        self._last = StepResult(nan, nan, None, math.nan)
        #: One SG step of the chains, and the fall-back of a non-finite one (:mod:`.stepper`).
        self.stepper = SGStepper(self.chains, self.evaluate_rows, self.estimator,
                                 self.update, self.divergence, layout)
        #: The sites of a draw and their values (:class:`~.draw_layout.DrawLayout`).
        self.draw_layout = DrawLayout(layout, self.state.draw_fields(), k)
        if self.model is not None:
            self.transforms = self.draw_layout.transforms
        self._last_flat = self.outward(self.draw_layout.copy(z, self.state))
        self._initial_params = self.draw_layout.views(self._last_flat)
        self._last_draw = self._initial_params
        with self._random_streams_kept():  # compiling draws from torch's global stream
            self.compilation = set_up_compilation(
                self.compile, self.target, lambda: self._network_potential(run, args, kwargs),
                self.potential_chains, self.minibatches is not None, self.peek_batch)

    def _network_potential(self, run: Any, args: tuple, kwargs: dict) -> Any:
        """The run's model as a pure potential, or why it cannot be one (:mod:`.compilation`)."""
        if self.model is None:
            return "the target is a potential_fn, whose structure pyro_flat cannot read"
        if self.data_shard is not None:
            return "a data-parallel chain's potential is summed over ranks"
        return read_network(self.model, args, kwargs, run.layout, run.plate,
                            run.potential.flat_prior)

    @property
    def position(self) -> torch.Tensor:
        """The chain's current parameters: one flat, unconstrained tensor (see :attr:`layout`),
        ``(d,)``, or ``(K, d)`` for vectorised chains."""
        return self.outward(self.chains.position)

    def outward(self, rows: Any) -> Any:
        """Per-chain values (one row or list entry per chain) as users see them: as they are
        for vectorised chains, a single chain's one row."""
        return rows if self.vectorized_chains is not None else rows[0]

    @property
    def active_chains(self) -> torch.Tensor | None:
        """During an update that some chains skip (their step was not finite): the chains that
        take it, ``(K,)`` booleans; ``None``: all."""
        return self.stepper.active_chains

    def sample(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        z = self.chains.position
        if params is not self._last_draw:
            self.draw_layout.load(params, z, self.state)
        self.divergence.start_draw()
        self.warmup.at_draw_start()
        thinning = self.warmup.step_recorder()
        try:
            for _ in range(self.steps_for_next_draw()):
                self._sg_step()
                if thinning is not None:
                    thinning.record(self.position, self.outward(self._last.energy))
        finally:
            self._close_pending_draw()
        if self._defers_checks:
            self.stepper.raise_if_stopped()
        if self._draw >= self._warmup_steps:
            self._record_draw()
            self.draw_mixing.record(z)
            self._read_temperature_at_draw()
            if self.momentum_watch is not None:
                self.momentum_watch.record(self.state.momentum,
                                           self.momentum_sd(self.current_step_size()))
        self._draw += 1
        self._last_flat = self.outward(self.draw_layout.copy(z, self.state))
        self._last_draw = self.draw_layout.views(self._last_flat)
        return self._last_draw

    def logging(self) -> OrderedDict:
        last = self._last
        return OrderedDict(
            [
                ("step size", f"{last.step_size:.2e}"),
                ("lp", f"{-float(last.energy.float().mean()):.4g}"),
                ("non-finite steps", self.divergence.num_diverging),
            ]
        )

    def diagnostics(self) -> dict[str, Any]:
        """The run's per-draw statistics (``"sample_stats"``), the indices of its diverging
        draws (``"divergences"``), its SG step count, and what warmup adapted."""
        self.complete_last_draw()
        # a run whose statistics went to a draw store reads back only what it needs here
        stats = self.recorder.tensors(["diverging"] if self.recorder.released else None)
        diverging = stats.get("diverging", torch.zeros(0, dtype=torch.bool))
        # a draw of vectorised chains diverges where any of its chains did (a run stopped in
        # warmup has no draw)
        per_draw = diverging if diverging.dim() < 2 else diverging.flatten(1).any(-1)
        divergences = torch.nonzero(per_draw).flatten().tolist()
        out = {"divergences": divergences, "sample_stats": stats, "num_sg_steps": self.num_steps}
        if self.recorder.released:
            # the statistics are in the draw store; holding them here would make the memory
            # of a streamed run grow with its draws again
            out["sample_stats"] = {}
            out["sample_stats_in"] = self.recorder.released_to
        out.update(self.warmup.diagnostics())
        if self.momentum_watch is not None and self.momentum_watch.num_draws:
            out["momentum_watch"] = self.momentum_watch.as_dict()
        if self.compilation is not None:
            out["compile"] = self.compilation.as_dict()
        temperature = self.draws_temperature()
        if temperature:
            out["configurational_temperature"] = temperature
        if self.vectorized_chains is not None:
            out["vectorized_chains"] = self.vectorized_chains
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this chain exactly where it stopped.

        Call it after ``MCMC.run`` (the random state is the one at the end of the run) or
        between draws from a ``hook_fn``; pass the result to :meth:`load_state_dict` of a
        kernel built with the same arguments before the next run.
        """
        return self.checkpoints.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next :meth:`setup` (i.e. the next ``MCMC.run``)."""
        self.checkpoints.load(state)

    @property
    def resumed_from(self) -> tuple[int, str] | None:
        """``(SG steps, fingerprint of the position)`` of the checkpoint this run continues."""
        return self.checkpoints.resumed_from

    def position_fingerprint(self) -> str:
        """:func:`~pyro_flat.infer.mcmc.checkpoint.state_fingerprint` of the chain's position
        now (after a run: the position its checkpoint holds)."""
        return state_fingerprint(self.position)

    def importance_log_weights(self) -> torch.Tensor | None:
        """The run's log importance weights per draw (``(draws,)``, or ``(draws, K)``) for a
        kernel whose draws are reweighted before use (ContourSGLD); ``None``: the draws are
        the target's as they are. The draws' check at the run's end reads them."""
        return None

    def draws_temperature(self) -> dict[str, dict[str, float]]:
        """The draws' configurational temperature over the target's, per site and for the
        whole position (``"all"``), with standard errors (:mod:`.configurational_temperature`;
        reweighted for a kernel with :meth:`importance_log_weights`). Empty for fewer than
        40 draws or ``temperature=0``."""
        if not self.temperature > 0:
            return {}
        return self.configurational_temperature.estimate(self.temperature,
                                                         self.importance_log_weights())

    def aux_generator_state(self) -> torch.Tensor:
        """State of ``aux_generator`` for a checkpoint (a kernel that draws ahead overrides)."""
        return self.aux_generator.get_state()

    def cleanup(self) -> None:
        """End of a run (``MCMC`` calls it after :meth:`diagnostics`): remember the random
        state, so that a :meth:`state_dict` taken later (after other random work, e.g.
        building the next model) still continues this chain, and warn about diverging draws
        and blown-up gradients."""
        super().cleanup()
        if self.state is None or self.checkpoints.run_ended:
            return  # not run, or this run ended already
        self.complete_last_draw()
        callbacks, self._end_of_run_callbacks = self._end_of_run_callbacks, []
        try:
            self.warmup.warn_at_end()
            if not self.warmup.thinning_warned:
                warn_if_draws_mix_slowly(type(self).__name__, self.draw_mixing.lowest_ess(
                    self.importance_log_weights()))
            warn_if_momentum_ran_hot(type(self).__name__, self.momentum_watch, self.layout)
            if self.follows_target:
                warn_if_temperature_off(type(self).__name__, self.draws_temperature(),
                                        self.temperature)
            self.checkpoints.end_run()
            stats = self.recorder.tensors(["diverging", "grad_norm"])
            if "diverging" not in stats or not len(stats["diverging"]):
                return
            diverging = stats["diverging"]
            num_diverging = int(diverging.sum())
            if num_diverging:
                of = f"{num_diverging} of {len(diverging)} draws"
                if diverging.dim() > 1:  # (draws, K): a draw diverges where any chain did
                    of = (f"{int(diverging.flatten(1).any(-1).sum())} of {len(diverging)} draws "
                          f"({num_diverging} of {diverging.numel()} chain-draws)")
                warnings.warn(
                    f"{type(self).__name__}: {of} "
                    "are marked diverging (a non-finite potential or gradient on the way to the "
                    "draw; that step was skipped). See sample_stats['diverging'] and try a smaller "
                    "step_size",
                    RuntimeWarning,
                    stacklevel=2,
                )
            warn_if_blown_up(type(self).__name__, stats["grad_norm"])
        finally:  # last, so that a callback that raises leaves the run's end recorded
            for callback in callbacks:
                callback(self)

    def at_end_of_run(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(kernel)`` once at the end of the current ``MCMC.run`` (in
        :meth:`cleanup`, after the last draw's statistics are complete), e.g. for
        :class:`pyro_flat.DrawWriter` to check that the run drew the draws it was told of."""
        self._end_of_run_callbacks.append(callback)

    # ------------------------------------------------------------------ the hot path

    def potential_and_grad(
        self, batch: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, grad U)`` at the current parameters (:meth:`Target.value_and_grad
        <pyro_flat.target.Target.value_and_grad>`), shaped as :attr:`position`: with vectorised
        chains ``U`` holds one energy per chain and the gradient one row. The gradient is the
        target's flat buffer, overwritten by the next call."""
        u, grad = self.evaluate_rows(batch)
        return self.outward(u), self.outward(grad)

    @property
    def potential_chains(self) -> int | None:
        """How many chains the potential evaluates at once, a leading dimension of its
        parameters and minibatches: ``K`` for ``vectorized_chains=K > 1``; ``None`` for one
        chain (a single chain, or ``vectorized_chains=1``), whose potential takes its row
        without the chain dimension."""
        k = self.vectorized_chains
        return k if k is not None and k > 1 else None

    def evaluate_rows(self, batch: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`potential_and_grad` with one row per chain, ``(K,)`` and ``(K, d)`` (``K = 1``
        for a single chain, whose potential takes its row without the chain dimension): what
        the stepper and the estimators see."""
        u, grad = self.target.value_and_grad(self._bound, batch)
        if self._grad_rows is None:  # vectorised chains: rows already
            return u, grad
        return u.reshape(1), self._grad_rows  # (a view of the target's buffer, made once)

    @property
    def base_step_size(self) -> float | None:
        """The step size in force before any schedule, from its one source: ``step_size``
        when given, else the one warmup chose (``None`` until it chooses), else the kernel's
        own rule's (:meth:`rule_step_size`). None of them is written over by another."""
        if self.step_size is not None:
            return self.step_size
        if self.has_step_size_rule and not self.adapts:
            return self.rule_step_size()
        return self.warmup.step_size

    def current_step_size(self) -> float:
        """The step size of the next SG step."""
        if self.step_size_schedule is None:
            return self.base_step_size
        t = self.num_steps
        eps = self.step_size_schedule(t)
        if not (isinstance(eps, int | float) or torch.is_tensor(eps)) or not (
            math.isfinite(float(eps)) and float(eps) > 0
        ):
            raise ValueError(
                f"step_size_schedule({t}) returned {eps!r}; it must return a finite "
                "number in (0, inf)"
            )
        eps = float(eps)
        try:
            self.check_step_size(eps)
        except ValueError as e:
            raise ValueError(f"step_size_schedule({t}) returned {eps!r}: {e}") from None
        return eps

    def _sg_step(self) -> None:
        """One SG step of the chains (:meth:`SGStepper.step <.stepper.SGStepper.step>`): the
        first one after a draw completes that draw's statistics at its potential."""
        eps = self.current_step_size()
        batch = self._next_batch()
        warmup = self.warmup
        adapting = warmup.collects_moments or warmup.watches_steps
        self._last = self.stepper.step(
            eps, batch, self._keep_draw_closing if self._draw_unclosed() else None,
            warmup.accumulate if warmup.collects_moments else None,
            deferred=self._defers_checks and not adapting)
        if warmup.watches_steps:
            warmup.after_step(self._last)
        elif self.momentum_watch is not None and not self.in_warmup:
            self.momentum_watch.after_step(self.state.momentum)

    def _record_draw(self) -> None:
        k = self.vectorized_chains or 1
        last = self._last
        known = {"step_size": [last.step_size] * k,
                 "diverging": self.divergence.diverged_in_draw()}
        known.update({name: rows.tolist() if torch.is_tensor(rows) else rows
                      for name, rows in last.stats.items()})
        known.update(self.draw_statistics())
        defaults = {name: [value] * k for name, value in self.stat_defaults.items()}
        self.recorder.open_draw({name: self.outward(rows) for name, rows in known.items()},
                                {name: self.outward(rows) for name, rows in defaults.items()})

    def _read_temperature_at_draw(self) -> None:
        """A minibatched run's term of the configurational temperature at the draw, on a batch
        of its own (:mod:`.configurational_temperature`; a data-parallel chain's evaluation is
        summed over ranks, so it reads none)."""
        watch, batches = self.configurational_temperature, self.minibatches
        if batches is None or self.data_shard is not None or not watch.wants(self.num_steps):
            return
        z = self.chains.position
        batch = watch.independent_batch(batches.size, batches.batch_size, self.num_steps,
                                        self.potential_chains is not None, z.device)
        with self._random_streams_kept(), kept_running_stats(find_batchnorm(self.model)):
            u, grad = self.evaluate_rows(batch)
        finite = torch.isfinite(u) & torch.isfinite(grad).all(-1)
        watch.record(z, grad, finite)

    def _keep_draw_closing(self, at: StepResult) -> None:
        """The potential at the pending draw, kept on the device until the draw's SG steps
        end (:meth:`_close_pending_draw`); a kernel whose statistics at a draw read its state
        before the update closes it at once."""
        if self.minibatches is None:  # a full batch (or one the model draws independently)
            self.configurational_temperature.record(self.chains.position, at.grad, at.finite)
        if type(self).statistics_at_draw is not UpdateRule.statistics_at_draw:
            self._close_draw(at)
            return
        finite = None if at.finite is None else at.finite.clone()
        self._closing = StepResult(at.energy.clone(), at.grad_norm.clone(), finite,
                                   at.step_size)

    def _draw_unclosed(self) -> bool:
        """Whether the recorder's pending draw still waits for the potential at it."""
        return self.recorder.pending and self._closing is None

    def _close_pending_draw(self) -> None:
        closing, self._closing = self._closing, None
        if closing is not None:
            self._close_draw(closing)

    def _close_draw(self, at: StepResult) -> None:
        """Complete the pending draw with the potential and gradient norm at it (one per
        chain; ``at.finite``: which chains' are, ``None``: all)."""
        u = at.energy.tolist()
        finite = [True] * len(u) if at.finite is None else at.finite.tolist()
        at_draw = {"lp": [-x for x in u], "grad_norm": at.grad_norm.tolist(),
                   "diverging": [not f for f in finite]}
        at_draw.update(self.statistics_at_draw(u))
        self.recorder.close_draw({name: self.outward(rows) for name, rows in at_draw.items()})

    def complete_last_draw(self) -> None:
        """Complete the statistics of the run's last draw, which no SG step follows (they are
        evaluated at the draw); the random stream is restored (peeking at the next minibatch
        may draw an epoch's permutation). ``diagnostics()`` and the end of the run call it."""
        if not self.recorder.pending:
            return
        with self._random_streams_kept():  # (a potential may draw, as may the peek)
            batch = self.peek_batch()
            u, grad = self.evaluate_rows(batch)
            gnorm = torch.linalg.vector_norm(grad, dim=-1)
        finite = torch.isfinite(u) & torch.isfinite(gnorm)
        if self.minibatches is None:
            self.configurational_temperature.record(self.chains.position, grad, finite)
        self._close_draw(StepResult(u, gnorm, finite, self._last.step_size))

    def _next_batch(self) -> torch.Tensor | None:
        """The next minibatch indices (one row per chain for vectorised chains), or None."""
        return None if self.minibatches is None else self.minibatches.next()

    @contextlib.contextmanager
    def _random_streams_kept(self) -> Iterator[None]:
        """Pyro's random state and the chains' streams as they were, after the block."""
        rng = pyro.util.get_rng_state()
        streams = None if self.chain_streams is None else self.chain_streams.get_state()
        try:
            yield
        finally:
            pyro.util.set_rng_state(rng)
            if streams is not None:
                self.chain_streams.set_state(streams)

    def peek_batch(self) -> torch.Tensor | None:
        """The minibatch the next SG step takes, without taking it (None: full batch). At an
        epoch's end it draws a permutation: save and restore the random state around it."""
        return None if self.minibatches is None else self.minibatches.peek()

    def __getstate__(self) -> dict[str, Any]:
        # What a worker process needs: the arguments, not the per-run state.
        keep = {}
        for k, v in self.__dict__.items():
            if k in ("potential", "_last_draw", "_initial_params", "_last_flat", "_bound",
                     "_grad_rows", "aux_generator", "chain_streams"):
                continue
            # set up again by each run, as before the first
            unset = ("state", "recorder", "target", "minibatches", "chains", "stepper")
            keep[k] = None if k in unset or isinstance(v, KernelState) else v
        return keep

