"""An HMC reference posterior predictive, and the diagnostics that say whether to trust it.

Target: the posterior predictive :math:`p(y \\mid x, \\mathcal D)` of a Bayesian network small
enough for full-batch NUTS, as the "ground truth" that approximate methods are scored against.

Izmailov et al. (2021) ran full-batch HMC on BNNs with several chains and scored every
approximate method by its predictive's agreement with HMC's; the NeurIPS 2021 approximate
inference competition (Wilson et al. 2022) turned this into the scores
:func:`pyro_flat.evaluation.classification.agreement` and
:func:`pyro_flat.evaluation.classification.total_variation` (classification) and a Wasserstein
distance between predictive draws,
:func:`pyro_flat.evaluation.regression.wasserstein2` (regression). :func:`hmc_reference` runs Pyro's
NUTS (Hoffman & Gelman 2014) with several chains and computes the rank-normalised split R-hat and
bulk effective sample size of every parameter (Vehtari et al. 2021), flagging (and by default
warning about) a reference that has not converged; :func:`reference_predictive` turns the
draws into the reference predictive those scores take.

Examples
--------
Scoring a method against the reference, here with made-up draws in place of NUTS's
(``ref = hmc_reference(model, x_train, y_train)``, then ``ref.predictive(x_test)``):

>>> import torch
>>> from pyro_flat.evaluation import classification
>>> from pyro_flat.models.bnn import BNN
>>> from pyro_flat.evaluation.hmc_reference import reference_predictive
>>> from pyro_flat.models.likelihoods import Categorical
>>> model = BNN(torch.nn.Linear(2, 3), Categorical())  # multinomial logistic regression
>>> g = torch.Generator().manual_seed(0)
>>> hmc = {"net.weight": torch.randn(50, 3, 2, generator=g), "net.bias": torch.zeros(50, 3)}
>>> other = {"net.weight": 2 * hmc["net.weight"], "net.bias": torch.zeros(50, 3)}
>>> x_test = torch.randn(200, 2, generator=g)
>>> reference = reference_predictive(model, hmc, x_test)  # (200, 3) BMA probabilities
>>> probs = reference_predictive(model, other, x_test)
>>> agreement = classification.agreement(probs, reference)
>>> agreement, round(classification.total_variation(probs, reference), 2)
(0.96, 0.02)

References
----------
Hoffman, M. D. & Gelman, A. (2014). The No-U-Turn sampler: adaptively setting path lengths in
Hamiltonian Monte Carlo. JMLR 15. Izmailov, P., Vikram, S., Hoffman, M. D. & Wilson, A. G.
(2021). What are Bayesian neural network posteriors really like? ICML. Vehtari, A., Gelman,
A., Simpson, D., Carpenter, B. & Bürkner, P.-C. (2021). Rank-normalization, folding, and
localization: an improved R-hat for assessing convergence of MCMC. Bayesian Analysis 16(2).
Wilson, A. G., Izmailov, P., Hoffman, M. D., et al. (2022). Evaluating approximate inference
in Bayesian deep learning. NeurIPS 2021 Competitions and Demonstrations Track, PMLR 176.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pyro.util
import torch
from pyro.distributions.torch_distribution import ExpandedDistribution, MaskedDistribution
from pyro.infer import MCMC, NUTS, Predictive
from pyro.infer.autoguide.initialization import init_to_sample

from pyro_flat import validation
from pyro_flat.diagnostics import bulk_ess, split_rhat
from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.models import likelihoods
from pyro_flat.models.bnn import BNN
from pyro_flat.target.sites import latent_sites

__all__ = [
    "HMCReference",
    "ReferenceWarning",
    "hmc_reference",
    "reference_predictive",
]


class ReferenceWarning(UserWarning):
    """The HMC reference failed its convergence checks: scores against it are not to be
    trusted."""


# ------------------------------------------------------------------------------- reference


@dataclass
class HMCReference:
    """Draws of a multi-chain NUTS run with their convergence diagnostics.

    Attributes
    ----------
    samples_by_chain : dict of str to torch.Tensor
        ``{site: (num_chains, num_samples, *site_shape)}`` in the constrained space.
    rhat, ess_bulk : dict of str to torch.Tensor
        :func:`~pyro_flat.diagnostics.split_rhat` and :func:`~pyro_flat.diagnostics.bulk_ess`
        of each element of each site.
    divergences : list of int
        Divergent transitions after warm-up, per chain.
    chain_seeds : list of int
        The seed each chain ran with.
    max_rhat, min_ess_bulk : float
        Over all elements of all sites (``nan`` if some element's draws are constant).
    converged : bool
        Whether the reference passed the checks of :func:`hmc_reference`.
    problems : list of str
        What failed, one sentence per check (empty if ``converged``).
    seconds : float
        Wall-clock time of the run.
    model : callable
        The model, for :meth:`predictive`.
    """

    samples_by_chain: dict[str, torch.Tensor]
    rhat: dict[str, torch.Tensor]
    ess_bulk: dict[str, torch.Tensor]
    divergences: list[int]
    chain_seeds: list[int]
    max_rhat: float
    min_ess_bulk: float
    converged: bool
    problems: list[str]
    seconds: float
    model: Callable[..., Any] = field(repr=False)

    @property
    def samples(self) -> dict[str, torch.Tensor]:
        """``{site: (num_chains * num_samples, *site_shape)}``, chain after chain, as
        ``mcmc.get_samples()``."""
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in self.samples_by_chain.items()}

    def predictive(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """:func:`reference_predictive` of this reference's model and draws."""
        return reference_predictive(self.model, self.samples, *args, **kwargs)


def _chain_seeds(seed: int, num_chains: int) -> list[int]:
    """Independent per-chain seeds from ``seed`` (NumPy's ``SeedSequence``)."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(num_chains)]


def hmc_reference(
    model: Callable[..., Any],
    *args: Any,
    num_chains: int = 4,
    num_samples: int = 1000,
    warmup_steps: int = 1000,
    seed: int = 0,
    max_rhat: float = 1.01,
    min_ess: float | None = None,
    max_divergences: int | None = 0,
    on_failure: str = "warn",
    model_kwargs: Mapping[str, Any] | None = None,
    disable_progbar: bool = True,
    **nuts_kwargs: Any,
) -> HMCReference:
    r"""Posterior draws of ``model`` by multi-chain NUTS, checked for convergence.

    Target: the exact posterior :math:`p(\theta \mid \mathcal D)` of a full-batch model, as a
    reference for approximate methods (Izmailov et al. 2021).

    Method: ``num_chains`` runs of Pyro's :class:`~pyro.infer.NUTS` (Hoffman & Gelman 2014;
    step size and diagonal mass matrix adapted during ``warmup_steps`` towards Pyro's default
    ``target_accept_prob=0.8``), one after the other in this process. Each chain starts at a
    draw from the prior (:func:`~pyro.infer.autoguide.initialization.init_to_sample`; pass
    ``init_strategy`` to change it): the starts are over-dispersed relative to the posterior, as
    R-hat needs, and on the prior's scale. Pyro's default, uniform in ``(-2, 2)`` in the
    unconstrained space, is far outside a network prior of scale ``3 / sqrt(fan_in)``: on a
    heteroscedastic regression network such a start can predict scales at their floor, and the
    chain then adapts its step size to almost nothing and never leaves its start.
    Chain ``c`` starts from ``pyro.set_rng_seed(chain_seeds[c])``, the seeds drawn from
    ``numpy.random.SeedSequence(seed)``, so a chain depends on nothing but its seed and the
    result is reproducible; the global random state is restored afterwards. Pyro's own
    ``MCMC(num_chains=...)`` runs chains in worker processes only when ``num_chains <=
    cpu_count - 1`` (so never on 2 cores) and then seeds them ``torch.initial_seed() +
    chain``; sequential runs avoid its process start-up, pickling of the model, and
    threads competing for the cores.

    Then, for every element of every site, the rank-normalised split R-hat
    (:func:`~pyro_flat.diagnostics.split_rhat`) and bulk ESS
    (:func:`~pyro_flat.diagnostics.bulk_ess`) over the chains, by ArviZ. The reference is
    flagged (``converged=False``, the reasons in ``problems``) if ``max R-hat > max_rhat``,
    ``min bulk ESS < min_ess`` (either being ``nan`` counts), or a chain diverged more than
    ``max_divergences`` times; ``on_failure`` says what else happens.

    Cost: ``num_chains * (warmup_steps + num_samples)`` NUTS iterations of up to
    ``2^max_tree_depth`` (Pyro's default 10) full-batch gradient evaluations each; the
    memory of all draws, ``num_chains * num_samples`` copies of the parameters. Only small
    networks and data sets are practical: Pyro spends about 1-3 ms per gradient evaluation
    of even a tiny model (tracing overhead), so 2 chains of 600 iterations of a linear BNN
    take 5-10 s on one core; ``jit_compile=True`` about halves that.

    Parameters
    ----------
    model : callable
        A Pyro model that uses all its data in every run: a :class:`pyro_flat.models.bnn.BNN`
        without ``subsample_size``, or any model without subsampled plates.
    *args
        The model's arguments, e.g. ``x, y``.
    num_chains : int
        ``>= 2``.
    num_samples, warmup_steps : int
        Draws kept per chain (``>= 4``) and adaptation steps per chain (``>= 0``).
    seed : int
        ``>= 0``.
    max_rhat : float
        The largest acceptable R-hat, ``> 1``; 1.01 as Vehtari et al. (2021) recommend.
    min_ess : float, optional
        The smallest acceptable bulk ESS (of all the chains together), ``> 0``; default
        ``100 * num_chains`` (Vehtari et al. 2021).
    max_divergences : int, optional
        The most divergent transitions any one chain may have, ``>= 0``; ``None`` skips the
        check.
    on_failure : {"warn", "raise", "ignore"}
        Emit a :class:`ReferenceWarning`, raise ``RuntimeError``, or only flag the result.
    model_kwargs : dict, optional
        Keyword arguments of the model.
    disable_progbar : bool
        Pyro's progress bar off (the default) or on.
    **nuts_kwargs
        Passed to :class:`pyro.infer.NUTS`, e.g. ``target_accept_prob=0.9``,
        ``max_tree_depth=8``, ``jit_compile=True``, ``init_strategy=init_to_uniform`` (the
        default here is ``init_to_sample``).

    Returns
    -------
    HMCReference
        The draws, diagnostics, and :meth:`HMCReference.predictive`.

    Raises
    ------
    ValueError
        If an argument is invalid (the message names it), or NUTS rejects ``nuts_kwargs``.
    RuntimeError
        If the reference fails its checks and ``on_failure="raise"``.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.models.bnn import BNN
    >>> from pyro_flat.models.likelihoods import HomoskedasticGaussian
    >>> x = torch.linspace(-1, 1, 10).unsqueeze(1); y = 2 * x.squeeze(1)
    >>> model = BNN(torch.nn.Linear(1, 1), HomoskedasticGaussian(scale=0.5))  # linear
    >>> # a short run for the example: thresholds relaxed from 1.01 and 100 per chain
    >>> ref = hmc_reference(model, x, y, num_chains=2, num_samples=150, warmup_steps=100,
    ...                     max_rhat=1.05, min_ess=100)
    >>> ref.converged, ref.problems, sorted(ref.samples), ref.samples_by_chain["net.bias"].shape
    (True, [], ['net.bias', 'net.weight'], torch.Size([2, 150, 1]))
    >>> ref.predictive(torch.tensor([[0.0], [3.0]])).shape  # 300 draws of y at 2 points
    torch.Size([300, 2])
    """
    if not callable(model):
        raise ValueError(f"model must be a Pyro model (a callable), got {type(model).__name__}")
    num_chains = validation.integer_at_least("num_chains", num_chains, 2)
    num_samples = validation.integer_at_least("num_samples", num_samples, 4)
    warmup_steps = validation.integer_at_least("warmup_steps", warmup_steps, 0)
    seed = validation.integer_at_least("seed", seed, 0)
    if isinstance(max_rhat, bool) or not (validation.positive("max_rhat", max_rhat) > 1):
        raise ValueError(f"max_rhat must be a number > 1, got {max_rhat!r}")
    min_ess = 100.0 * num_chains if min_ess is None else validation.positive("min_ess", min_ess)
    if max_divergences is not None:
        max_divergences = validation.integer_at_least("max_divergences", max_divergences, 0)
    if on_failure not in ("warn", "raise", "ignore"):
        raise ValueError(f"on_failure must be 'warn', 'raise' or 'ignore', got {on_failure!r}")
    if model_kwargs is not None and not isinstance(model_kwargs, Mapping):
        raise ValueError(f"model_kwargs must be a dict, got {type(model_kwargs).__name__}")
    model_kwargs = dict(model_kwargs or {})
    nuts_kwargs.setdefault("init_strategy", init_to_sample)
    try:
        NUTS(model, **nuts_kwargs)
    except TypeError as e:
        raise ValueError(f"nuts_kwargs are not arguments of pyro.infer.NUTS: {e}") from None

    chain_seeds = _chain_seeds(seed, num_chains)
    chains: list[dict[str, torch.Tensor]] = []
    divergences: list[int] = []
    start = time.perf_counter()
    rng = pyro.util.get_rng_state()
    try:
        for chain_seed in chain_seeds:
            pyro.set_rng_seed(chain_seed)
            mcmc = MCMC(NUTS(model, **nuts_kwargs), num_samples=num_samples,
                        warmup_steps=warmup_steps, num_chains=1,
                        disable_progbar=disable_progbar)
            mcmc.run(*args, **model_kwargs)
            chains.append({k: v.detach() for k, v in mcmc.get_samples().items()})
            divergences.append(len(mcmc.diagnostics()["divergences"]["chain 0"]))
    finally:
        pyro.util.set_rng_state(rng)
    seconds = time.perf_counter() - start
    if not chains[0]:
        raise ValueError("model has no latent sample sites to draw")

    by_chain = {k: torch.stack([c[k] for c in chains]) for k in chains[0]}
    rhat = {k: split_rhat(v) for k, v in by_chain.items()}
    ess = {k: bulk_ess(v) for k, v in by_chain.items()}
    all_rhat = torch.cat([v.reshape(-1) for v in rhat.values()])
    all_ess = torch.cat([v.reshape(-1) for v in ess.values()])
    worst_rhat = float("nan") if bool(all_rhat.isnan().any()) else float(all_rhat.max())
    worst_ess = float("nan") if bool(all_ess.isnan().any()) else float(all_ess.min())

    problems = []
    if not worst_rhat <= max_rhat:
        site = max(rhat, key=lambda k: float(rhat[k].nan_to_num(float("inf")).max()))
        problems.append(f"max R-hat {worst_rhat:.4g} > max_rhat = {max_rhat:g} (worst site "
                        f"{site!r}): the chains disagree; run longer or reparametrise")
    if not worst_ess >= min_ess:
        site = min(ess, key=lambda k: float(ess[k].nan_to_num(-1.0).min()))
        problems.append(f"min bulk ESS {worst_ess:.4g} < min_ess = {min_ess:g} (worst site "
                        f"{site!r}): draw more samples")
    if max_divergences is not None and max(divergences) > max_divergences:
        problems.append(f"divergent transitions per chain {divergences} exceed "
                        f"max_divergences = {max_divergences}: the sampler missed part of "
                        "the posterior; raise target_accept_prob")
    reference = HMCReference(by_chain, rhat, ess, divergences, chain_seeds, worst_rhat,
                             worst_ess, not problems, problems, seconds, model)
    if problems and on_failure != "ignore":
        message = "the HMC reference failed its convergence checks: " + "; ".join(problems)
        if on_failure == "raise":
            raise RuntimeError(message)
        warnings.warn(message, ReferenceWarning, stacklevel=2)
    return reference


# ------------------------------------------------------------------------------ predictive


def _unwrap(fn: dist.Distribution) -> dist.Distribution:
    while isinstance(fn, (torch.distributions.Independent, MaskedDistribution,
                          ExpandedDistribution)):
        fn = fn.base_dist
    return fn


def _class_probs(fn: dist.Distribution, obs_site: str) -> torch.Tensor:
    base = _unwrap(fn)
    if isinstance(base, torch.distributions.Categorical):
        probs = base.probs
    elif isinstance(base, torch.distributions.Bernoulli):
        p = base.probs.reshape(-1)
        probs = torch.stack([1 - p, p], -1)
    else:
        raise ValueError(f"model's site {obs_site!r} is a {type(base).__name__}, not a "
                         "Categorical or Bernoulli: pass kind='regression'")
    return probs.reshape(-1, probs.shape[-1])


def reference_predictive(
    model: Callable[..., Any],
    samples: Mapping[str, torch.Tensor] | HMCReference,
    *args: Any,
    kind: str = "auto",
    obs_site: str = "obs",
    seed: int = 0,
    batch_size: int = 1024,
    **kwargs: Any,
) -> torch.Tensor:
    r"""The posterior predictive of ``model`` under ``samples``, as the reference scores take.

    * Classification: :math:`\bar p(y \mid x) = \frac1S \sum_s p(y \mid x, \theta_s)`, the
      ``(num_data, num_classes)`` probabilities for
      :func:`pyro_flat.evaluation.classification.agreement` and
      :func:`~pyro_flat.evaluation.classification.total_variation`. For a
      :class:`pyro_flat.models.bnn.BNN` with a ``Categorical`` likelihood they come from
      :func:`pyro_flat.evaluation.predictive.bma_probs`; otherwise from the distribution of the site
      ``obs_site`` of the model run on each draw (``Categorical``, or ``Bernoulli`` as two classes
      ``[1 - p, p]``).
    * Regression: ``(S, num_data)`` draws :math:`y_s \sim p(y \mid x, \theta_s)`, one per
      posterior draw, observation noise included, from :class:`pyro.infer.Predictive`, for
      :func:`pyro_flat.evaluation.regression.wasserstein2` (an observed site of several dimensions
      per point is flattened).

    Parameters
    ----------
    model : callable
        The model, run as ``model(*args, **kwargs)``: its targets left out (``None``), so that
        ``obs_site`` is sampled, e.g. ``model(x_test)`` for a ``BNN``.
    samples : dict of str to torch.Tensor or HMCReference
        ``{site: (S, *site_shape)}`` draws of every latent site (checked: a missing one would
        silently be drawn from its prior), e.g. ``HMCReference.samples``.
    *args, **kwargs
        The model's inputs.
    kind : {"auto", "classification", "regression"}
        ``"auto"``: classification if ``obs_site`` is ``Categorical`` or ``Bernoulli``.
    obs_site : str
        The name of the observed site (a ``BNN``'s is ``"obs"``).
    seed : int
        Seed of the observation noise of regression draws; the global random state is
        restored afterwards.
    batch_size : int
        Rows per forward pass of :func:`~pyro_flat.evaluation.predictive.bma_probs`.

    Returns
    -------
    torch.Tensor
        ``(num_data, num_classes)`` probabilities or ``(S, num_data)`` draws.

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> def model(x):  # y ~ N(w x, 1): the predictive of a point w = 2 at x = 1 is N(2, 1)
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         return pyro.sample("obs", dist.Normal(w * x, 1.0))
    >>> draws = reference_predictive(model, {"w": torch.full((1000,), 2.0)}, torch.ones(3))
    >>> draws.shape, round(float(draws.mean()), 1), round(float(draws.std()), 1)
    (torch.Size([1000, 3]), 2.0, 1.0)
    """
    if not callable(model):
        raise ValueError(f"model must be a Pyro model (a callable), got {type(model).__name__}")
    if isinstance(samples, HMCReference):
        samples = samples.samples
    if kind not in ("auto", "classification", "regression"):
        raise ValueError(f"kind must be 'auto', 'classification' or 'regression', got {kind!r}")
    seed = validation.integer_at_least("seed", seed, 0)
    batch_size = validation.integer_at_least("batch_size", batch_size, 1)
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError("samples must be a non-empty dict {site: (num_draws, ...)} or an "
                         "HMCReference")
    counts = {k: v.shape[0] if torch.is_tensor(v) and v.dim() >= 1 else None
              for k, v in samples.items()}
    if None in counts.values() or len(set(counts.values())) != 1 or 0 in counts.values():
        raise ValueError(f"samples must hold tensors with the same number (>= 1) of draws "
                         f"along dim 0, got {counts}")
    num_draws = next(iter(counts.values()))

    rng = pyro.util.get_rng_state()
    try:
        with torch.no_grad(), poutine.block():
            trace = poutine.trace(model).get_trace(*args, **kwargs)
    finally:
        pyro.util.set_rng_state(rng)
    sites = latent_sites(trace)
    if obs_site not in sites:
        raise ValueError(f"obs_site {obs_site!r} is not a sampled site of model(*args, **kwargs)"
                         f" (its sampled sites: {sorted(sites)}); leave the targets out of the "
                         "model's arguments")
    missing = sorted(set(sites) - set(samples) - {obs_site})
    if missing:
        raise ValueError(f"samples has no draws of the model's latent sites {missing}")
    for name, value in samples.items():
        if name == obs_site or name not in sites:  # e.g. EntropyMCMC's "<site>__guide"
            continue
        shape = tuple(sites[name]["value"].shape)
        if tuple(value.shape[1:]) != shape:
            raise ValueError(
                f"samples[{name!r}] has shape {tuple(value.shape)}, but the site's draws "
                f"must be (num_draws, *site_shape) = {(num_draws, *shape)}: a draw of another "
                "shape would be broadcast against the model")
    fn = sites[obs_site]["fn"]
    if kind == "auto":
        base = _unwrap(fn)
        kind = "classification" if isinstance(
            base, (torch.distributions.Categorical, torch.distributions.Bernoulli)) \
            else "regression"
    if kind == "regression":
        rng = pyro.util.get_rng_state()
        try:
            pyro.set_rng_seed(seed)
            with torch.no_grad(), poutine.block():
                draws = Predictive(model, posterior_samples=dict(samples),
                                   return_sites=[obs_site])(*args, **kwargs)[obs_site]
        finally:
            pyro.util.set_rng_state(rng)
        return draws.reshape(num_draws, -1)

    _class_probs(fn, obs_site)  # fails early on a continuous site
    if isinstance(model, BNN) and isinstance(model.likelihood, likelihoods.Categorical) \
            and obs_site == "obs" and len(args) >= 1 and not kwargs:
        return bma_probs(model.net, samples, args[0], batch_size=batch_size)
    total = None
    rng = pyro.util.get_rng_state()
    try:
        with torch.no_grad(), poutine.block():
            for s in range(num_draws):
                draw = {k: v[s] for k, v in samples.items()}
                tr = poutine.trace(poutine.condition(model, data=draw)).get_trace(*args,
                                                                                  **kwargs)
                probs = _class_probs(tr.nodes[obs_site]["fn"], obs_site)
                total = probs.clone() if total is None else total + probs
    finally:
        pyro.util.set_rng_state(rng)
    return total / num_draws
