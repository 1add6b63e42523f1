"""Checkpoints of an SG-MCMC kernel: the object (``kernel.checkpoints``) that saves a chain and
continues it bitwise (position, named state, minibatch streams, random streams, what warmup
adapted)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyro.util
import torch

from pyro_flat.infer.mcmc.state import KernelState

#: Checkpoint format: 2 names the kernel state's fields (``state_fields``); 1, the format
#: before named state, has the same keys for every kernel and still loads.
_STATE_VERSION = 2
_LOADABLE_VERSIONS = (1, 2)


def state_fingerprint(z: torch.Tensor) -> str:
    """A short hash of a chain's position (all vectorised chains), to tell whether a checkpoint
    continues a run: the position after a run's last draw is the one its checkpoint holds."""
    import hashlib

    data = z.detach().cpu().contiguous().numpy().tobytes()
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()[:16]


def portable_rng_state(state: dict[str, Any]) -> dict[str, Any]:
    """Pyro's random state (``pyro.util.get_rng_state()``) with NumPy's key as a tensor, so that
    ``torch.load`` with its default ``weights_only=True`` reads a saved checkpoint."""
    numpy_state = state.get("numpy")
    if numpy_state is None or not isinstance(numpy_state[1], np.ndarray):
        return state
    name, key, pos, has_gauss, cached = numpy_state
    return {**state, "numpy": (str(name), torch.from_numpy(key.astype(np.int64)), int(pos),
                               int(has_gauss), float(cached))}


def native_rng_state(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`portable_rng_state` (a state saved as NumPy's passes through)."""
    numpy_state = state.get("numpy")
    if numpy_state is None or not isinstance(numpy_state[1], torch.Tensor):
        return state
    name, key, pos, has_gauss, cached = numpy_state
    return {**state, "numpy": (name, key.numpy().astype(np.uint32), pos, has_gauss, cached)}


class Checkpoints:
    """The checkpoints of one kernel (``kernel.checkpoints``): saves its chain and continues it
    bitwise, through the kernel's public state (``state``, ``position``, ``layout``,
    ``minibatches``, the random streams, ``warmup``). The kernel's ``state_dict`` and
    ``load_state_dict`` are this object's :meth:`state_dict` and :meth:`load`.

    A loaded checkpoint waits for the next run: :meth:`start_run`, called by the kernel's
    ``setup``, restores it. :meth:`end_run`, called when the run ends, keeps the random
    states of that moment, so that a checkpoint taken later (after other random work, e.g.
    building the next model) still continues the chain.

    Parameters
    ----------
    kernel : SGMCMCKernel
        The kernel whose chain is saved.
    """

    def __init__(self, kernel: Any):
        self.kernel = kernel
        #: A loaded checkpoint, restored at the next run.
        self.pending: dict[str, Any] | None = None
        #: ``(SG steps, fingerprint of the position)`` of the checkpoint this run continues.
        self.resumed_from: tuple[int, str] | None = None
        #: ``(SG steps, Pyro's random state, the chains' streams)`` when the last run ended.
        self.run_end: tuple[int, dict[str, Any], Any] | None = None
        #: Each chain's last finite position in the checkpoint this run continues (``None``:
        #: none, or a checkpoint written before it was saved: the position is used).
        self.last_finite: torch.Tensor | None = None

    @property
    def run_ended(self) -> bool:
        """Whether the kernel's run has ended (:meth:`end_run`) since it was set up."""
        return self.run_end is not None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the chain exactly where it stopped."""
        kernel = self.kernel
        if kernel.state is None:
            raise RuntimeError("state_dict() needs a kernel that has run (or been set up)")
        streams = kernel.chain_streams
        ended = self.run_end is not None and self.run_end[0] == kernel.num_steps
        if ended:
            rng, chain_rng = self.run_end[1], self.run_end[2]
        else:  # between draws of a run (e.g. from a hook_fn)
            rng = pyro.util.get_rng_state()
            chain_rng = None if streams is None else streams.get_state()
        return {
            "version": _STATE_VERSION,
            "kernel": type(kernel).__name__,
            "sites": [(s.name, tuple(s.shape)) for s in kernel.layout.sites],
            "z": kernel.position.detach().clone(),
            # where a chain whose next step is not finite falls back to: the position its last
            # finite step started from, not the position it ended at
            "last_finite": kernel.chains.last_finite.detach().clone(),
            "num_sg_steps": kernel.num_steps,
            "kernel_state": kernel.state.checkpoint(),
            "minibatch": None if kernel.minibatches is None else kernel.minibatches.state_dict(),
            "rng": portable_rng_state(rng),
            "aux_rng": kernel.aux_generator_state(),
            "chain_rng": chain_rng,
            "adaptation": kernel.warmup.state_dict(),
        }

    def load(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the kernel's next run."""
        name = type(self.kernel).__name__
        if state.get("version") not in _LOADABLE_VERSIONS or state.get("kernel") != name:
            raise ValueError(
                f"state was saved by {state.get('kernel')!r} (version {state.get('version')}), "
                f"not by {name} (versions {_LOADABLE_VERSIONS} load)"
            )
        self.pending = state

    def start_run(self) -> torch.Tensor | None:
        """At the start of a run: restore the loaded checkpoint, if any, into the kernel and
        return its position, one row per chain (``None`` without one)."""
        saved, self.pending = self.pending, None
        self.resumed_from = self.run_end = self.last_finite = None
        if saved is None:
            return None
        z = self._restore(saved)
        self.resumed_from = (self.kernel.num_steps, state_fingerprint(z))
        return z

    def end_run(self) -> None:
        """At the end of a run: keep the random states of this moment."""
        kernel = self.kernel
        streams = kernel.chain_streams
        self.run_end = (kernel.num_steps, pyro.util.get_rng_state(),
                        None if streams is None else streams.get_state())

    def _restore(self, state: dict[str, Any]) -> torch.Tensor:
        kernel = self.kernel
        sites = [(s.name, tuple(s.shape)) for s in kernel.layout.sites]
        if [tuple(x) for x in state["sites"]] != [(n, tuple(s)) for n, s in sites]:
            raise ValueError(f"saved sites {state['sites']} differ from the model's {sites}")
        z = state["z"].clone()
        k = kernel.vectorized_chains
        expected = (kernel.layout.size,) if k is None else (k, kernel.layout.size)
        if tuple(z.shape) != expected:
            raise ValueError(f"the checkpoint holds parameters of shape {tuple(z.shape)}; this "
                             f"kernel's are {expected} (vectorized_chains={k})")
        rows = z if k is not None else z.unsqueeze(0)  # one row per chain, a single chain one
        kernel.state = KernelState.create(rows, kernel.state_fields(), int(state["num_sg_steps"]))
        kernel.state.load(state["kernel_state"])
        last_finite = state.get("last_finite")
        if last_finite is not None:
            self.last_finite = last_finite.to(rows.device, rows.dtype).reshape(rows.shape)
        if kernel.minibatches is not None and state["minibatch"] is not None:
            kernel.minibatches.load_state_dict(state["minibatch"])
        pyro.util.set_rng_state(native_rng_state(state["rng"]))
        kernel.aux_generator.set_state(state["aux_rng"])
        if kernel.chain_streams is not None:
            kernel.chain_streams.set_state(state["chain_rng"])
        adapted = state.get("adaptation")  # absent from checkpoints written before adaptation
        if adapted is not None:
            kernel.warmup.load_state_dict(adapted)
        return rows
