"""Finding a model's BatchNorm layers and keeping their running statistics through extra passes.

A pass that is not a training step (the perturbed pass of a sharpness-aware step, the
Hessian-vector products of step-size adaptation) must not move BatchNorm's running mean and
variance: :func:`kept_running_stats` saves them before and restores them after, exactly. A
replay of the model that is not training (the log-likelihood and predictive of
:func:`pyro_flat.to_arviz`) runs it under :func:`evaluation_mode`, which also restores every
module's ``training`` flag.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

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
