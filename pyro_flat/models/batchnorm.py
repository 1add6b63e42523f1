"""BatchNorm in a Bayesian network: finding its layers, keeping their running statistics through
passes that are not training steps, and recomputing them for a posterior draw.

A pass that is not a training step (the perturbed pass of a sharpness-aware step, the
Hessian-vector products of step-size adaptation) must not move BatchNorm's running mean and
variance: :func:`kept_running_stats` saves them before and restores them after, exactly. A
replay of the model that is not training (the log-likelihood and predictive of
:func:`pyro_flat.to_arviz`) runs it under :func:`evaluation_mode`, which also restores every
module's ``training`` flag.

A BNN's draws are its weights; BatchNorm's running mean and variance are buffers computed from
activations, so a draw that never ran forward (a thinned draw restored later, EntropyMCMC's
guiding variable :math:`\\theta_a`, a SWAG sample) has no statistics of its own:
:func:`recompute_batchnorm` computes them before predicting with that draw, as SWA/SWAG do
(Izmailov et al. 2018; Maddox et al. 2019) and the Entropy-MCMC authors do for
:math:`\\theta_a`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyro.poutine as poutine
import torch
from torch import nn

from pyro_flat import validation

#: The buffers of a BatchNorm layer that a forward pass in training mode updates.
RUNNING_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def model_modules(model: Any) -> list[nn.Module]:
    """Every :class:`torch.nn.Module` reachable from ``model``, each once, roots first.

    The roots: ``model`` itself if it is a :class:`torch.nn.Module`, ``model.__self__`` if it
    is a bound method of one; otherwise the :class:`torch.nn.Module` attributes of a plain
    model object or function (one level, e.g. ``model.net``) and, for a Python function, the
    modules in its closure and the global modules its code names (``def model(x, y): out =
    net(x)`` with a module-level ``net``). All submodules of the roots are returned. Networks
    reached in other ways (through a helper function the model calls) are not found.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Dropout())
    >>> def model(x):
    ...     return net(x)
    >>> [type(m).__name__ for m in model_modules(model)]
    ['Sequential', 'Linear', 'Dropout']
    """
    if model is None:
        return []
    roots: list[nn.Module] = []
    if isinstance(model, nn.Module):
        roots.append(model)
    elif isinstance(getattr(model, "__self__", None), nn.Module):
        roots.append(model.__self__)
    else:
        roots.extend(v for v in getattr(model, "__dict__", {}).values()
                     if isinstance(v, nn.Module))
        if inspect.isfunction(model):
            cells = [c.cell_contents for c in (model.__closure__ or ())
                     if _filled(c)]
            names = model.__code__.co_names
            roots.extend(v for v in cells if isinstance(v, nn.Module))
            roots.extend(model.__globals__[n] for n in names
                         if isinstance(model.__globals__.get(n), nn.Module))
    found: dict[int, nn.Module] = {}
    for root in roots:
        for m in root.modules():
            found.setdefault(id(m), m)
    return list(found.values())


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


def find_batchnorm(model: Any) -> list[nn.Module]:
    """The BatchNorm modules whose running statistics a forward pass of ``model`` may update.

    Those of :func:`model_modules` (the model itself, the module of a bound method, a plain
    model object's module attributes, a function's closure and the global modules its code
    names, and all their submodules) that are BatchNorm, or any ``_NormBase`` with running
    statistics, each once. Networks reached in other ways are not found: pass them explicitly
    where a function takes ``batchnorm_modules=``.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    >>> len(find_batchnorm(net))
    1
    """
    return [m for m in model_modules(model)
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]


@contextmanager
def kept_running_stats(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Restore the running statistics of ``modules`` on exit to their values on entry.

    Examples
    --------
    >>> import torch
    >>> bn = torch.nn.BatchNorm1d(3)
    >>> with kept_running_stats([bn]):
    ...     _ = bn(torch.randn(8, 3))
    >>> float(bn.running_mean.abs().sum()), int(bn.num_batches_tracked)
    (0.0, 0)
    """
    modules = list(modules)
    saved = [[getattr(m, b).clone() if getattr(m, b, None) is not None else None
              for b in RUNNING_BUFFERS] for m in modules]
    try:
        yield
    finally:
        for m, values in zip(modules, saved, strict=True):
            for name, value in zip(RUNNING_BUFFERS, values, strict=True):
                if value is not None:
                    getattr(m, name).copy_(value)


@contextmanager
def evaluation_mode(model: Any, enabled: bool = True) -> Iterator[list[nn.Module]]:
    """Run ``model`` with every module of :func:`model_modules` in evaluation mode, and leave
    them exactly as they were.

    Inside, each module's ``training`` flag is ``False`` (Dropout off, BatchNorm normalising
    with its running statistics); on exit every flag is restored, and the running statistics
    of every BatchNorm layer (``running_mean``, ``running_var``, ``num_batches_tracked``)
    are restored to their values on entry (:func:`kept_running_stats`). ``enabled=False``
    leaves the modes as they are and only restores the statistics. Yields the modules.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    >>> with evaluation_mode(net):
    ...     net.training, net[1].training
    (False, False)
    >>> net.training, net[1].training
    (True, True)
    """
    modules = model_modules(model)
    flags = [m.training for m in modules]
    batchnorm = [m for m in modules
                 if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]
    try:
        with kept_running_stats(batchnorm):
            if enabled:
                for m in modules:
                    m.training = False
            yield modules
    finally:
        for m, flag in zip(modules, flags, strict=True):
            m.training = flag


def recompute_batchnorm(
    net: nn.Module,
    draw: Mapping[str, torch.Tensor] | None,
    x: torch.Tensor,
    *,
    batch_size: int = 256,
) -> list[nn.Module]:
    """Reset and recompute the running statistics of ``net``'s BatchNorm layers under ``draw``.

    Runs ``net`` on ``x`` in training mode, in minibatches of ``batch_size``, with the sampled
    sites set to ``draw`` (``poutine.condition``) and each BatchNorm layer's ``momentum`` set
    to ``None`` (cumulative average), so that the running mean is the average of the batch
    means over ``x`` and the running variance the average of the (unbiased) batch variances,
    as :func:`torch.optim.swa_utils.update_bn` computes them. Afterwards every module is back
    in its former mode and momentum; only the BatchNorm buffers have changed. Nothing is
    recorded for autograd.

    Parameters
    ----------
    net : torch.nn.Module
        The Bayesian network (a ``PyroModule``, or a plain module with ``draw=None``).
    draw : dict or None
        ``{site: tensor}`` of one draw (e.g. ``{k: v[i] for k, v in samples.items()}``);
        ``None`` uses the network as it is.
    x : torch.Tensor
        Inputs to compute the statistics on (usually the training inputs).
    batch_size : int
        Minibatch size, ``>= 1``; use the training batch size so that the statistics match.

    Returns
    -------
    list of torch.nn.Module
        The BatchNorm layers that were updated (empty if the network has none).

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    >>> x = torch.randn(100, 2)
    >>> layers = recompute_batchnorm(net, None, x, batch_size=100)
    >>> torch.allclose(layers[0].running_mean, net[0](x).mean(0).detach(), atol=1e-6)
    True
    """
    batch_size = validation.integer_at_least("batch_size", batch_size, 1)
    layers = find_batchnorm(net)
    if not layers:
        return []
    if x.shape[0] == 0:
        raise ValueError("x must hold at least one input")
    modes = {m: m.training for m in net.modules()}
    momenta = [m.momentum for m in layers]
    run = net if draw is None else poutine.condition(net, data=dict(draw))
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None
        net.train()
        with torch.no_grad():
            for start in range(0, x.shape[0], batch_size):
                run(x[start:start + batch_size])
    finally:
        for m, momentum in zip(layers, momenta, strict=True):
            m.momentum = momentum
        for m, training in modes.items():
            m.training = training
    return layers
