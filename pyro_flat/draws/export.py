"""Export of ``pyro.infer.MCMC`` runs (and of draws from a fitted guide) to ArviZ.

:func:`to_arviz` builds on :func:`arviz.from_dict` only (ArviZ 1.x has no ``from_pyro``), so the
same code returns an ``InferenceData`` on ArviZ 0.x and a ``DataTree`` on ArviZ 1.x; the one
version-specific call lives in ``_from_dict``. The 1.x branch is tested on Python 3.11 through
``arviz_base.from_dict``, which is what ArviZ 1.x exports as ``from_dict``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyro.poutine as poutine
import pyro.util
import torch
from pyro.poutine.util import site_is_subsample

from pyro_flat import validation
from pyro_flat.models.batchnorm import evaluation_mode
from pyro_flat.target.observed_shapes import check_observed_site
from pyro_flat.target.subsample import InjectIndices

if TYPE_CHECKING:
    from pyro.infer import MCMC

__all__ = ["sample_stats", "to_arviz"]


def to_arviz(
    source: MCMC | Mapping[str, torch.Tensor],
    *,
    model: Callable | None = None,
    model_args: tuple = (),
    model_kwargs: Mapping[str, Any] | None = None,
    var_names: str | Sequence[str] | None = None,
    thin: int = 1,
    coords: Mapping[str, Any] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    log_likelihood: bool | None = None,
    posterior_predictive: bool | None = None,
    observed_data: bool | None = None,
    eval_mode: bool = True,
) -> Any:
    """Convert a finished :class:`pyro.infer.MCMC` run, or a dict of draws, to ArviZ.

    ``source`` is either an ``MCMC`` run or draws ``{site: tensor of shape (num_draws,
    *site_shape)}``, e.g. from a fitted guide (:func:`pyro_flat.evaluation.predictive.guide_draws`,
    which covers HWA's averaged guide) or from SWAG (:meth:`pyro_flat.infer.SWAG.draws`), exported
    as one chain with no ``sample_stats``.

    Groups:

    * ``posterior``: the draws of each sample site in the constrained space, dims
      ``(chain, draw, *site_shape)``, from ``mcmc.get_samples(group_by_chain=True)``.
    * ``sample_stats``: the per-draw statistics of pyro_flat kernels (``lp``, ``step_size``,
      ``grad_norm``, ``diverging`` and any kernel-specific ones such as ``log_weight``), dims
      ``(chain, draw)``. For Pyro's own ``HMC``/``NUTS``, which keep only the indices of their
      divergent transitions and one acceptance rate per chain, ``diverging`` (and the rates as
      the attribute ``acceptance_rate``).
    * ``log_likelihood`` (per observation, for ``az.loo``, ``az.waic`` and ``az.compare``),
      ``posterior_predictive`` (one replicate of each observed site per draw) and
      ``observed_data`` (both for ``az.plot_ppc``), by default whenever there is a model and it
      has observed sites. The model (``mcmc.kernel.model`` and the arguments of ``mcmc.run``, or
      ``model``, ``model_args`` and ``model_kwargs``) is run once per exported draw with every
      subsampled plate given its full index set, so that a model written with
      ``pyro.plate(..., subsample_size=B)`` (where ArviZ's own ``from_pyro`` drops the
      log-likelihood) gives one value per data point, as does a full-batch plate. Each observed
      site becomes a variable with dims ``(chain, draw, *batch_shape)``; the values are the
      site's ``log_prob`` without the plate's ``N/B`` scale. The full-data forward pass runs
      once per draw, so memory is one draw's worth, and time grows with the number of draws
      times the number of data points: on a large data set these groups take far longer than
      the draws and statistics alone. Pass
      ``log_likelihood=False, posterior_predictive=False, observed_data=False`` to skip them.
      The replicates are drawn from the global random stream, which is restored afterwards:
      exporting does not shift the random numbers of the caller.

    **The replay leaves the model as it was.** By default (``eval_mode=True``) the model is
    replayed in evaluation mode: every :class:`torch.nn.Module` reachable from it
    (:func:`pyro_flat.models.batchnorm.model_modules`: the model, its module attributes, a
    function's closure and the global modules it names, and their submodules) has
    ``training = False`` during the replay, so Dropout is off and BatchNorm normalises with
    its running statistics as they are (not recomputed per draw: see
    :func:`pyro_flat.models.batchnorm.recompute_batchnorm`). Afterwards every module's ``training``
    flag and every BatchNorm layer's ``running_mean``, ``running_var`` and
    ``num_batches_tracked`` are exactly what they were, whatever ``eval_mode``.

    **Draws and sites must match.** With a model, every draw must be a sample site of the
    model (latent, observed, deterministic or a plate's subsample site) or a kernel's copy of
    one named ``site + "__" + suffix`` (EntropyMCMC's ``site__guide``, which is not replayed),
    and every latent sample site of the model must have a draw: otherwise the replay would
    draw that latent from its prior. Both are a ``ValueError`` naming the site.

    **Observed shapes.** An observed site whose value and distribution broadcast into a larger
    log-density (targets ``(N, 1)`` against a mean ``(B,)``) is a ``ValueError`` naming the
    site and both shapes (:mod:`pyro_flat.target.observed_shapes`).

    Each group carries the attributes ``inference_library="pyro"``,
    ``inference_library_version``, ``pyro_flat_kernel`` (the class name of ``mcmc.kernel``)
    and, for pyro_flat kernels, ``num_sg_steps`` (SG steps taken by each chain).

    On CPU the arrays share memory with the tensors of ``mcmc`` (no copy of the draws): write
    to one and the other changes. Only ``mcmc.get_samples`` and the per-chain statistics the
    kernels already returned are read; the slow :meth:`pyro.infer.MCMC.diagnostics` is not
    called.

    Parameters
    ----------
    source : pyro.infer.MCMC or dict of str to torch.Tensor
        A run, i.e. after ``mcmc.run(...)``, or draws ``{site: (num_draws, *site_shape)}``.
    model : callable, optional
        The model to replay for the ``log_likelihood``, ``posterior_predictive`` and
        ``observed_data`` groups; defaults to the kernel's model for an ``MCMC`` run.
    model_args, model_kwargs : tuple, dict, optional
        Its arguments; default to those of ``mcmc.run``.
    var_names : str or sequence of str, optional
        Sample sites to export; all by default.
    thin : int
        Keep every ``thin``-th draw (of the draws and of the statistics alike), ``>= 1``.
        The ``draw`` coordinate keeps the original draw index ``0, thin, 2 * thin, ...``.
    coords : dict, optional
        Coordinate values by dimension name, passed to :func:`arviz.from_dict`.
    dims : dict, optional
        Dimension names (without ``chain`` and ``draw``) by site, passed to
        :func:`arviz.from_dict`.
    log_likelihood, posterior_predictive, observed_data : bool, optional
        Add these groups (see above). ``None`` (default): add them when there is a model (a
        kernel built from one, or ``model``) with observed sites. ``True`` without a model
        raises.
    eval_mode : bool
        ``True`` (default): replay the model with every reachable module in evaluation mode
        (Dropout off, BatchNorm on its running statistics). ``False``: replay the modules in
        the mode they are in (a network left in training mode keeps Dropout on and normalises
        with each replayed batch's statistics). Either way the modules' modes and BatchNorm's
        running statistics are restored afterwards.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        ``InferenceData`` on ArviZ 0.x, ``DataTree`` on ArviZ 1.x.

    Raises
    ------
    ValueError
        If ``mcmc`` has not run, the draws are empty or hold different numbers of draws per
        site, ``var_names`` names unknown sites (the message lists the available ones), ``thin``
        is not a positive integer, ``dims`` gives a site a number of names other than its
        number of dimensions, or a replayed group is asked for without a model (or the model
        has no observed site); for a replay, a draw that is not a site of the model, a latent
        site of the model without a draw, or an observed site whose value and distribution
        broadcast into a larger log-density.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> import arviz as az
    >>> from pyro.infer import MCMC
    >>> from pyro_flat import to_arviz
    >>> from pyro_flat.infer import SGLD
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    ...     s = pyro.sample("s", dist.HalfNormal(1.0))
    ...     with pyro.plate("data", len(x), subsample_size=32) as i:
    ...         pyro.sample("y", dist.Normal(x[i] @ w, s), obs=y[i])
    >>> pyro.set_rng_seed(0)
    >>> x = torch.randn(200, 3); y = x @ torch.tensor([1.0, -1.0, 0.5]) + 0.3 * torch.randn(200)
    >>> mcmc = MCMC(SGLD(model, step_size=5e-4, num_steps_per_sample=5), num_samples=100,
    ...             warmup_steps=20, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> idata = to_arviz(mcmc, dims={"w": ["feature"]}, thin=2)
    >>> idata.posterior["w"].dims
    ('chain', 'draw', 'feature')
    >>> sorted(idata.sample_stats.data_vars)
    ['diverging', 'grad_norm', 'lp', 'step_size']
    >>> az.summary(idata, var_names=["w", "s"])  # doctest: +SKIP

    Draws of a fitted guide export the same way:

    >>> from pyro.infer.autoguide import AutoNormal
    >>> from pyro_flat.evaluation.predictive import guide_draws
    >>> guide = AutoNormal(model)
    >>> _ = guide(x, y)  # creates the guide's parameters
    >>> idata = to_arviz(guide_draws(guide, 50, x, y), model=model, model_args=(x, y))
    >>> idata.log_likelihood["y"].shape
    (1, 50, 200)
    >>> az.loo(idata)  # doctest: +SKIP
    """
    thin = validation.integer_at_least("thin", thin, 1)
    if isinstance(source, Mapping):
        all_samples = _draws_as_one_chain(source)
        stats, attrs = {}, {**_library_attrs(), "pyro_flat_source": "draws"}
    else:
        all_samples, chain_diagnostics = _chains(source)
        if all_samples is None:
            raise ValueError("mcmc holds no samples: call mcmc.run(...) before to_arviz")
        if model is None:
            model = getattr(source.kernel, "model", None)
            model_args = getattr(source, "_args", ())
            model_kwargs = getattr(source, "_kwargs", {})
        attrs = _attrs(source)
    if not all_samples:
        raise ValueError("the run has no sample sites to export")
    samples = _select(all_samples, var_names)
    num_draws = next(iter(samples.values())).shape[1]

    groups = {"posterior": {name: _numpy(value)[:, ::thin] for name, value in samples.items()}}
    if not isinstance(source, Mapping):
        stats = _sample_stats(chain_diagnostics, num_draws)
    if stats:
        groups["sample_stats"] = {name: value[:, ::thin] for name, value in stats.items()}

    asked = [g for g, flag in (("log_likelihood", log_likelihood),
                               ("posterior_predictive", posterior_predictive),
                               ("observed_data", observed_data)) if flag]
    if asked and model is None:
        raise ValueError(f"{', '.join(asked)} need a model: a kernel built from a model (not a "
                         "potential_fn), or model=...")
    flags = (log_likelihood, posterior_predictive, observed_data)
    if model is not None and any(flag or flag is None for flag in flags):
        rng = pyro.util.get_rng_state()
        try:
            with evaluation_mode(model, enabled=bool(eval_mode)):
                replay = _replay_observed(model, tuple(model_args), dict(model_kwargs or {}),
                                          all_samples, thin, posterior_predictive is not False)
        finally:
            pyro.util.set_rng_state(rng)
        if replay is None:
            if asked:
                raise ValueError(f"{', '.join(asked)}: the model has no observed sites")
        else:
            for group, flag in (("log_likelihood", log_likelihood),
                                ("posterior_predictive", posterior_predictive),
                                ("observed_data", observed_data)):
                if flag or flag is None:
                    groups[group] = replay[group]

    _check_dims(dims, groups)
    coords = dict(coords or {})
    coords.setdefault("draw", np.arange(0, num_draws, thin))
    return _from_dict(groups, attrs=attrs, coords=coords, dims=dims)


def sample_stats(mcmc: MCMC, *, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
    """The per-draw statistics of a finished run, as ``mcmc.get_samples`` gives the draws.

    pyro_flat kernels record ``lp``, ``step_size``, ``grad_norm``, ``diverging`` and their own
    (``log_weight``, ``sharpness``, ``coupling_distance``, ...); Pyro's ``HMC``/``NUTS`` only
    ``diverging``, from the indices of their divergent draws. They reach the driver from every
    chain, worker processes included, through the kernels' ``diagnostics()``, which Pyro's
    ``MCMC`` keeps per chain (read here so that user code need not).

    Parameters
    ----------
    mcmc : pyro.infer.MCMC
        A run, i.e. after ``mcmc.run(...)``.
    group_by_chain : bool
        ``False`` (default): each statistic of shape ``(num_chains * num_draws,)``, chains one
        after another, in the order of ``mcmc.get_samples()``; ``True``: ``(num_chains,
        num_draws)``.

    Returns
    -------
    dict of str to torch.Tensor
        One tensor per statistic that every chain recorded; empty if there is none.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_flat import sample_stats
    >>> from pyro_flat.infer import SGLD
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2), num_samples=50, disable_progbar=True)
    >>> mcmc.run(torch.randn(20))
    >>> {name: tuple(value.shape) for name, value in sample_stats(mcmc).items()}
    {'lp': (50,), 'step_size': (50,), 'grad_norm': (50,), 'diverging': (50,)}
    """
    samples, diagnostics = _chains(mcmc)
    _refuse_streamed_statistics(diagnostics)
    if not samples:
        raise ValueError("mcmc holds no samples: call mcmc.run(...) before sample_stats")
    num_draws = next(iter(samples.values())).shape[1]
    stats = _sample_stats(diagnostics, num_draws)
    out = {name: torch.as_tensor(value) for name, value in stats.items()}
    if not group_by_chain:
        out = {name: value.reshape(-1, *value.shape[2:]) for name, value in out.items()}
    return out


def get_samples(mcmc: MCMC, *, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
    """The draws of a finished run, every chain as a chain: ``mcmc.get_samples`` with the
    chains of a kernel built with ``vectorized_chains=K`` counted as chains.

    A kernel with ``vectorized_chains=K`` returns each draw with a leading dimension ``K``, so
    Pyro's ``mcmc.get_samples()`` holds ``(num_chains * draws, K, ...)``; here the ``K``
    vectorised chains of each of Pyro's chains become chains of their own, in the order of
    :func:`sample_stats` and :func:`to_arviz`. For any other run it is ``mcmc.get_samples``.

    Parameters
    ----------
    mcmc : pyro.infer.MCMC
        A run, i.e. after ``mcmc.run(...)``.
    group_by_chain : bool
        ``False`` (default): ``(chains * draws, ...)``, chains one after another; ``True``:
        ``(chains, draws, ...)``.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_flat import get_samples
    >>> from pyro_flat.infer import SGLD
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2, vectorized_chains=4), num_samples=50,
    ...             disable_progbar=True)
    >>> mcmc.run(torch.randn(20))
    >>> tuple(mcmc.get_samples()["mu"].shape)  # Pyro's: one chain of draws with 4 rows
    (50, 4)
    >>> tuple(get_samples(mcmc, group_by_chain=True)["mu"].shape)  # 4 chains of 50 draws
    (4, 50)
    """
    samples, _ = _chains(mcmc)
    if samples is None:
        raise ValueError("mcmc holds no samples: call mcmc.run(...) before get_samples")
    if not group_by_chain:
        samples = {name: v.reshape(-1, *v.shape[2:]) for name, v in samples.items()}
    return samples


def kernel_diagnostics(mcmc: MCMC) -> list[dict[str, Any]]:
    """What the kernel of each of Pyro's chains reported at the end of its run: a list with one
    ``kernel.diagnostics()`` dict per chain of ``MCMC(num_chains=...)``, worker processes
    included, in chain order.

    Pyro's ``MCMC`` keeps these per chain but offers them only mixed into
    ``mcmc.diagnostics()`` (keyed ``"chain 0"``, ... beside its R-hat and ESS of every site);
    this reads them as the kernels wrote them. For a pyro_flat kernel a dict holds
    ``"sample_stats"`` (as :func:`sample_stats` gives them, one chain), ``"divergences"``,
    ``"num_sg_steps"`` and what warmup adapted (``"step_size_adaptation"``,
    ``"gradient_noise"``, ``"num_steps_per_sample"``, ``"inverse_mass"``) or the kernel's own
    (e.g. ContourSGLD's ``"energy_pdf"`` and ``"weights_ess"``). A kernel built with
    ``vectorized_chains=K`` reports its ``K`` chains in one dict (statistics with a chain
    dimension, ``"vectorized_chains": K``).

    Parameters
    ----------
    mcmc : pyro.infer.MCMC
        A run, i.e. after ``mcmc.run(...)``.

    Returns
    -------
    list of dict
        One per chain of ``mcmc``.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_flat import kernel_diagnostics
    >>> from pyro_flat.infer import SGLD
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2, num_steps_per_sample=5), num_samples=10,
    ...             warmup_steps=0, disable_progbar=True)
    >>> mcmc.run(torch.randn(20))
    >>> kernel_diagnostics(mcmc)[0]["num_sg_steps"]  # 10 draws of 5 SG steps
    50
    """
    # Pyro keeps them in a private list; mcmc.diagnostics() is its only public route and mixes
    # them with its own summary of every site
    diagnostics = getattr(mcmc, "_diagnostics", None)
    if not diagnostics or not all(isinstance(d, Mapping) for d in diagnostics):
        raise ValueError("mcmc holds no kernel diagnostics: call mcmc.run(...) first")
    return [dict(d) for d in diagnostics]


def _chains(mcmc: MCMC) -> tuple[dict[str, torch.Tensor] | None, list[Any]]:
    """``(draws grouped by chain, per-chain diagnostics)`` with the ``K`` vectorised chains of
    each of Pyro's chains as chains of their own (chain ``c * K + k``)."""
    samples = mcmc.get_samples(group_by_chain=True)
    diagnostics = list(getattr(mcmc, "_diagnostics", None) or [])
    ks = {d.get("vectorized_chains") for d in diagnostics if isinstance(d, Mapping)}
    if not samples or ks in (set(), {None}):
        return samples, diagnostics
    if len(ks) != 1:
        raise ValueError(f"the chains of this run differ in vectorized_chains: {ks}")
    k = ks.pop()
    out = {}
    for name, value in samples.items():
        c, s = value.shape[:2]
        out[name] = value.movedim(2, 1).reshape(c * k, s, *value.shape[3:])
    unfolded = []
    for diag in diagnostics:
        stats = diag.get("sample_stats") or {}
        for j in range(k):
            one = {key: v for key, v in diag.items() if key != "sample_stats"}
            one["sample_stats"] = {name: v[:, j] for name, v in stats.items()}
            if "diverging" in one["sample_stats"]:
                one["divergences"] = torch.nonzero(one["sample_stats"]["diverging"]).flatten(
                ).tolist()
            unfolded.append(one)
    return out, unfolded


def _draws_as_one_chain(draws: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``{site: (num_draws, ...)}`` as ``{site: (1, num_draws, ...)}`` (views, no copy)."""
    out = {}
    for name, value in draws.items():
        value = torch.as_tensor(value)
        if value.dim() < 1:
            raise ValueError(f"draws[{name!r}] must have a leading draw dimension, got a scalar")
        out[name] = value.unsqueeze(0)
    sizes = {name: v.shape[1] for name, v in out.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"every site must hold the same number of draws, got {sizes}")
    if any(n == 0 for n in sizes.values()):
        raise ValueError("the draws are empty (zero draws)")
    return out


def _check_draw_names(trace: poutine.Trace, names: Sequence[str]) -> None:
    """Every draw must be a site of the model (or a kernel's ``site__suffix`` copy of one) and
    every latent site of the model must have a draw; ``trace``: the model conditioned on a
    draw."""
    sites = {n for n, s in trace.nodes.items() if s["type"] == "sample"}
    for name in names:
        if name in sites:
            continue
        copies = [name[:i] for i in range(1, len(name) - 2)
                  if name.startswith("__", i) and name[:i] in sites]
        if not copies:
            raise ValueError(
                f"the draw {name!r} is not a sample site of the model, so the replay would "
                f"ignore it (and draw the latent it stands for from its prior); the model's "
                f"sample sites: {sorted(sites)}. Rename the draw after its site, or leave it out")
    missing = [n for n, s in trace.nodes.items()
               if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)]
    if missing:
        raise ValueError(
            f"the model's latent site {missing[0]!r} has no draw, so the replay would draw it "
            f"from its prior (latent sites without draws: {missing}; the draws: "
            f"{sorted(names)}). Export draws of every latent site, or pass the model they "
            "belong to")


def _chunks(model: Any, args: tuple, kwargs: dict, draw: dict) -> list[tuple]:
    """How to cover all the data: ``[(injector or None, plate name, keep from)]``.

    A model without subsampling runs once. A model with a subsampled plate (full size ``N``,
    batches of ``B``) runs on consecutive index batches; the last batch is ``[N - B, N)`` of
    which only the indices not seen before are kept (the plate's batch size is fixed). The
    draw's names are checked against the model's sites here (:func:`_check_draw_names`).
    """
    with torch.no_grad():
        trace = poutine.trace(poutine.condition(model, data=draw)).get_trace(*args, **kwargs)
    _check_draw_names(trace, list(draw))
    plates = {(n, s["fn"].size, s["fn"].subsample_size) for n, s in trace.nodes.items()
              if site_is_subsample(s)
              and s["fn"].subsample_size is not None  # None: a full-batch plate
              and s["fn"].subsample_size < s["fn"].size}
    if not plates:
        return [(None, None, 0)]
    if len({(size, b) for _, size, b in plates}) > 1:
        raise ValueError(f"log_likelihood: the model subsamples plates of different sizes "
                         f"{sorted(plates)}; only one data plate is supported")
    name, size, b = next(iter(plates))
    out = [(InjectIndices(size, torch.arange(i, i + b)), name, 0)
           for i in range(0, size - b + 1, b)]
    rest = size % b
    if rest:
        out.append((InjectIndices(size, torch.arange(size - b, size)), name, b - rest))
    return out


def _plate_dim(site: dict, plate: str | None, value: torch.Tensor) -> int:
    for frame in site["cond_indep_stack"]:
        if frame.name == plate and frame.dim is not None:
            return frame.dim
    return -1 if value.dim() else 0


def _replay_observed(
    model: Callable,
    args: tuple,
    kwargs: dict,
    samples: Mapping[str, torch.Tensor],
    thin: int,
    predictive: bool,
) -> dict[str, dict[str, np.ndarray]] | None:
    """Per-draw log-likelihood (and replicates) of every observed site on all the data; None
    if the model has no observed site."""
    num_chains, num_draws = next(iter(samples.values())).shape[:2]
    chunks = _chunks(model, args, kwargs, {k: v[0, 0] for k, v in samples.items()})
    results: dict[str, list] = {"log_likelihood": [], "posterior_predictive": [],
                                "observed_data": []}
    for c in range(num_chains):
        per_chain: dict[str, dict[str, list]] = {k: {} for k in results}
        for d in range(0, num_draws, thin):
            draw = {k: v[c, d] for k, v in samples.items()}
            parts: dict[str, dict[str, list]] = {k: {} for k in results}
            for inject, plate, keep in chunks:
                with torch.no_grad(), poutine.trace() as tracer:
                    run = poutine.condition(model, data=draw)
                    if inject is not None:
                        run = inject(run)
                    run(*args, **kwargs)
                for name, site in tracer.trace.nodes.items():
                    if (site["type"] != "sample" or not site["is_observed"]
                            or name in draw):  # condition() marks the draw's sites observed
                        continue
                    check_observed_site(site)
                    value = site["value"]
                    dim = _plate_dim(site, plate, value)
                    values = {"log_likelihood": site["fn"].log_prob(value),
                              "observed_data": value}
                    if predictive:
                        values["posterior_predictive"] = site["fn"].sample()
                    for group, v in values.items():
                        if inject is not None:
                            v = v.narrow(dim, keep, v.shape[dim] - keep)
                        parts[group].setdefault(name, []).append((v, dim))
            for group, sites in parts.items():
                for name, pieces in sites.items():
                    whole = torch.cat([v for v, _ in pieces], dim=pieces[0][1]) \
                        if len(pieces) > 1 else pieces[0][0]
                    per_chain[group].setdefault(name, []).append(_numpy(whole))
        for group in results:
            results[group].append(per_chain[group])
    first = results["log_likelihood"][0]
    if not first:
        return None
    out = {group: {name: np.stack([np.stack(chain[name]) for chain in chains])
                   for name in chains[0]} for group, chains in results.items()}
    out["observed_data"] = {name: v[0, 0] for name, v in out["observed_data"].items()}
    return out


def _select(
    samples: Mapping[str, torch.Tensor], var_names: str | Sequence[str] | None
) -> dict[str, torch.Tensor]:
    """The requested sites of ``samples``, in the order asked for."""
    if var_names is None:
        return dict(samples)
    names = [var_names] if isinstance(var_names, str) else list(var_names)
    unknown = [name for name in names if name not in samples]
    if unknown or not names:
        raise ValueError(
            f"var_names must name sample sites of the run; unknown: {unknown}, "
            f"available: {sorted(samples)}"
        )
    return {name: samples[name] for name in names}


def _numpy(value: Any) -> np.ndarray:
    """``value`` as a NumPy array, sharing memory with a CPU tensor (a copy only off the CPU)."""
    if not torch.is_tensor(value):
        return np.asarray(value)
    value = value.detach()
    if value.dtype == torch.bfloat16:  # NumPy has no bfloat16
        value = value.float()
    return value.cpu().resolve_conj().resolve_neg().numpy()


def _sample_stats(
    diagnostics: Sequence[Mapping[str, Any] | None] | None, num_draws: int
) -> dict[str, np.ndarray]:
    """Per-draw statistics stacked to ``(chain, draw)``; empty if any chain lacks them."""
    if not diagnostics:
        return {}
    _refuse_streamed_statistics(diagnostics)
    per_chain = []
    for diag in diagnostics:
        stats = diag.get("sample_stats") if isinstance(diag, Mapping) else None
        if not isinstance(stats, Mapping):
            return _diverging_from_indices(diagnostics, num_draws)
        per_chain.append(stats)
    out = {}
    for name in per_chain[0]:
        if not all(name in stats for stats in per_chain):
            continue
        arrays = [_numpy(stats[name]) for stats in per_chain]
        if any(a.ndim < 1 or a.shape[0] != num_draws for a in arrays):
            warnings.warn(
                f"sample_stats[{name!r}] does not hold one value per draw ({num_draws}) in "
                "every chain; it is left out of the export",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        stacked = np.stack(arrays)
        out[name] = stacked.astype(bool) if name == "diverging" else stacked
    return out


def _refuse_streamed_statistics(diagnostics: Sequence[Any] | None) -> None:
    """A run that streamed its draws with ``save_params=[]`` keeps its statistics on disk
    only (:class:`~pyro_flat.DrawWriter` releases them): say where, rather than export none."""
    for diag in diagnostics or ():
        if isinstance(diag, Mapping) and diag.get("sample_stats_in"):
            raise ValueError(
                f"this run streamed its draws with save_params=[]: its per-draw statistics "
                f"are in the draw store {diag['sample_stats_in']!r}, not in memory; open it "
                "with pyro_flat.open_draws(path)")


def _diverging_from_indices(
    diagnostics: Sequence[Mapping[str, Any] | None], num_draws: int
) -> dict[str, np.ndarray]:
    """``diverging`` from the per-chain indices of divergent draws that Pyro's HMC and NUTS
    keep (``diagnostics()["divergences"]``, post-warmup draw indices); empty if any chain has
    none."""
    diverging = np.zeros((len(diagnostics), num_draws), dtype=bool)
    for c, diag in enumerate(diagnostics):
        indices = diag.get("divergences") if isinstance(diag, Mapping) else None
        if indices is None:
            return {}
        indices = [int(i) for i in indices if 0 <= int(i) < num_draws]
        diverging[c, indices] = True
    return {"diverging": diverging}


def _check_dims(dims: Mapping[str, Sequence[str]] | None,
                groups: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """``dims`` must give each site it names one name per dimension of the site's values."""
    for name, names in (dims or {}).items():
        if isinstance(names, str):
            raise ValueError(f"dims[{name!r}] must be a list of dimension names, got the "
                             f"string {names!r}")
        for group, variables in groups.items():
            if name not in variables:
                continue
            lead = 0 if group == "observed_data" else 2  # chain, draw
            shape = variables[name].shape[lead:]
            if len(names) != len(shape):
                raise ValueError(
                    f"dims[{name!r}] names {len(names)} dimension(s) {list(names)}, but the "
                    f"site has {len(shape)} in {group}: shape {tuple(shape)}"
                    + (" (without chain and draw)" if lead else "")
                )


def _library_attrs() -> dict[str, Any]:
    import pyro

    return {"inference_library": "pyro", "inference_library_version": pyro.__version__}


def _attrs(mcmc: MCMC) -> dict[str, Any]:
    """Provenance attributes: the inference library, its version and the kernel."""
    attrs: dict[str, Any] = {**_library_attrs(), "pyro_flat_kernel": type(mcmc.kernel).__name__}
    diagnostics = _chains(mcmc)[1]
    steps = [d.get("num_sg_steps") if isinstance(d, Mapping) else None for d in diagnostics]
    if steps and all(isinstance(s, int | np.integer) for s in steps):
        attrs["num_sg_steps"] = [int(s) for s in steps]
    rates = [d.get("acceptance rate") if isinstance(d, Mapping) else None for d in diagnostics]
    if rates and all(isinstance(r, float | int | np.floating) for r in rates):
        attrs["acceptance_rate"] = [float(r) for r in rates]  # Pyro's HMC/NUTS, per chain
    return attrs


def _from_dict(
    groups: dict[str, dict[str, np.ndarray]],
    *,
    attrs: dict[str, Any],
    coords: dict[str, Any] | None,
    dims: Mapping[str, Sequence[str]] | None,
) -> Any:
    """The one ArviZ-version-specific call: groups as keywords on 0.x, one nested dict on 1.x.

    ``attrs`` go on every group and on the root (``InferenceData.attrs`` / ``DataTree.attrs``).
    """
    import arviz as az

    dims = None if dims is None else {k: list(v) for k, v in dims.items()}
    if int(az.__version__.split(".")[0]) >= 1:
        # arviz_base.from_dict(data: {group: {var: array}}, ..., attrs={group or "/": dict})
        group_attrs = {group: dict(attrs) for group in groups}
        return az.from_dict(
            groups, coords=coords, dims=dims, attrs={"/": dict(attrs), **group_attrs}
        )
    # ArviZ 0.x: from_dict(posterior=..., sample_stats=..., attrs=root, <group>_attrs=...)
    group_attrs = {f"{group}_attrs": dict(attrs) for group in groups}
    return az.from_dict(**groups, coords=coords, dims=dims, attrs=dict(attrs), **group_attrs)
