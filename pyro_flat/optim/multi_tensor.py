"""A Pyro optimiser that updates all the parameters of an SVI step with one torch optimiser.

:class:`pyro.optim.PyroOptim` gives every parameter its own torch optimiser, so an SVI step
with ``P`` parameter tensors (``AutoNormal``: two per latent site) runs ``P`` optimiser updates
one after the other, each a dozen small tensor operations. :class:`MultiTensorOptim` keeps one
torch optimiser for the set of parameters that are stepped together, with one parameter group
per distinct set of optimiser arguments, and lets torch's multi-tensor (``foreach``)
implementation update them in one pass: the same update rule, a fraction of the dispatch cost.
Where torch has a fused kernel for the optimiser on the parameters' device (Adam, AdamW, SGD and
Adagrad on the CPU and CUDA), it is used: one pass over each parameter's memory per step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import pyro
import torch
from pyro.optim import PyroOptim

__all__ = ["MultiTensorOptim", "MultiTensorAdam"]


def _options(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


class MultiTensorOptim(PyroOptim):
    r"""A drop-in :class:`pyro.optim.PyroOptim` whose parameters share one torch optimiser.

    **Update rule**: that of ``optim_constructor`` (e.g. Adam), applied to every parameter that
    the SVI step touched, as :class:`pyro.optim.PyroOptim` applies it (a parameter not touched
    in a step is not updated and keeps its state); only the grouping differs: one optimiser for
    the parameters stepped together, implemented by torch's fused kernel where it has one for
    the optimiser and the parameters' device (``fused=True``), by its multi-tensor one
    (``foreach=True``) otherwise, unless ``optim_args`` names ``fused`` or ``foreach``. After the
    step the gradients of the stepped parameters are released (``grad = None``, as
    ``torch.optim.Optimizer.zero_grad`` does by default), so that the next backward pass writes
    them instead of adding to zeros.
    Same arguments, state (``get_state`` / ``set_state`` / ``save`` / ``load`` in Pyro's
    per-parameter format, interchangeable with ``pyro.optim``'s) and ``optim_objs`` (every
    parameter maps to its shared optimiser, so code that sets ``lr`` in
    ``optim_objs[p].param_groups`` keeps working, e.g. :class:`~pyro_flat.infer.HWA`).
    Gradient clipping (``clip_args``) is applied per parameter before the step.

    Parameters
    ----------
    optim_constructor : type
        A :class:`torch.optim.Optimizer` class with a multi-tensor implementation (Adam, AdamW,
        SGD, RMSprop, ...).
    optim_args : dict or callable
        As for :class:`pyro.optim.PyroOptim`: a dict, or a callable of the parameter name
        returning one (parameters with equal arguments share a parameter group).
    clip_args : dict or callable, optional
        As for :class:`pyro.optim.PyroOptim`.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import SVI, Trace_ELBO
    >>> from pyro.infer.autoguide import AutoNormal
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> pyro.clear_param_store()
    >>> svi = SVI(model, AutoNormal(model), MultiTensorAdam({"lr": 0.05}), Trace_ELBO())
    >>> y = torch.randn(20) + 3.0
    >>> for _ in range(300):
    ...     loss = svi.step(y)
    >>> round(pyro.param("AutoNormal.locs.mu").item())
    3
    """

    def __init__(self, optim_constructor: type[torch.optim.Optimizer],
                 optim_args: dict | Callable[..., dict],
                 clip_args: dict | Callable[..., dict] | None = None):
        super().__init__(optim_constructor, optim_args, clip_args)
        self._shared: dict[frozenset, torch.optim.Optimizer] = {}

    def _args_for(self, param: torch.Tensor) -> dict:
        args = dict(self._get_optim_args(param))
        if "fused" not in args and "foreach" not in args:
            if self._fused_kernel_for(param):
                args["fused"] = True
            else:
                args["foreach"] = True
        elif not args.get("fused"):
            args.setdefault("foreach", True)
        return args

    #: Device types on which torch's fused optimiser kernels run.
    _FUSED_DEVICES = ("cpu", "cuda")

    def _fused_kernel_for(self, param: torch.Tensor) -> bool:
        """Whether torch's fused implementation of the optimiser applies to ``param``."""
        if "fused" not in inspect.signature(self.pt_optim_constructor).parameters:
            return False
        return (param.device.type in self._FUSED_DEVICES and param.is_floating_point()
                and not param.is_complex())

    def _build(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """One optimiser for ``params`` (one group per distinct arguments), state carried over
        from the optimisers that held them before, or from :meth:`set_state`."""
        groups: list[dict] = []
        for p in params:
            args = self._args_for(p)
            for g in groups:
                if _options(g) == args:
                    g["params"].append(p)
                    break
            else:
                groups.append({"params": [p], **args})
        first = groups[0]
        optimizer = self.pt_optim_constructor([first], **_options(first))
        for g in groups[1:]:
            optimizer.add_param_group(g)
        store = pyro.get_param_store()
        for p in params:
            old = self.optim_objs.get(p)
            if old is not None and p in old.state:
                optimizer.state[p] = old.state[p]
                continue
            waiting = self._state_waiting_to_be_consumed.pop(store.param_name(p), None)
            if waiting is not None:
                self._load_param_state(optimizer, p, waiting)
        for p in params:
            self.optim_objs[p] = optimizer
            self.grad_clip[p] = self._get_grad_clip(p)
        return optimizer

    @staticmethod
    def _load_param_state(optimizer: torch.optim.Optimizer, param: torch.Tensor,
                          state: dict) -> None:
        """Pyro's per-parameter state dict (one parameter, index 0) into ``optimizer``."""
        param_state = state.get("state", {}).get(0)
        if param_state is not None:
            optimizer.state[param] = {k: (v.to(param.device) if torch.is_tensor(v) and k != "step"
                                          else v) for k, v in param_state.items()}
        saved_groups = state.get("param_groups") or [{}]
        for group in optimizer.param_groups:
            if any(p is param for p in group["params"]):
                group.update({k: v for k, v in saved_groups[0].items() if k != "params"})

    def __call__(self, params: Iterable[torch.Tensor], *args: Any, **kwargs: Any) -> None:
        """One update of every parameter in ``params`` (those the SVI step touched)."""
        params = list(params)
        if not params:
            return
        key = frozenset(params)
        optimizer = self._shared.get(key)
        if optimizer is None:
            optimizer = self._shared[key] = self._build(params)
        for p in params:
            clip = self.grad_clip.get(p)
            if clip is not None:
                clip(p)
        optimizer.step(*args, **kwargs)
        for p in params:
            p.grad = None

    def get_state(self) -> dict:
        """Per-parameter state dicts, as :meth:`pyro.optim.PyroOptim.get_state` writes them."""
        store = pyro.get_param_store()
        out = {}
        for p, optimizer in self.optim_objs.items():
            group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
            state = {0: optimizer.state[p]} if p in optimizer.state else {}
            out[store.param_name(p)] = {"state": state,
                                        "param_groups": [{**_options(group), "params": [0]}]}
        return out


def MultiTensorAdam(optim_args: dict | Callable[..., dict],  # noqa: N802 (Pyro's style)
                    clip_args: dict | Callable[..., dict] | None = None) -> MultiTensorOptim:
    """:class:`MultiTensorOptim` with :class:`torch.optim.Adam`: ``pyro.optim.Adam``'s
    update, one multi-tensor step for all parameters (see :class:`MultiTensorOptim`)."""
    return MultiTensorOptim(torch.optim.Adam, optim_args, clip_args)
