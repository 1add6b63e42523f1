"""The last-layer Laplace baseline of ``pyro-flat compare`` (classification).

The network is trained as the SGD reference (:func:`pyro_flat.compare.sgd.train_map`, the same
steps), then its last linear layer gets the Laplace approximation
(:class:`pyro_flat.infer.laplace.LastLayerLaplace`: Kronecker-factored GGN, prior precision by
the marginal likelihood); the draws are the trained network with its last layer drawn from that
Gaussian, ``num_draws`` of them. The curvature costs one pass over the training data, counted
as ``ceil(N / B)`` gradient evaluations. Under ``--protocol finetune`` the network is the head
on the frozen backbone's features, so this is the Laplace approximation of the trained
network's last layer.
"""

from __future__ import annotations

import math

import torch

from pyro_flat.compare.common import LR4, Context, Fit, Method, as_site_names, point_draws
from pyro_flat.compare.sgd import train_reference


def run_laplace(method: str, ctx: Context) -> Fit:
    """The SGD reference's network, then the Laplace approximation of its last layer."""
    from pyro_flat.infer.laplace import LastLayerLaplace, SubnetworkLaplace
    from pyro_flat.models.finetune import lora_parameter_names

    if ctx.task != "classification":
        raise ValueError("laplace is a classification baseline here: the regression networks' "
                         "heteroskedastic head has no Gaussian likelihood of fixed noise")
    net = train_reference(method, ctx).eval()
    steps = ctx.plan.steps
    data = ctx.data
    num, generator = ctx.plan.num_draws, torch.Generator().manual_seed(ctx.seed)
    draws = {k: v.expand(num, *v.shape[1:]).clone() for k, v in point_draws(net).items()}
    adapters = lora_parameter_names(net)
    if adapters:  # --protocol finetune --finetune-part adapters: the adapters' factors
        la = SubnetworkLaplace(net, adapters, "classification", "diag")
        structure = "diag (adapters)"
    else:
        la, structure = LastLayerLaplace(net, "classification", "kron"), "kron"
    la.fit(data.x_train, data.y_train)
    delta = la.optimize_prior_precision()
    draws.update(as_site_names(la.sample_named(num, generator)))
    passes = math.ceil(ctx.num_train / min(ctx.settings.batch_size, ctx.num_train))
    notes = {"prior_precision": delta, "log_marginal_likelihood": la.log_marginal_likelihood(),
             "log_det_precision": la.log_det_precision(), "structure": structure}
    return Fit(ctx.bayesian_copy(net), draws, steps + passes, notes=notes)


METHODS = [
    Method("laplace", "last-layer Laplace of the SGD reference's network: Kronecker-factored "
           "GGN, prior precision by the marginal likelihood (classification)", run_laplace,
           search=LR4, baselines=("sgd",), cost=1.0, tasks=("classification",)),
]
