"""Checkpoints of an SG-MCMC kernel: the part of :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`
that saves a chain and continues it bitwise (position, named state, minibatch streams, random
streams, what warmup adapted)."""

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
    """Mixin of :class:`~pyro_flat.infer.mcmc.base.SGMCMCKernel`: ``state_dict`` and
    ``load_state_dict``."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this chain exactly where it stopped.

        Call it after ``MCMC.run`` (the random state is the one at the end of the run) or
        between draws from a ``hook_fn``; pass the result to :meth:`load_state_dict` of a
        kernel built with the same arguments before the next run.
        """
        if self.state is None:
            raise RuntimeError("state_dict() needs a kernel that has run (or been set up)")
        return {
            "version": _STATE_VERSION,
            "kernel": type(self).__name__,
            "sites": [(s.name, tuple(s.shape)) for s in self.layout.sites],
            "z": self.position.detach().clone(),
            "num_sg_steps": self.num_steps,
            "kernel_state": self.state.checkpoint(),
            "minibatch": None if self.minibatches is None else self.minibatches.state_dict(),
            "rng": portable_rng_state(self._rng_for_checkpoint()),
            "aux_rng": self.aux_generator_state(),
            "chain_rng": None if self.chain_streams is None else self._chain_rng_for_checkpoint(),
            "adaptation": self.warmup.state_dict(),
        }

    def position_fingerprint(self) -> str:
        """:func:`state_fingerprint` of the chain's position now (after a run: the position
        its checkpoint holds)."""
        return state_fingerprint(self.position)

    def aux_generator_state(self) -> torch.Tensor:
        """State of ``aux_generator`` for a checkpoint (a kernel that draws ahead overrides)."""
        return self.aux_generator.get_state()

    def _chain_rng_for_checkpoint(self) -> list[torch.Tensor]:
        end = getattr(self, "_chain_rng_at_end", None)
        if end is not None and end[0] == self.num_steps:
            return end[1]
        return self.chain_streams.get_state()

    def _rng_for_checkpoint(self) -> dict[str, Any]:
        end = getattr(self, "_rng_at_end", None)
        if end is not None and end[0] == self.num_steps:
            return end[1]
        return pyro.util.get_rng_state()  # between draws of a run (e.g. from a hook_fn)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next
        :meth:`~pyro_flat.infer.mcmc.base.SGMCMCKernel.setup` (i.e. the next ``MCMC.run``)."""
        if (state.get("version") not in _LOADABLE_VERSIONS
                or state.get("kernel") != type(self).__name__):
            raise ValueError(
                f"state was saved by {state.get('kernel')!r} (version {state.get('version')}), "
                f"not by {type(self).__name__} (versions {_LOADABLE_VERSIONS} load)"
            )
        self._resume_state = state

    def _restore(self, state: dict[str, Any]) -> torch.Tensor:
        sites = [(s.name, tuple(s.shape)) for s in self.layout.sites]
        if [tuple(x) for x in state["sites"]] != [(n, tuple(s)) for n, s in sites]:
            raise ValueError(f"saved sites {state['sites']} differ from the model's {sites}")
        z = state["z"].clone()
        expected = (self.layout.size,) if self.vectorized_chains is None else (
            self.vectorized_chains, self.layout.size)
        if tuple(z.shape) != expected:
            raise ValueError(f"the checkpoint holds parameters of shape {tuple(z.shape)}; this "
                             f"kernel's are {expected} (vectorized_chains="
                             f"{self.vectorized_chains})")
        self.state = KernelState.create(z, self.state_fields(), int(state["num_sg_steps"]))
        self.state.load(state["kernel_state"])
        if self.minibatches is not None and state["minibatch"] is not None:
            self.minibatches.load_state_dict(state["minibatch"])
        pyro.util.set_rng_state(native_rng_state(state["rng"]))
        self.aux_generator.set_state(state["aux_rng"])
        if self.chain_streams is not None:
            self.chain_streams.set_state(state["chain_rng"])
        adapted = state.get("adaptation")  # absent from checkpoints written before adaptation
        if adapted is not None:
            self.warmup.load_state_dict(adapted)
        return z
