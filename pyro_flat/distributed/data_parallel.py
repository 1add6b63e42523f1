r"""Data-parallel SG-MCMC: one chain whose minibatch gradient is summed over the ranks.

Each of the :math:`W` ranks holds a contiguous shard of the :math:`N` data points (rank
:math:`r` the rows ``[N r // W, N (r + 1) // W)``, :func:`shard_rows`). Every rank runs the same
kernel from the same seed, so every rank draws the same *union* minibatch :math:`\mathcal B`
of :math:`B` indices over all :math:`N` points (the kernel's epoch-wise shuffling of
``range(N)``) and the same Gaussian noise. Rank :math:`r` evaluates its part of the potential,

.. math::

    \hat U_r(\theta) = [r = p]\,\bigl(-\log p(\theta)\bigr)
        - \frac{N}{B} \sum_{i \in \mathcal B \cap \text{shard}_r} \log p(y_i \mid \theta),

with the prior counted once, on the lowest rank :math:`p` that holds a point of
:math:`\mathcal B`; the parts and their gradients are summed over the ranks
(``all_reduce``), which gives every rank :math:`\hat U = \sum_r \hat U_r` and
:math:`\nabla\hat U`, the single-process minibatch potential of :math:`\mathcal B` up to the
order of the floating-point sums. Every rank then takes the same update and the positions stay
the same on every rank. So the chain is the single-process chain of
``subsample_size=B`` on all the data (to float rounding), for every kernel and estimator: the
two passes of SASGLD's sharpness-aware estimator are each summed.

Relations across world sizes: ``B`` is the union minibatch (each rank sees about
:math:`B/W` of its points per step, so keep ``B`` and the world size grows the data a step
covers, not the step); the likelihood scale stays :math:`N/B`; the step size acts on
:math:`U` as in one process, so the same ``step_size`` gives the same chain on any world size.
Scaling out at a fixed per-rank batch :math:`b` means ``B = W b``: the gradient noise falls
by :math:`1/W` and ``step_size`` may stay (an SGD learning rate ``lr`` on the mean loss is
still ``step_size = lr / N``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from pyro_flat import validation
from pyro_flat.distributed.faults import describe, exchange_status
from pyro_flat.distributed.group import check_group, rank, world_size


def shard_bounds(num_data: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)``: the contiguous rows of ``num_data`` that rank ``rank`` of
    ``world_size`` holds, ``N r // W`` to ``N (r + 1) // W``."""
    validation.integer_at_least("num_data", num_data, 0)
    validation.integer_at_least("world_size", world_size, 1)
    if validation.integer_at_least("rank", rank, 0) >= world_size:
        raise ValueError(f"rank must be an integer in [0, world_size - 1] = [0, "
                         f"{world_size - 1}], got {rank}")
    return num_data * rank // world_size, num_data * (rank + 1) // world_size


def shard_rows(*tensors: torch.Tensor, group: dist.ProcessGroup | None = None
               ) -> tuple[torch.Tensor, ...]:
    """This rank's rows of each tensor (all with the same leading dimension ``N``).

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.distributed import shard_rows
    >>> x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5.0)
    >>> shard_rows(x, y)[1]  # a job of one rank holds every row
    tensor([0., 1., 2., 3., 4.])
    """
    for i, t in enumerate(tensors):
        if not torch.is_tensor(t) or t.dim() == 0:
            raise ValueError(f"shard_rows needs tensors of one or more dimensions (rows first); "
                             f"argument {i} is {t!r}")
    sizes = {t.shape[0] for t in tensors}
    if len(sizes) != 1:
        raise ValueError(f"shard_rows needs tensors with one leading size N, got sizes "
                         f"{sorted(sizes)}")
    start, stop = shard_bounds(sizes.pop(), rank(group), world_size(group))
    return tuple(t[start:stop] for t in tensors)


class DataShard:
    """This rank's shard of a data-parallel chain (see the module).

    Parameters
    ----------
    num_data : int
        ``N``, the number of data points of all ranks together.
    group : torch.distributed.ProcessGroup, optional
        The ranks that share the chain (default: all).
    """

    def __init__(self, num_data: int, group: dist.ProcessGroup | None = None):
        self.num_data = validation.integer_at_least("num_data", num_data, 1)
        self.group = group
        self.rank, self.world_size = rank(group), world_size(group)
        if self.world_size > self.num_data:
            raise ValueError(f"num_data must be at least the world size {self.world_size} (one "
                             f"point per rank), got {num_data}")
        self.start, self.stop = shard_bounds(self.num_data, self.rank, self.world_size)
        #: Ranks whose part of the last summed potential was not finite.
        self.nonfinite_ranks: list[int] = []
        self._error: BaseException | None = None

    def traced_batch_size(self, batch_size: int | None) -> int:
        """The minibatch size the kernel traces the model with on this rank's rows."""
        if batch_size is None:
            raise ValueError("a data-parallel kernel needs subsample_size=B, the union minibatch "
                             "of all ranks (B = N for full-batch gradients)")
        if batch_size > self.num_data:
            raise ValueError(f"subsample_size must be an integer in [1, {self.num_data}] (the "
                             f"number of data points of all ranks), got {batch_size}")
        return min(batch_size, self.stop - self.start)

    def distribute(self, plate: Any, potential: Any) -> tuple[Any, _ShardPotential]:
        """The plate of all ranks' data (size ``N``, minibatches of ``B``) and this rank's part
        of the potential, given the ones the kernel traced on this rank's rows."""
        local_size = self.stop - self.start
        if plate is None or not plate.slice_args or plate.size != local_size:
            raise ValueError(
                f"rank {self.rank}: a data-parallel chain needs a full-batch model minibatched "
                f"by the kernel (subsample_size=B), run on this rank's {local_size} rows of "
                "each data argument (shard_rows); a model that subsamples itself "
                "(pyro.plate(..., subsample_size=...)) is not supported")
        batch_size = self._batch_size
        plate = dataclasses.replace(plate, size=self.num_data, batch_size=batch_size)
        potential.plate = plate
        return plate, _ShardPotential(potential, self)

    def local_part(self, batch: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """This rank's indices of the union minibatch ``batch``, and whether this rank counts
        the prior (it holds the minibatch's smallest index)."""
        mine = (batch >= self.start) & (batch < self.stop)
        first = int(batch.min())
        return batch[mine] - self.start, self.start <= first < self.stop

    def fail(self, error: BaseException) -> None:
        """Remember this rank's error, reported at the next :meth:`all_reduce_`."""
        self._error = error

    def all_reduce_(self, energy: torch.Tensor, grad: torch.Tensor, step: int) -> torch.Tensor:
        """Sum this rank's part of the potential and of its gradient (in place) over the
        ranks; every rank raises :class:`~pyro_flat.distributed.RankFailure` if one failed."""
        failure, self._error = self._error, None
        error = None if failure is None else describe(
            failure, f" (at SG step {step} of the data-parallel chain)")
        nonfinite = not (torch.isfinite(energy).all() and torch.isfinite(grad).all())
        # the gradient and the status in one all-reduce (one collective latency per step)
        total, self.nonfinite_ranks = exchange_status(float(energy), error, bool(nonfinite),
                                                      self.group, payload=grad)
        return torch.tensor(total, dtype=energy.dtype, device=energy.device)

    # the kernel's subsample_size, recorded by data_parallel()
    _batch_size: int = 0


class _ShardPotential:
    """A rank's part of the potential: the model on its indices of the union minibatch, with
    the prior only on the rank that counts it (its ``flat_prior`` is the model's there, else
    ``None``, so the kernel adds the closed-form prior once)."""

    def __init__(self, potential: Any, shard: DataShard):
        self.potential = potential
        self.shard = shard
        self._counts_prior = True

    @property
    def plate(self) -> Any:
        return self.potential.plate

    @property
    def flat_prior(self) -> Any:
        return self.potential.flat_prior if self._counts_prior else None

    def __call__(self, params: dict[str, torch.Tensor], batch: torch.Tensor | None
                 ) -> torch.Tensor:
        local, self._counts_prior = self.shard.local_part(batch)
        if not len(local):  # none of the minibatch is here, and neither is the prior
            return torch.zeros((), dtype=next(iter(params.values())).dtype)
        self.potential.include_prior = self._counts_prior
        try:
            return self.potential(params, local)
        except Exception as error:  # reported to every rank at the sum (no rank waits)
            self.shard.fail(error)
            return torch.full((), float("nan"))


def data_parallel(kernel: Any, num_data: int, *, group: dist.ProcessGroup | None = None) -> Any:
    """Make ``kernel`` one chain of all ranks, each rank holding its shard of the data.

    Every rank builds the same kernel (a full-batch model with ``subsample_size=B``, the union
    minibatch), wraps it here, seeds the same seed and runs it on its rows of the data
    (:func:`shard_rows`); :class:`~pyro_flat.distributed.DistributedMCMC` does the seeding and
    stops every rank if one fails. The chain is the single-process chain with
    ``subsample_size=B`` on all ``N`` points, to float rounding (module docstring).

    Parameters
    ----------
    kernel : SGMCMCKernel
        A pyro_flat kernel built from a model with ``subsample_size=B`` and a fixed
        ``step_size`` (or schedule); not ``vectorized_chains``.
    num_data : int
        ``N``, the number of data points of all ranks together.
    group : torch.distributed.ProcessGroup, optional
        The ranks that share the chain (default: all).

    Returns
    -------
    SGMCMCKernel
        ``kernel`` itself, now data-parallel.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_flat.distributed import data_parallel, shard_rows
    >>> from pyro_flat.infer import SGLD
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)
    >>> x = torch.randn(100); y = 2 * x + torch.randn(100)
    >>> kernel = data_parallel(SGLD(model, step_size=1e-3, subsample_size=20), num_data=100)
    >>> pyro.set_rng_seed(0)  # the same seed on every rank
    >>> mcmc = MCMC(kernel, num_samples=50, disable_progbar=True)
    >>> mcmc.run(*shard_rows(x, y))  # one rank here: all the rows
    >>> mcmc.get_samples()["w"].shape
    torch.Size([50])
    """
    from pyro_flat.infer.mcmc.base import SGMCMCKernel

    if not isinstance(kernel, SGMCMCKernel):
        raise TypeError(f"data_parallel needs a pyro_flat kernel, got {type(kernel).__name__}")
    validation.integer_at_least("num_data", num_data, 1)
    check_group(group)
    if kernel.model is None:
        raise ValueError("data_parallel needs a kernel built from a model (a potential_fn "
                         "cannot be split by data points)")
    if kernel.vectorized_chains is not None:
        raise ValueError("data_parallel runs one chain over all ranks: build the kernel "
                         f"without vectorized_chains (got {kernel.vectorized_chains}); for "
                         "many chains, run chains across ranks instead")
    if kernel.subsample_size is None:
        raise ValueError("data_parallel needs subsample_size=B, the union minibatch of all "
                         "ranks (B = N for full-batch gradients)")
    if kernel.adapts or kernel.preconditioner is not None:
        raise ValueError("data_parallel needs a fixed step_size (or step_size_schedule) and "
                         "preconditioner=None: warmup adaptation would measure the curvature "
                         "of one rank's part of the potential")
    shard = DataShard(num_data, group)
    shard._batch_size = kernel.subsample_size
    kernel.data_shard = shard
    return kernel
