r"""Vectorised chains: ``K`` chains of one kernel in one process, the potential of all of them
evaluated at once.

A kernel built with ``vectorized_chains=K`` keeps its position as a ``(K, d)`` tensor, one row
per chain, and every state field with the same leading dimension. The model's potential is
evaluated for all rows by :func:`torch.func.vmap` over the chains (each chain with its own
minibatch; ``K = 1`` goes through no ``vmap``: its potential takes its row as a single chain's
does), and one backward pass gives every chain's gradient (the chains are independent,
so the gradient of the sum holds each row's gradient). Every update rule is elementwise or
reduces over the last dimension only, so each row follows the single-chain rule.

Each chain draws its initial values and its minibatches from its own random stream
(:class:`ChainStreams`): chain ``k`` is seeded with ``torch.initial_seed() + k``, the seed
Pyro's ``MCMC(num_chains=K)`` gives chain ``k`` in a worker process. The Gaussian noise of all
chains comes from torch's global stream in one draw per step (a draw per chain would cost more
than the step of a small model). So without noise (``temperature=0``) chain ``k`` is the
single-chain run after ``pyro.set_rng_seed(torch.initial_seed() + k)`` (to the rounding of the
batched arithmetic); with noise, each chain follows the same rule with independent noise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyro
import torch
from torch.func import vmap

from pyro_flat.models.batchnorm import find_batchnorm

#: Seeds of chain k: ``(base + k) % MAX_SEED``, as Pyro seeds the chains of worker processes.
MAX_SEED = 2**32 - 1


class ChainStreams(Sequence[torch.Generator]):
    """One ``torch.Generator`` per chain, seeded as Pyro seeds its worker processes' chains.

    Parameters
    ----------
    num_chains : int
        ``K``.
    base_seed : int
        Chain ``k`` starts as torch's global stream after ``torch.manual_seed(base_seed + k)``.
    device : torch.device
        The device of the generators (the data's).
    """

    def __init__(self, num_chains: int, base_seed: int, device: torch.device):
        self.seeds = [(base_seed + k) % MAX_SEED for k in range(num_chains)]
        self.generators = []
        for seed in self.seeds:
            g = torch.Generator(device=device)
            g.manual_seed(seed)
            self.generators.append(g)

    def __len__(self) -> int:
        return len(self.generators)

    def __getitem__(self, k: int) -> torch.Generator:  # type: ignore[override]
        return self.generators[k]

    def __iter__(self) -> Iterator[torch.Generator]:
        return iter(self.generators)

    def run_as_global(self, k: int, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` with torch's global CPU stream in chain ``k``'s state, and keep the state
        it leaves as chain ``k``'s (for set-up code that draws from the global stream: an
        init strategy, a seed for an auxiliary stream)."""
        g = self.generators[k]
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(g.get_state())
            out = fn()
            g.set_state(torch.get_rng_state())
        return out

    def get_state(self) -> list[torch.Tensor]:
        return [g.get_state() for g in self.generators]

    def set_state(self, states: Sequence[torch.Tensor]) -> None:
        if len(states) != len(self.generators):
            raise ValueError(f"the checkpoint holds {len(states)} chains' random streams, this "
                             f"kernel runs {len(self.generators)} chains")
        for g, s in zip(self.generators, states, strict=True):
            g.set_state(s)


def _model_of(potential: Any) -> Any:
    """The Pyro model of a potential, through wrappers that hold it as ``.potential`` (a
    data-parallel rank's part); None for a ``potential_fn``."""
    for _ in range(8):
        if hasattr(potential, "model"):
            return potential.model
        potential = getattr(potential, "potential", None)
    return None


class VectorizedPotential:
    r"""The potentials of ``K`` chains of a Pyro model in one call: ``(K,)`` energies.

    ``params`` hold one row per chain (``(K, *site_shape)``) and ``batch`` one row of
    minibatch indices per chain (``(K, B)``) or ``None``. The model runs once, under
    :func:`torch.func.vmap` over the chains; Pyro's argument validation, which branches on
    values, is switched off inside (the values were validated when the kernel traced the
    model). A model that draws random numbers in its forward pass (dropout) draws them from
    torch's global stream, differently for each chain.

    BatchNorm layers in training mode (those :func:`~pyro_flat.models.batchnorm.find_batchnorm`
    finds on the model) normalise each chain's minibatch with that minibatch's own mean and
    variance, as a single chain's step does; their running statistics are *not* updated by
    the vectorised potential (one set of buffers cannot follow ``K`` chains; only the
    kernel's trace of the model at setup, once per chain, runs the model as it is, as for a
    single chain). Recompute them for a draw with
    :func:`pyro_flat.models.batchnorm.recompute_batchnorm` before predicting in evaluation mode. A
    BatchNorm layer in training mode that is not reachable from the model is a
    ``ValueError`` (torch cannot update unbatched running statistics under ``vmap``).
    """

    def __init__(self, potential: Callable[..., torch.Tensor], num_chains: int):
        self.potential = potential
        self.num_chains = num_chains
        #: The model's BatchNorm layers (:func:`~pyro_flat.models.batchnorm.find_batchnorm`).
        self.batchnorm = find_batchnorm(_model_of(potential))

    @property
    def flat_prior(self) -> Any:
        """The wrapped potential's (the chains share it)."""
        return self.potential.flat_prior

    def __call__(self, params: dict[str, torch.Tensor], batch: torch.Tensor | None = None
                 ) -> torch.Tensor:
        training = [m for m in self.batchnorm if m.training]
        if not training:
            return self._vmap(params, batch)
        # Each chain normalises with its own minibatch's statistics: without running
        # statistics BatchNorm uses the batch's, per chain under vmap; the buffers are put
        # back as they were (the same tensors, not updated).
        saved = [(m, m.running_mean, m.running_var, m.num_batches_tracked) for m in training]
        try:
            for m in training:
                m.running_mean = m.running_var = m.num_batches_tracked = None
            return self._vmap(params, batch)
        finally:
            for m, mean, var, count in saved:
                m.running_mean, m.running_var, m.num_batches_tracked = mean, var, count

    def _vmap(self, params: dict[str, torch.Tensor], batch: torch.Tensor | None
              ) -> torch.Tensor:
        try:
            with pyro.validation_enabled(False):
                if batch is None:
                    return vmap(lambda p: self.potential(p, None),
                                randomness="different")(params)
                return vmap(self.potential, randomness="different")(params, batch)
        except RuntimeError as error:
            if "Batch norm got a batched tensor" not in str(error):
                raise
            raise ValueError(
                "vectorized_chains: a BatchNorm layer in training mode that is not reachable "
                "from the model (pyro_flat.models.batchnorm.model_modules: the model, its "
                "module attributes, a function's closure and the global modules it names) "
                "cannot update its running statistics per chain; make the network an "
                "attribute of the model (a PyroModule), or call net.eval() before sampling, "
                f"or run the chains without vectorized_chains. torch said: {error}"
            ) from None
