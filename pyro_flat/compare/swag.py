"""SWAG (Maddox et al. 2019) and F-SWAG (SWAG collected along SAM, Nguyen et al. 2023).

The SGD reference's run (:func:`pyro_flat.compare.sgd.train_map`) with
:class:`pyro_flat.infer.SWAG` collecting the parameters at the end of every draw interval after
the warmup quarter, as the SGLD kernels keep their draws (the plan's ``num_draws`` snapshots,
rank ``min(swag_max_rank, snapshots)``); the model average is over ``num_draws`` SWAG draws at
covariance scale ``swag_scale`` (0.5, the authors' choice). F-SWAG takes SAM steps (``rho =
0.05``), two gradients each: at equal gradient evaluations half the steps, collected at half
the interval.
"""

from __future__ import annotations

from functools import partial

from pyro_flat.compare.common import LR4, LR_RHO, Context, Fit, Method, as_site_names
from pyro_flat.compare.sgd import train_map


def run_swag(method: str, ctx: Context, *, sam: bool = False) -> Fit:
    """Collect SWAG along the SGD reference's run (``sam``: along SAM steps) and draw."""
    import pyro
    import torch

    from pyro_flat.infer import SWAG

    p, s = ctx.plan, ctx.settings
    per = 2 if sam else 1
    thin = max(p.thin // p.divisor(per), 1)
    steps = thin * (p.warmup_draws + p.num_draws)
    pyro.set_rng_seed(ctx.seed)
    net = ctx.network()
    swag = SWAG(net, max_rank=min(s.swag_max_rank, p.num_draws))

    def collect(i: int) -> None:
        if i > thin * p.warmup_draws and i % thin == 0:
            swag.collect()

    bar = ctx.progress(steps * per, method)
    try:
        train_map(ctx, net, steps, sam=sam, bar=bar, on_step=collect)
    finally:
        bar.close()
    generator = torch.Generator().manual_seed(ctx.seed)
    draws = as_site_names(swag.draws(p.num_draws, s.swag_scale, generator=generator))
    return Fit(ctx.bayesian_copy(net), draws, steps * per,
               notes={"snapshots": swag.num_snapshots, "rank": len(swag.deviations)})


METHODS = [
    Method("swag", "SWAG: SGD as the reference, one snapshot per draw interval after warmup, "
           "rank <= 20, draws at scale 0.5 (Maddox et al. 2019)", run_swag, search=LR4),
    Method("fswag", "F-SWAG: SWAG along SAM steps (rho 0.05, two gradients per step) "
           "(Nguyen et al. 2023)", partial(run_swag, sam=True), search=LR_RHO,
           baselines=("swag",), aliases=("f-swag",), grads_per_step=2),
]
