"""SGD (or SAM) training of the plain network at the prior's MAP, and the SGD reference.

The loss is the mean negative log-likelihood of a minibatch under the likelihood of the
Bayesian methods (:meth:`~pyro_flat.compare.common.Context.loss`: the cross-entropy, or the
Gaussian NLL of the regression head) plus the prior's penalty: ``-log N(w; 0,
s^2)`` per data point is ``w^2 / (2 s^2 N)`` plus a constant, whose gradient is SGD's weight
decay ``1 / (s^2 N)``, with ``s`` as :func:`pyro_flat.models.nn.make_bayesian` sets it
(``prior_scale`` divided by the square root of the fan-in of the layer's weight under the
``"fan_in"`` rule, for the weight and the bias). SGD with momentum 0.9 at rate ``lr * (1 - 0.9)``,
the same effective rate ``lr`` as SGHMC; minibatches drawn epoch by epoch without replacement, the
last partial batch dropped, as the kernels do. SAM (:class:`pyro_flat.optim.SAM`, ``rho = 0.05``)
wraps the same SGD and costs two gradient evaluations per step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pyro_flat.compare.common import LR4, Context, Fit, Method, point_draws


def _param_groups(net: torch.nn.Module, ctx: Context) -> list[dict]:
    s, n = ctx.settings, ctx.num_train

    def decay(matrix: torch.Tensor) -> float:  # the prior's penalty, as make_bayesian's scale
        fan_in = matrix[0].numel() if s.scale_rule == "fan_in" else 1
        return 1 / (s.prior_scale**2 / fan_in * n)

    groups = []
    for layer in net.modules():
        weight = getattr(layer, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.dim() >= 2:
            groups.append({"params": list(layer.parameters(recurse=False)),
                           "weight_decay": decay(weight)})
        else:  # e.g. a low-rank adapter's factors (its frozen weight is a buffer)
            groups += [{"params": [p], "weight_decay": decay(p)}
                       for p in layer.parameters(recurse=False) if p.dim() >= 2]
    return groups


def train_map(
    ctx: Context,
    net: torch.nn.Module,
    steps: int,
    *,
    sam: bool = False,
    bar: object = None,
    on_step: Callable[[int], None] | None = None,
) -> None:
    """``steps`` SGD (or SAM) steps on the MAP loss; ``on_step(i)`` after step ``i`` (1-based).

    ``bar.update`` is told the gradient evaluations (two per SAM step).
    """
    from pyro_flat.optim import SAM

    s, data = ctx.settings, ctx.data
    n, b = ctx.num_train, min(s.batch_size, ctx.num_train)
    kwargs = dict(lr=s.lr * (1 - s.momentum), momentum=s.momentum)
    groups = _param_groups(net, ctx)
    opt = (SAM(groups, torch.optim.SGD, rho=s.rho, **kwargs) if sam
           else torch.optim.SGD(groups, **kwargs))
    device = data.x_train.device
    perm, pos = None, n
    net.train()
    for i in range(1, steps + 1):
        if pos + b > n:  # a new epoch: shuffle, drop the last partial batch (as the kernels do)
            perm, pos = torch.randperm(n, device=device), 0
        idx = perm[pos : pos + b]
        pos += b
        x, y = data.x_train[idx], data.y_train[idx]

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = ctx.loss(net(x), y)
            loss.backward()
            return loss

        if sam:
            opt.step(closure)
        else:
            closure()
            opt.step()
        if bar is not None:
            bar.update(2 if sam else 1)
        if on_step is not None:
            on_step(i)


def train_reference(method: str, ctx: Context) -> torch.nn.Module:
    """The reference's network: ``ctx.network()`` after the plan's SGD steps on the MAP loss,
    seeded by ``ctx.seed`` (the progress bar labelled ``method``)."""
    import pyro

    pyro.set_rng_seed(ctx.seed)
    net = ctx.network()
    bar = ctx.progress(ctx.plan.steps, method)
    try:
        train_map(ctx, net, ctx.plan.steps, bar=bar)
    finally:
        bar.close()
    return net


def run_sgd(method: str, ctx: Context) -> Fit:
    """The reference: one network at the MAP, its parameters as a single draw."""
    net = train_reference(method, ctx)
    return Fit(ctx.bayesian_copy(net), point_draws(net), ctx.plan.steps)


METHODS = [
    Method("sgd", "reference: SGD with momentum 0.9 at rate lr*(1-0.9) on the mean loss plus "
           "the prior's penalty (the MAP); always runs", run_sgd, search=LR4),
]
