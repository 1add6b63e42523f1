"""Deep ensembles (Lakshminarayanan et al. 2017) and F-deep-ensembles (SAM, Nguyen et al. 2023).

``ensemble_size`` networks, each trained from its own random initialisation and minibatch order
like the SGD reference (:func:`pyro_flat.compare.sgd.train_map`); the budget is split among
them: ``budget // ensemble_size`` steps each (with SAM, two gradients per step, half that at
equal gradient evaluations). The
members are the draws of the model average.
"""

from __future__ import annotations

from functools import partial

from pyro_flat.compare.common import (
    LR4,
    LR_RHO,
    Context,
    Fit,
    Method,
    point_draws,
    stack_draws,
)
from pyro_flat.compare.sgd import train_map


def run_ensemble(method: str, ctx: Context, *, sam: bool = False) -> Fit:
    """Train the members as the SGD reference (``sam``: with SAM) from their own starts."""
    import pyro

    members = ctx.plan.ensemble_size
    steps = max(ctx.plan.steps // (members * ctx.plan.divisor(2 if sam else 1)), 1)
    pyro.set_rng_seed(ctx.seed)
    bar = ctx.progress(members * steps * (2 if sam else 1), method)
    draws, net = [], None
    try:
        for _ in range(members):
            net = ctx.network()
            train_map(ctx, net, steps, sam=sam, bar=bar)
            draws.append({k: v[0] for k, v in point_draws(net).items()})
    finally:
        bar.close()
    return Fit(ctx.bayesian_copy(net), stack_draws(draws), members * steps * (2 if sam else 1),
               notes={"members": members, "steps_per_member": steps})


METHODS = [
    Method("ensemble", "deep ensemble: the budget split among its members, each the SGD "
           "reference from its own initialisation (Lakshminarayanan et al. 2017)", run_ensemble,
           search=LR4, aliases=("ensembles", "deep-ensemble")),
    Method("ensemble-sam", "F-deep-ensemble: the same members trained with SAM (rho 0.05, two "
           "gradients per step) (Nguyen et al. 2023)", partial(run_ensemble, sam=True),
           search=LR_RHO, baselines=("ensemble",), aliases=("f-ensemble", "ensembles-sam"),
           grads_per_step=2),
]
