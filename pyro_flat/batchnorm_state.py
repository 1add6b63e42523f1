"""Finding a model's BatchNorm layers and keeping their running statistics through extra passes.

A pass that is not a training step (the perturbed pass of a sharpness-aware step, the
Hessian-vector products of step-size adaptation) must not move BatchNorm's running mean and
variance: :func:`kept_running_stats` saves them before and restores them after, exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

#: The buffers of a BatchNorm layer that a forward pass in training mode updates.
RUNNING_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def find_batchnorm(model: Any) -> list[nn.Module]:
    """The BatchNorm modules whose running statistics a forward pass of ``model`` may update.

    The rule: ``model`` itself if it is a :class:`torch.nn.Module`, ``model.__self__`` if it is
    a bound method of one, and the :class:`torch.nn.Module` attributes of a plain model object
    or function (one level, e.g. ``model.net``); all their submodules that are BatchNorm (or
    any ``_NormBase`` with running statistics) are returned, each once. Networks reached in
    other ways (globals, closures) are not found: pass them explicitly where a function takes
    ``batchnorm_modules=``.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    >>> len(find_batchnorm(net))
    1
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
    found: dict[int, nn.Module] = {}
    for root in roots:
        for m in root.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
                found.setdefault(id(m), m)
    return list(found.values())


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
