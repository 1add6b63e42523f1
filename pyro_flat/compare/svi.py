"""Variational runners of ``pyro-flat compare``: Bayes by Backprop, HWA and sharpness-aware SVI.

A mean-field Gaussian (:class:`pyro.infer.autoguide.AutoDiagonalNormal`: one flat vector of
means and one of scales, initial scale ``svi_init_scale``, means from the network's own
initialisation) over the same Bayesian network and minibatch likelihood as the kernels, fitted
by :class:`pyro.infer.SVI` with :class:`pyro_flat.infer.LeanELBO` (``Trace_ELBO``'s loss and
gradients without its traces) and Adam (:class:`pyro_flat.optim.MultiTensorAdam`) at ``svi_lr``
and one particle: one gradient evaluation per step (Blundell et al. 2015). HWA
(:class:`pyro_flat.infer.HWA`) spends the first half of the budget on that SVI and the second
half cycling the learning rate from ``svi_lr`` down to ``svi_lr / 10``, one snapshot per cycle,
``num_draws`` cycles; it predicts with its averaged guide. Sharpness-aware SVI
(:class:`pyro_flat.infer.SharpnessAwareELBO`, ``rho = 0.05``) takes two gradients per step,
hence half the steps. The model average is over ``num_draws`` draws of the (averaged) guide.

For speed, the SVI steps run with Pyro's distribution checks off
(``pyro.validation_enabled(False)``; the data are checked once, by the first step), and the
guide is ``AutoDiagonalNormal`` rather than ``AutoNormal`` (the same family, one site instead
of one per weight tensor: one draw and one optimiser update per step).
"""

from __future__ import annotations

from functools import partial

from pyro_flat.compare.common import SVI_LR4, Context, Fit, Method


def run_svi(method: str, ctx: Context, *, sharpness_aware: bool = False, hwa: bool = False
            ) -> Fit:
    """Fit the mean-field guide (``sharpness_aware``: with
    :class:`~pyro_flat.infer.SharpnessAwareELBO`;
    ``hwa``: the second half of the budget in HWA's cycles) and draw from it."""
    import pyro
    from pyro.infer import SVI
    from pyro.infer.autoguide import AutoDiagonalNormal

    from pyro_flat.evaluation.predictive import guide_draws
    from pyro_flat.infer import LeanELBO
    from pyro_flat.models.nn import init_to_network
    from pyro_flat.optim import MultiTensorAdam

    s, p = ctx.settings, ctx.plan
    pyro.clear_param_store()
    pyro.set_rng_seed(ctx.seed)
    model = ctx.bnn()
    guide = AutoDiagonalNormal(model, init_loc_fn=init_to_network, init_scale=s.svi_init_scale)
    per = 1
    if sharpness_aware:
        from pyro_flat.infer import SharpnessAwareELBO

        loss, per = SharpnessAwareELBO(rho=s.rho), 2
    else:
        loss = LeanELBO()
    svi = SVI(model, guide, MultiTensorAdam({"lr": s.svi_lr}), loss)
    steps = p.steps // p.divisor(per)
    stepper, sample_guide, notes = svi, guide, {}
    if hwa:
        from pyro_flat.infer import HWA

        cycle = max((steps - steps // 2) // p.num_draws, 1)
        pretrain = max(steps - cycle * p.num_draws, 0)  # about half the steps
        averaging = HWA(svi, lr_bounds=(s.svi_lr / 10, s.svi_lr), cycle_length=cycle)
        steps = pretrain + cycle * p.num_draws
        notes = {"pretrain_steps": pretrain, "cycle_length": cycle}
    x, y = ctx.data.x_train, ctx.data.y_train
    bar = ctx.progress(steps * per, method)
    try:
        for i in range(steps):
            if hwa and i == pretrain:
                stepper = averaging
            with pyro.validation_enabled(i == 0):
                stepper.step(x, y)
            bar.update(per)
    finally:
        bar.close()
    if hwa:
        sample_guide = averaging.averaged_guide()
        notes["snapshots"] = averaging.num_snapshots
    draws = guide_draws(sample_guide, p.num_draws, x, y)
    return Fit(model.net, draws, steps * per, notes=notes)


METHODS = [
    Method("svi", "Bayes by Backprop: SVI with LeanELBO (Trace_ELBO's loss), a mean-field "
           "Gaussian guide, Adam (lr 1e-3), one particle (Blundell et al. 2015)", run_svi,
           search=SVI_LR4, aliases=("bbb", "trace-elbo"), cost=5.0),
    Method("hwa", "HWA: half the budget SVI as above, then cycles from lr 1e-3 down to 1e-4 "
           "with one average snapshot per cycle; the averaged guide predicts",
           partial(run_svi, hwa=True), search=SVI_LR4, baselines=("svi",), cost=5.0),
    Method("sa-elbo", "sharpness-aware SVI: SharpnessAwareELBO (rho 0.05, two gradients per "
           "step) with the same guide and optimiser (Nguyen et al. 2023)",
           partial(run_svi, sharpness_aware=True),
           search={"svi_lr": (1.0, 3.0), "rho": (0.2, 1.0)}, baselines=("svi",),
           aliases=("sharpness-elbo", "fsgvb", "f-sgvb"), cost=5.0, grads_per_step=2),
]
