"""SG-MCMC runners of ``pyro-flat compare``: one small kernel builder per method.

Each builder returns the kernel, the number of kept draws and of warmup draws, and the gradient
evaluations per SG step; :func:`run_kernel` runs it through :class:`pyro.infer.MCMC` on the
shared Bayesian network and likelihood. Step sizes come from one SGD learning rate ``lr`` on
the *mean* loss: the kernels act on ``U``, ``N`` times the mean loss, so ``step_size = lr / N``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from pyro_flat.compare.common import LR4, LR_RHO, Context, Fit, Method
from pyro_flat.compare.config import (
    ENTROPY_AUTHORS_DRAWS_PER_CYCLE,
    ENTROPY_AUTHORS_TEMPERATURE,
    Settings,
)

if TYPE_CHECKING:
    from pyro_flat.models.bnn import BNN

#: ``(kernel, num_samples, warmup_steps, gradient evaluations per SG step)``
_Built = tuple[Any, int, int, int]


def _sgld(model: BNN, ctx: Context) -> _Built:
    from pyro_flat.infer import SGLD

    s, p = ctx.settings, ctx.plan
    kernel = SGLD(model, step_size=s.lr / ctx.num_train, num_steps_per_sample=p.thin,
                  temperature=s.temperature)
    return kernel, p.num_draws, p.warmup_draws, 1


def _sghmc(model: BNN, ctx: Context) -> _Built:
    from pyro_flat.infer import SGHMC

    s, p = ctx.settings, ctx.plan
    kernel = SGHMC.from_sgd(model, s.lr * (1 - s.momentum), s.momentum, ctx.num_train,
                            num_steps_per_sample=p.thin, temperature=s.temperature)
    return kernel, p.num_draws, p.warmup_draws, 1


def _csgld(model: BNN, ctx: Context) -> _Built:
    from pyro_flat.infer import CyclicalSGLD

    s, p = ctx.settings, ctx.plan
    kernel = CyclicalSGLD(model, step_size=2 * s.lr / ctx.num_train, cycle_length=p.cycle_length,
                          exploration_fraction=s.exploration_fraction,
                          draws_per_cycle=p.draws_per_cycle, temperature=s.temperature)
    kept = (p.num_cycles - p.warmup_cycles) * p.draws_per_cycle
    return kernel, kept, p.warmup_cycles * p.draws_per_cycle, 1


def cosine_step(t: int, base: float, cycle_length: int) -> float:
    """Cyclical SGLD's cosine schedule: ``base / 2 (cos(pi (t mod L) / L) + 1)``."""
    return 0.5 * base * (math.cos(math.pi * (t % cycle_length) / cycle_length) + 1.0)


def _entropy(model: BNN, ctx: Context) -> _Built:
    from pyro_flat.infer import EntropyMCMC

    s, p = ctx.settings, ctx.plan
    step = s.lr / ctx.num_train
    if s.protocol == "authors":  # cosine cycles (mean step lr / N), T = 1e-4
        schedule = partial(cosine_step, base=2 * step, cycle_length=p.cycle_length)
        kernel = EntropyMCMC(model, step_size_schedule=schedule,
                             eta=step / s.entropy_step_over_eta,
                             num_steps_per_sample=p.thin,
                             temperature=ENTROPY_AUTHORS_TEMPERATURE)
    else:
        kernel = EntropyMCMC(model, step_size=step, eta=step / s.entropy_step_over_eta,
                             num_steps_per_sample=p.thin, temperature=s.temperature)
    return kernel, p.num_draws, p.warmup_draws, 1


def cycle_end_draws(num_draws: int, draws_per_cycle: int, keep: int) -> list[int]:
    """Indices of the last ``keep`` draws of each cycle of ``draws_per_cycle`` draws.

    Examples
    --------
    >>> cycle_end_draws(8, 4, 2)
    [2, 3, 6, 7]
    """
    keep = min(keep, draws_per_cycle)
    return [i for i in range(num_draws) if i % draws_per_cycle >= draws_per_cycle - keep]


def _sasgld(model: BNN, ctx: Context) -> _Built:
    from pyro_flat.infer import SASGLD

    s, p = ctx.settings, ctx.plan  # two gradients per step: half SGLD's steps at equal grads
    kernel = SASGLD(model, step_size=s.lr / ctx.num_train, rho=s.rho,
                    temperature=s.temperature,
                    num_steps_per_sample=max(p.thin // p.divisor(2), 1))
    return kernel, p.num_draws, p.warmup_draws, 2


#: Number of bins of ContourSGLD's energy partition, placed from the energies of the last half
#: of warmup (``auto_bins``), with the paper's flattening and SA gain (``Settings.contour_zeta``,
#: default 0.75; see docs/methods/contour_sgld.md, "When to prefer it").
CONTOUR_BINS = 100


def _contour(model: BNN, ctx: Context) -> _Built:
    from pyro_flat.infer import ContourSGLD

    s, p = ctx.settings, ctx.plan
    kernel = ContourSGLD(model, step_size=s.lr / ctx.num_train, num_bins=CONTOUR_BINS,
                         auto_bins=True, zeta=s.contour_zeta, num_steps_per_sample=p.thin,
                         temperature=s.temperature)
    return kernel, p.num_draws, p.warmup_draws, 1


def _l2e(model: BNN, ctx: Context) -> _Built:
    from pyro_flat.infer import L2E

    s, p = ctx.settings, ctx.plan
    kernel = L2E(model, step_mult=s.l2e_step_mult, num_steps_per_sample=p.thin,
                 temperature=s.temperature)
    return kernel, p.num_draws, p.warmup_draws, 1


#: A method's post-processing of its run: ``(ctx, samples, idata) -> (samples, idata,
#: weights, notes)``.
_Finish = Callable[[Context, dict, Any], tuple[dict, Any, Any, dict]]


def run_kernel(method: str, ctx: Context,
               build: Callable[[BNN, Context], tuple[Any, int, int, int]],
               finish: _Finish | None = None) -> Fit:
    """Sample with the kernel ``build`` makes; the draws (after ``finish``), the ArviZ export
    and the step count."""
    import pyro
    from pyro.infer import MCMC

    from pyro_flat import to_arviz

    pyro.clear_param_store()
    pyro.set_rng_seed(ctx.seed)
    model = ctx.bnn()
    kernel, num_samples, warmup, grads_per_step = build(model, ctx)
    per_draw = getattr(kernel, "num_steps_per_sample", 1) * grads_per_step
    bar = ctx.progress(per_draw * (num_samples + warmup), method)
    last = [0]

    def hook(kernel: Any, *_: Any) -> None:  # after every draw (warmup or kept)
        done = getattr(kernel, "num_steps", 0) * grads_per_step
        bar.update(done - last[0])
        last[0] = done

    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True,
                hook_fn=hook)
    try:
        mcmc.run(ctx.data.x_train, ctx.data.y_train)
    finally:
        bar.close()
    samples = mcmc.get_samples()
    # ArviZ's groups on the *test* set (log-likelihood per test point, the test labels), so
    # that arviz.compare ranks the methods by their predictive accuracy on held-out data
    idata = to_arviz(mcmc, model=model, model_args=(ctx.data.x_test, ctx.data.y_test))
    weights, notes = None, {}
    if finish is not None:
        samples, idata, weights, notes = finish(ctx, samples, idata)
    return Fit(model.net, samples, kernel.num_steps * grads_per_step, idata=idata, weights=weights,
               notes=notes)


def _entropy_draws(ctx: Context, samples: dict, idata: Any) -> tuple[dict, Any, Any, dict]:
    """EntropyMCMC's model average, as the authors take it: theta and theta_a draws (with
    ``--protocol authors``, the draws at the ends of the cycles)."""
    from pyro_flat.infer.mcmc.entropy import select_draws

    notes: dict[str, Any] = {}
    if ctx.settings.protocol == "authors":
        p = ctx.plan
        keep = cycle_end_draws(p.num_draws, p.draws_per_cycle, ENTROPY_AUTHORS_DRAWS_PER_CYCLE)
        samples = {k: v[keep] for k, v in samples.items()}
        idata = idata.isel(draw=keep)
        notes = {"protocol": "authors", "temperature": ENTROPY_AUTHORS_TEMPERATURE,
                 "schedule": (f"cosine cycles of {p.cycle_length} steps from "
                              f"{2 * ctx.settings.lr:g}/N"),
                 "draws_per_cycle": len(keep) // max(p.num_cycles - p.warmup_cycles, 1)}
    return select_draws(samples, "both"), idata, None, notes


def _contour_weights(ctx: Context, samples: dict, idata: Any) -> tuple[dict, Any, Any, dict]:
    """ContourSGLD's importance weights back to the posterior, ``softmax(log_weight)``, with
    their effective sample size (the kernel warns below its threshold)."""
    import torch

    from pyro_flat.infer.mcmc.contour import weights_ess, weights_ess_threshold

    log_w = torch.as_tensor(idata.sample_stats["log_weight"].values).reshape(-1)
    notes = {"weights_ess": round(float(weights_ess(log_w)), 2),
             "weights_ess_of": len(log_w),
             "weights_ess_threshold": weights_ess_threshold(len(log_w))}
    return samples, idata, torch.softmax(log_w.double(), 0), notes


def kernel(build: Callable[[BNN, Context], tuple[Any, int, int, int]],
           finish: _Finish | None = None) -> Callable[[str, Context], Fit]:
    """A method's runner: :func:`run_kernel` with its kernel builder and post-processing."""
    return partial(run_kernel, build=build, finish=finish)


METHODS = [
    Method("sgld", "SGLD, step_size = lr/N (Welling & Teh 2011)", kernel(_sgld), search=LR4),
    Method("sghmc", "SGHMC = SGD with momentum 0.9 at rate lr*(1-0.9) plus noise "
           "(Chen et al. 2014)", kernel(_sghmc), search=LR4),
    Method("csgld", "cyclical SGLD: cosine cycles from 2*lr/N, first 80% of each cycle "
           "noiseless, draws at the end of each cycle (Zhang et al. 2020)", kernel(_csgld),
           search=LR4, aliases=("cyclical-sgld", "cyclicalsgld", "cyclical_sgld")),
    Method("entropy", "EntropyMCMC: SGLD coupled to a guiding copy, eta = 40*lr/N; "
           "averages theta and guide draws; with --protocol authors cosine cycles at T = 1e-4, "
           "2 draws at the end of each cycle (Li & Zhang 2024)",
           kernel(_entropy, _entropy_draws),
           search={"lr": (0.5, 1.0), "entropy_step_over_eta": (0.1, 1.0)},
           baselines=("sgld", "csgld")),
    Method("sasgld", "sharpness-aware SGLD, rho = 0.05, two gradients per step "
           "(Nguyen et al. 2023)", kernel(_sasgld), search=LR_RHO, baselines=("sgld",),
           grads_per_step=2),
    Method("contour", f"ContourSGLD: SGLD on the flattened target, {CONTOUR_BINS} energy "
           f"bins from warmup, zeta = {Settings.contour_zeta}; reweighted draws "
           "(Deng et al. 2020)", kernel(_contour, _contour_weights),
           search={"lr": (0.5, 1.0), "contour_zeta": (1.0, 4.0)}, baselines=("sgld",)),
    Method("l2e", "L2E: the meta-learned sampler with its shipped meta-parameters, step "
           "sqrt(2/N), friction 0.1 (Kim et al. 2024)", kernel(_l2e),
           search={"l2e_step_mult": (0.25, 0.5, 1.0, 2.0)}, cost=4.0),
]
