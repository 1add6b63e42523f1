"""``pyro.infer.MCMC`` whose ``run`` keeps the draws in one preallocated buffer."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer import MCMC
from pyro.infer.mcmc.api import _UnarySampler
from pyro.util import optional

from pyro_flat import validation

__all__ = ["LeanMCMC"]


class LeanMCMC(MCMC):
    """:class:`pyro.infer.MCMC` with the draws copied into one buffer as they arrive.

    Pyro's ``MCMC.run`` appends each draw to a list and, at the end, stacks the list per chain
    and the chains together: for a moment the draws are in memory three times, and twice for a
    while after. ``LeanMCMC.run`` allocates the ``(num_chains, num_samples, D)`` buffer at the
    first draw (``D``: the values of the ``save_params`` sites) and copies every draw into it,
    so the peak is the draws' bytes once plus a draw or two. With ``disable_progbar=True`` and
    the chains run one after another, ``LeanMCMC`` drives the kernel itself: each draw is
    written straight into the buffer, and the per-draw diagnostics that Pyro's driver formats
    for the progress bar (``kernel.logging()``, to JSON, through a logger) are skipped, as
    Pyro's ``disable_progbar`` documents ("disable progress bar and diagnostics update").
    Everything else is Pyro's:
    the constructor and its arguments, the samplers (chains one after another, or worker
    processes), ``hook_fn``, ``save_params``, transforms to the constrained space,
    :meth:`get_samples`, :meth:`diagnostics`, :meth:`summary`, and the draws themselves, which
    are those of ``pyro.infer.MCMC`` bit for bit. A site with a constrained support is
    transformed into a new tensor, as Pyro does, which adds its bytes.

    Parameters
    ----------
    *args, **kwargs
        Those of :class:`pyro.infer.MCMC`.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_flat import LeanMCMC
    >>> from pyro_flat.infer import SGLD
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> mcmc = LeanMCMC(SGLD(model, step_size=1e-2), num_samples=100, disable_progbar=True)
    >>> mcmc.run(torch.randn(20))
    >>> tuple(mcmc.get_samples(group_by_chain=True)["mu"].shape)
    (1, 100)
    """

    def __init__(self, kernel: Any, num_samples: int, *args: Any, **kwargs: Any):
        _check_arguments(kernel, num_samples, *args, **kwargs)
        super().__init__(kernel, num_samples, *args, **kwargs)

    @poutine.block
    def run(self, *args: Any, **kwargs: Any) -> None:
        """Run the chains and keep their draws (see :meth:`pyro.infer.MCMC.run`)."""
        self._args, self._kwargs = args, kwargs
        received = [0] * self.num_chains  # per chain: the structure, the draws, diagnostics
        z_structure = None
        buffer: torch.Tensor | None = None
        with optional(
            pyro.validation_enabled(not self.disable_validation),
            self.disable_validation is not None,
        ):
            args = [arg.detach() if torch.is_tensor(arg) else arg for arg in args]
            draws = (self._quiet_draws(*args, **kwargs) if self._drives_the_kernel()
                     else self.sampler.run(*args, **kwargs))
            for x, chain_id in _naming_unknown_sites(self, draws):
                n = received[chain_id]
                if n == 0:
                    z_structure = x
                elif n == self.num_samples + 1:
                    self._diagnostics[chain_id] = x
                    continue
                else:
                    if buffer is None:
                        numel = sum(v.numel() for v in x) if isinstance(x, list) else x.numel()
                        first = x[0] if isinstance(x, list) else x
                        buffer = first.new_empty((self.num_chains, self.num_samples, numel))
                    if isinstance(x, list):  # the sites of a draw, flattened into its row
                        torch.cat(x, out=buffer[chain_id, n - 1])
                    else:
                        buffer[chain_id, n - 1] = x
                    del x  # a worker's draw lives in shared memory: free it now
                received[chain_id] += 1

        pos = 0
        z_acc = z_structure.copy()
        for name in sorted(z_structure):
            shape = z_structure[name]
            stop = pos + shape.numel()
            z_acc[name] = buffer[:, :, pos:stop].reshape(
                (self.num_chains, self.num_samples) + shape)
            pos = stop
        if self.transforms is None:
            self._set_transforms(*args, **kwargs)
        for name, z in z_acc.items():
            if name in self.transforms:
                z_acc[name] = self.transforms[name].inv(z)
        self._samples = z_acc
        self.sampler.terminate(True)

    def _drives_the_kernel(self) -> bool:
        """Whether :meth:`run` drives the kernel itself (no progress bar, chains in turn)."""
        sampler = self.sampler
        return type(sampler) is _UnarySampler and sampler.disable_progbar

    def _quiet_draws(self, *args: Any, **kwargs: Any) -> Iterator[tuple[Any, int]]:
        """The draws of Pyro's sequential sampler without its progress bar's per-draw
        diagnostics: per chain, the sites' shapes, each draw as the list of its flattened
        ``save_params`` sites (in Pyro's order), then the kernel's diagnostics."""
        kernel, sampler = self.kernel, self.sampler
        for chain in range(self.num_chains):
            if sampler.initial_params is not None:
                kernel.initial_params = {k: v[chain] for k, v in sampler.initial_params.items()}
            name = None if self.num_chains == 1 else chain
            hook = sampler.hook or _no_hook
            kernel.setup(self.warmup_steps, *args, **kwargs)
            params = kernel.initial_params
            save_params = getattr(kernel, "save_params", sorted(params))
            yield {site: params[site].shape for site in save_params}, chain
            for stage, count in (("Warmup", self.warmup_steps), ("Sample", self.num_samples)):
                label = stage if name is None else f"{stage} [{name}]"
                for i in range(count):
                    params = kernel.sample(params)
                    hook(kernel, params, label, i)
                    if stage == "Sample":
                        flat = [params[site].reshape(-1) for site in save_params]
                        yield flat if flat else torch.tensor(flat), chain  # no site: as Pyro
            yield kernel.diagnostics(), chain
            kernel.cleanup()


def _no_hook(kernel: Any, params: Any, stage: str, i: int) -> None:
    pass


def _check_arguments(kernel: Any, num_samples: int, *args: Any, **kwargs: Any) -> None:
    """The checks :class:`pyro.infer.MCMC` leaves to the run (or to nobody)."""
    bound = inspect.signature(MCMC.__init__).bind(None, kernel, num_samples, *args, **kwargs)
    given = bound.arguments
    validation.mcmc_kernel("kernel", kernel)
    validation.integer_at_least("num_samples", num_samples, 1)
    if given.get("warmup_steps") is not None:
        validation.integer_at_least("warmup_steps", given["warmup_steps"], 0)
    validation.integer_at_least("num_chains", given.get("num_chains", 1), 1)
    validation.optional_callable("hook_fn", given.get("hook_fn"),
                                 "hook_fn(kernel, params, stage, i)")
    if given.get("save_params") is not None:
        validation.names("save_params", given["save_params"])


def _naming_unknown_sites(mcmc: LeanMCMC, draws: Iterator) -> Iterator:
    """Pyro's sampler raises a bare ``KeyError`` for a ``save_params`` name that is no site."""
    try:
        yield from draws
    except KeyError as error:
        name = error.args[0] if error.args else None
        if name not in (getattr(mcmc.kernel, "save_params", None) or []):
            raise
        sites = sorted(getattr(mcmc.kernel, "initial_params", None) or {})
        raise ValueError(f"save_params names {name!r}, which is not a latent site of the model "
                         f"(its sites: {sites})") from None
